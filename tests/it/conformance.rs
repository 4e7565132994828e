//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, npm) through the proxy: every
//! scenario and every check that passes direct also passes proxied, with the proxy plain and with a tool
//! policy that hides nothing the suite uses.
//!
//! - Releases and requirement sets: 0.1.16 (`--suite all`, protocol 2025-11-25) and 0.2.0-alpha.12 with
//!   `--requirements 2025-11-25` and `--requirements 2026-07-28`, installed side by side (npm aliases) with
//!   Node 22 by `realenv::conformance_modules` from `tests/support/conformance/`.
//! - The references: the Python SDK's own conformance pair (python-sdk 57394b0, unpacked at test time from
//!   `../shared/mcp-conformance/`, never copied here): its everything-server (`conformance_server.py` serves it
//!   with mcp 2.3.0 on port 0) and its `client.py`, run by the `py2` venv.
//! - Server mode: the suite is the client. Three legs at once, each with an everything-server of its own (the
//!   server keeps global state: subscriptions, an event store, a tool list that a tool call changes): direct,
//!   through the proxy plain, through the proxy with `--deny-tool no_such_tool_*` (policy on: the tools/list
//!   answers are rewritten; identity-parameter hiding is on by default in both). Each leg runs the three sets
//!   in order; results are read from the suite's `-o` directory (`<dir>/server-<scenario>-<time>/checks.json`).
//! - Client mode: the suite plays the server and runs a command with its URL appended: `client.py` direct, or
//!   `tests/support/conformance_client_wrapper.py` (the proxy binary in front of that URL, then `client.py`
//!   against the proxy). One suite process per scenario (`--scenario S`, and for 0.2 `--spec-version V
//!   --force`, which is what `--requirements V` runs for each of its scenarios), three at a time; a scenario
//!   passes when that process exits 0 (its checks pass and the client exits 0).
//! - A check passes when every result the suite records under its id in the scenario is `SUCCESS` (`INFO` and
//!   `SKIPPED` records are neither); a server-mode scenario passes when none of its checks is a `FAILURE` (the
//!   suite's own ✓). Direct failures must be known ones: the SDK's expected-failures lists from the tarball,
//!   or [`DIRECT_KNOWN_FAILURES`].
//! - The expected difference: the auth scenarios (`auth/*`, client mode) are not run. The suite's OAuth mock
//!   servers check the credentials the client obtained from them, and the proxy replaces whatever
//!   credentials a client sends with the agent's token by design, so through the proxy they can only fail.
//!   Run once by hand (0.2, `auth/metadata-default`): 18/18 checks direct; proxied 1/8, the mock server
//!   rejecting the agent's token (`invalid-bearer-token`) and the SDK's OAuth client then refusing the
//!   protected-resource metadata, which names the upstream's URL rather than the proxy's.
//! - None of the suite's tools (the everything-server's 26, the client-mode mock servers') has a `sender` or
//!   other identity parameter, so identity stamping and hiding leave them all as they are.
//!
//! Measured on 2026-12-01 (2-core machine, other agents building): passing scenarios and checks (distinct
//! check ids per scenario; the suite's own totals count records) were the same on all three legs, direct,
//! plain and policy on, in every set; the proxy broke nothing:
//!
//! | mode   | set                    | scenarios | checks  | failing direct too                               |
//! |--------|------------------------|-----------|---------|--------------------------------------------------|
//! | server | 0.1.16 all             | 32/32     | 44/46   | 2 `server-sse-polling` WARNINGs (SHOULDs)        |
//! | server | 0.2 2025-11-25         | 33/33     | 84/84   |                                                  |
//! | server | 0.2 2026-07-28         | 41/50     | 153/178 | the 9 `tasks-*` (the Python SDK has no tasks)    |
//! | client | 0.1.16 all, no auth    | 4/4       | 10/10   | 22 auth scenarios not run                        |
//! | client | 0.2 2025-11-25, no auth| 5/5       | 20/20   | 20 auth scenarios not run                        |
//! | client | 0.2 2026-07-28, no auth| 7/8       | 36/36   | `sep-2322-client-request-state` exits 1; 31 auth |
//!
//! Wall time: server mode 19 s alone (9 suite runs, 3 at a time), client mode 82 s alone (51 suite runs, 3 at
//! a time, one Node and one Python start each, about 2.2 s of CPU apiece), both tests at once 113-122 s.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt;

use serde_json::Value;

use crate::support::checks::Checks;
use crate::support::proxy_process::{drain_into, scratch_dir, token_file, ProxyProcess, BIN};
use crate::support::realenv;

/// The Python SDK's conformance files (python-sdk 57394b0, MIT), kept beside the work tree.
const REFS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/mcp-conformance/python-sdk-57394b0-conformance-refs.tar.gz"
);
/// The agent the proxy stamps, and its token (the suite's servers check neither).
const AGENT: &str = "conformance-agent";
const TOKEN: &str = "0c7f3e9a5b2d4f61a8e0c9b7d3f5a2e1";
/// Policy on: a deny glob that matches none of the suite's tools, so the proxy rewrites every tools/list
/// answer and hides nothing.
const POLICY_ON: &[&str] = &["--deny-tool", "no_such_tool_*"];
/// The suite's per-scenario timeout (its default).
const SCENARIO_TIMEOUT_MS: &str = "30000";
/// Bound on one suite process: a whole server-mode set takes about 8 s alone, longer on a loaded machine.
const RUN_LIMIT: Duration = Duration::from_secs(300);
/// Suite processes at once in client mode (each about 2 s of CPU: Node 0.6 s, the Python client 1.3 s).
const CLIENT_WORKERS: usize = 3;

/// Scenarios that fail direct although the SDK's expected-failures lists do not name them, and why.
const DIRECT_KNOWN_FAILURES: &[(&str, &str)] = &[(
    "sep-2322-client-request-state",
    "client mode, 2026-07-28: every check passes, then client.py exits 1 (measured with the reference pair)",
)];

/// One release of the suite, as installed under `conformance_modules()`.
struct Release {
    /// The npm alias directory.
    dir: &'static str,
    /// The version its package.json must carry.
    version: &'static str,
    /// Whether its server mode takes `--timeout` (0.1.16's has none: no per-scenario bound).
    server_timeout: bool,
}

const V0_1: Release = Release { dir: "conformance-0.1", version: "0.1.16", server_timeout: false };
const V0_2: Release = Release { dir: "conformance-0.2", version: "0.2.0-alpha.12", server_timeout: true };

/// A release and the scenarios selected from it.
struct Set {
    label: &'static str,
    release: &'static Release,
    /// `None`: `--suite all` (0.1.16); `Some(V)`: `--requirements V` (0.2).
    requirements: Option<&'static str>,
}

const SETS: [Set; 3] = [
    Set { label: "0.1.16 --suite all", release: &V0_1, requirements: None },
    Set {
        label: "0.2.0-alpha.12 --requirements 2025-11-25",
        release: &V0_2,
        requirements: Some("2025-11-25"),
    },
    Set {
        label: "0.2.0-alpha.12 --requirements 2026-07-28",
        release: &V0_2,
        requirements: Some("2026-07-28"),
    },
];

/// How the suite reaches the reference: directly, or through the proxy without or with a tool policy.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Leg {
    Direct,
    Plain,
    PolicyOn,
}

const LEGS: [Leg; 3] = [Leg::Direct, Leg::Plain, Leg::PolicyOn];

impl Leg {
    fn name(self) -> &'static str {
        match self {
            Leg::Direct => "direct",
            Leg::Plain => "proxied, policy off",
            Leg::PolicyOn => "proxied, policy on",
        }
    }

    /// The proxy's arguments beyond upstream, agent and token; `None` for direct.
    fn proxy_args(self) -> Option<&'static [&'static str]> {
        match self {
            Leg::Direct => None,
            Leg::Plain => Some(&[]),
            Leg::PolicyOn => Some(POLICY_ON),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// The references and the suite.

/// The unpacked tarball's `python-sdk-conformance/` directory, unpacked once per test process.
fn refs() -> &'static Path {
    static R: OnceLock<PathBuf> = OnceLock::new();
    R.get_or_init(|| {
        let tarball = Path::new(REFS);
        assert!(
            tarball.is_file(),
            "{} does not exist: the conformance tests run the Python SDK's conformance server and client from \
             it (../shared/mcp-conformance/ beside the work tree); they never skip",
            tarball.display()
        );
        let dir = scratch_dir("conformance-refs");
        let out = Command::new("tar")
            .arg("-xzf")
            .arg(tarball)
            .arg("-C")
            .arg(&dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run `tar -xzf {}` (is tar installed?): {e}", tarball.display()));
        assert!(out.status.success(), "tar -xzf {}: {}", tarball.display(), String::from_utf8_lossy(&out.stderr));
        let root = dir.join("python-sdk-conformance");
        assert!(root.join("LICENSE").is_file(), "{} holds no python-sdk-conformance/LICENSE", tarball.display());
        root
    })
}

fn everything_server_dir() -> PathBuf {
    refs().join("examples/servers/everything-server")
}

fn client_py() -> PathBuf {
    refs().join(".github/actions/conformance/client.py")
}

/// The scenarios the SDK's expected-failures files (`.github/actions/conformance/expected-failures*.yml`) list
/// for `role` (`server` or `client`), per-check entries (`scenario:check`) reduced to their scenario. The files
/// are flat: a top-level `role:` key, then `  - entry` lines.
fn sdk_expected_failures(role: &str) -> BTreeSet<String> {
    let dir = refs().join(".github/actions/conformance");
    let mut names = BTreeSet::new();
    for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("read_dir entry").path();
        let file = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !(file.starts_with("expected-failures") && file.ends_with(".yml")) {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let mut key = "";
        for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
            if !line.starts_with(' ') {
                key = line.split(':').next().unwrap_or_default();
            } else if let Some(item) = line.trim_start().strip_prefix("- ").filter(|_| key == role) {
                names.insert(item.split(':').next().unwrap_or(item).trim().to_string());
            }
        }
    }
    names
}

/// `node <release>/dist/index.js`, the suite's CLI, with Node 22 from the conformance install.
fn suite(release: &Release) -> Command {
    let modules = realenv::conformance_modules();
    let package = modules.join(release.dir).join("package.json");
    let meta: Value = serde_json::from_str(
        &fs::read_to_string(&package).unwrap_or_else(|e| panic!("read {}: {e}", package.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", package.display()));
    assert_eq!(meta["version"], release.version, "{} is not the pinned release", package.display());
    let mut cmd = Command::new(modules.join(".bin").join("node"));
    cmd.arg(modules.join(release.dir).join("dist").join("index.js"));
    cmd
}

/// What one suite process left: its exit status and its log (stdout and stderr, interleaved).
struct Run {
    success: bool,
    log: PathBuf,
    elapsed: Duration,
}

/// Run a suite process with its output in `log`, in a process group of its own so that on overrun the whole
/// tree (the shell, the wrapper, the client, the proxy) is killed.
#[track_caller]
fn run_suite(mut cmd: Command, log: &Path) -> Run {
    let started = Instant::now();
    let out = File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
    let err = out.try_clone().expect("clone log handle");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > RUN_LIMIT {
            // SAFETY: kill(2) on the process group this child leads.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!("{cmd:?} still running after {RUN_LIMIT:?}; log {}:\n{}", log.display(), tail(log, 8000));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run { success: status.success(), log: log.to_path_buf(), elapsed: started.elapsed() }
}

/// The last `max` bytes of a file, for evidence.
fn tail(path: &Path, max: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

/// The client scenarios of a set, from the suite's own `list --client [--requirements V]`: the required ones
/// and, for a requirement set, those it runs without scoring.
fn client_scenarios(set: &Set) -> Vec<String> {
    let mut cmd = suite(set.release);
    cmd.args(["list", "--client"]);
    if let Some(revision) = set.requirements {
        cmd.args(["--requirements", revision]);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{cmd:?} failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    let (mut section, mut names) = ("", Vec::new());
    for line in text.lines() {
        if line.starts_with("Server scenarios") {
            section = "server";
        } else if line.starts_with("Client scenarios") {
            section = "client";
        } else if line.starts_with("Run and reported") {
            section = "not scored";
        } else if let Some(item) = line.trim_start().strip_prefix("- ") {
            let name = item.split(' ').next().unwrap_or(item).to_string();
            if section == "client" || (section == "not scored" && item.ends_with("[client]")) {
                names.push(name);
            }
        }
    }
    assert!(!names.is_empty(), "{cmd:?} listed no client scenario:\n{text}");
    names
}

// ---------------------------------------------------------------------------------------------------------
// Results.

/// One check's verdict in one scenario, and the records behind it (for evidence).
struct CheckResult {
    passed: bool,
    records: Vec<Value>,
}

/// One scenario's verdict and its checks.
struct ScenarioResult {
    passed: bool,
    checks: BTreeMap<String, CheckResult>,
    /// Where its results are.
    dir: PathBuf,
}

/// A `checks.json`: check id -> verdict, over the records that are verdicts (`SUCCESS`, `FAILURE`, `WARNING`).
fn read_checks(path: &Path) -> BTreeMap<String, CheckResult> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let records: Vec<Value> =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut checks: BTreeMap<String, CheckResult> = BTreeMap::new();
    for record in records {
        let status = record["status"].as_str().unwrap_or_default();
        if !matches!(status, "SUCCESS" | "FAILURE" | "WARNING") {
            continue;
        }
        let id = record["id"].as_str().unwrap_or("<no id>").to_string();
        let check = checks.entry(id).or_insert(CheckResult { passed: true, records: Vec::new() });
        check.passed &= status == "SUCCESS";
        check.records.push(record);
    }
    checks
}

fn has_failure(checks: &BTreeMap<String, CheckResult>) -> bool {
    checks.values().flat_map(|c| &c.records).any(|r| r["status"] == "FAILURE")
}

/// A server-mode `-o` directory: `server-<scenario>-<ISO time with - for : and .>/checks.json` per scenario.
fn read_server_results(dir: &Path) -> BTreeMap<String, ScenarioResult> {
    let mut results = BTreeMap::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("read_dir entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        // `-2026-12-01T23-28-05-994Z`: 25 bytes.
        let scenario = name
            .strip_prefix("server-")
            .filter(|rest| rest.len() > 25 && rest.ends_with('Z'))
            .map(|rest| rest[..rest.len() - 25].to_string())
            .unwrap_or_else(|| panic!("unexpected entry {} in the suite's results", path.display()));
        let checks = read_checks(&path.join("checks.json"));
        let passed = !has_failure(&checks);
        results.insert(scenario, ScenarioResult { passed, checks, dir: path });
    }
    results
}

/// The one `checks.json` a client-mode `-o` directory holds (`<scenario>-<time>/checks.json`).
fn find_checks(dir: &Path) -> Option<PathBuf> {
    for entry in fs::read_dir(dir).ok()? {
        let path = entry.ok()?.path();
        if path.is_dir() {
            if let Some(found) = find_checks(&path) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == "checks.json") {
            return Some(path);
        }
    }
    None
}

/// Results of one set on one leg.
type SetResults = BTreeMap<String, ScenarioResult>;

/// Counts: passing scenarios / scenarios, passing checks / checks.
fn counts(results: &SetResults) -> String {
    let scenarios = results.values().filter(|s| s.passed).count();
    let checks: Vec<&CheckResult> = results.values().flat_map(|s| s.checks.values()).collect();
    let passing = checks.iter().filter(|c| c.passed).count();
    format!("{scenarios}/{} scenarios, {passing}/{} checks", results.len(), checks.len())
}

/// What `got` (proxied) falls short of `want` (direct) in: the scenario's verdict, and every check that
/// passes in `want`, each with the evidence.
fn short_of(name: &str, want: &ScenarioResult, got: Option<&ScenarioResult>) -> Vec<String> {
    let mut short = Vec::new();
    let Some(got) = got else {
        return vec![format!("scenario `{name}` was not run")];
    };
    if want.passed && !got.passed {
        short
            .push(format!("scenario `{name}` passes direct but not proxied; results: {}", got.dir.display()));
    }
    for (id, check) in want.checks.iter().filter(|(_, c)| c.passed) {
        let proxied = got.checks.get(id);
        if !proxied.is_some_and(|c| c.passed) {
            let records = proxied.map_or("(no such check)".to_string(), |c| {
                serde_json::to_string_pretty(&c.records).unwrap_or_default()
            });
            short.push(format!(
                "check `{name}:{id}` passes direct ({} record(s)) but not proxied ({}):\n{}",
                check.records.len(),
                got.dir.display(),
                records.chars().take(3000).collect::<String>()
            ));
        }
    }
    short
}

/// The scenarios to run again alone: direct failures that are not known ones, then (once those are settled)
/// proxied results short of direct.
fn direct_suspects(legs: &BTreeMap<Leg, SetResults>, known: &BTreeSet<String>) -> Vec<(Leg, String)> {
    let direct = &legs[&Leg::Direct];
    direct
        .iter()
        .filter(|(name, s)| !s.passed && !known.contains(*name))
        .map(|(n, _)| (Leg::Direct, n.clone()))
        .collect()
}

fn proxied_suspects(legs: &BTreeMap<Leg, SetResults>) -> Vec<(Leg, String)> {
    let direct = &legs[&Leg::Direct];
    let mut suspects = Vec::new();
    for leg in [Leg::Plain, Leg::PolicyOn] {
        for (name, want) in direct {
            if !short_of(name, want, legs[&leg].get(name)).is_empty() {
                suspects.push((leg, name.clone()));
            }
        }
    }
    suspects
}

/// Run `suspects` again one at a time (`rerun` gives the new result, or `None` if the suite wrote none) and
/// keep the new results: a failure that does not come back alone was contention on a loaded machine (the
/// suite's scenarios have real-time tolerances), as the Python SDK's own CI treats it. Returns what was
/// re-run and how it came out, for the summary.
fn rerun_alone(
    legs: &mut BTreeMap<Leg, SetResults>,
    suspects: Vec<(Leg, String)>,
    mut rerun: impl FnMut(Leg, &str) -> Option<ScenarioResult>,
) -> Vec<String> {
    let mut notes = Vec::new();
    for (leg, name) in suspects {
        let Some(result) = rerun(leg, &name) else { continue };
        notes.push(format!(
            "`{name}` {} re-run alone: {}",
            leg.name(),
            if result.passed { "passed" } else { "failed" }
        ));
        legs.get_mut(&leg).expect("every leg ran").insert(name, result);
    }
    notes
}

/// The comparison: the direct failures are known ones, and every scenario and check passing direct passes on
/// each proxied leg. Returns the summary lines.
fn compare(
    checks: &mut Checks,
    mode: &str,
    set: &Set,
    legs: &BTreeMap<Leg, SetResults>,
    known: &BTreeSet<String>,
) -> Vec<String> {
    let direct = &legs[&Leg::Direct];
    let mut summary = Vec::new();
    for (leg, results) in legs {
        summary.push(format!("{mode} | {} | {}: {}", set.label, leg.name(), counts(results)));
    }
    checks.check(!direct.is_empty(), format!("{mode}, {}: no scenario ran direct", set.label));
    for (name, scenario) in direct {
        checks.check(
            scenario.passed || known.contains(name),
            format!(
                "{mode}, {}: `{name}` fails direct and is not a known failure; results: {}",
                set.label,
                scenario.dir.display()
            ),
        );
    }
    for leg in [Leg::Plain, Leg::PolicyOn] {
        for (name, want) in direct {
            for short in short_of(name, want, legs[&leg].get(name)) {
                checks.check(false, format!("{mode}, {}, {}: {short}", set.label, leg.name()));
            }
        }
    }
    summary
}

fn known_failures(role: &str) -> BTreeSet<String> {
    let mut known = sdk_expected_failures(role);
    known.extend(DIRECT_KNOWN_FAILURES.iter().map(|(name, _)| name.to_string()));
    known
}

/// `name` for a file name: `proxied, policy on` -> `proxied-policy-on`.
fn slug(name: &str) -> String {
    name.replace(", ", "-").replace([' ', '/'], "-")
}

// ---------------------------------------------------------------------------------------------------------
// The everything-server.

/// The SDK's everything-server (`tests/support/conformance_server.py`) on an OS-assigned port. Killed on drop.
struct EverythingServer {
    child: Child,
    port: u16,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl EverythingServer {
    #[track_caller]
    fn start() -> EverythingServer {
        let script = realenv::support_dir().join("conformance_server.py");
        let mut child = Command::new(realenv::py2())
            .arg(&script)
            .arg(everything_server_dir())
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", script.display()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        drain_into(child.stderr.take().expect("stderr piped"), stderr.clone());
        let lines = realenv::line_channel(child.stdout.take().expect("stdout piped"));
        let line = lines.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let mut server = EverythingServer { child, port: 0, stderr };
        match line.strip_prefix("PORT ").and_then(|p| p.trim().parse().ok()) {
            Some(port) => server.port = port,
            None => {
                let _ = server.child.kill();
                let _ = server.child.wait();
                panic!(
                    "conformance_server.py printed {line:?} instead of `PORT n`; stderr:\n{}",
                    String::from_utf8_lossy(&server.stderr.lock().unwrap())
                );
            }
        }
        server
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for EverythingServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------------------
// Server mode.

/// What one server-mode leg talks to: an everything-server of its own, and the proxy in front of it.
struct Target {
    server: EverythingServer,
    proxy: Option<ProxyProcess>,
}

impl Target {
    fn start(leg: Leg) -> Target {
        let server = EverythingServer::start();
        let proxy = leg.proxy_args().map(|args| {
            ProxyProcess::builder(server.url())
                .agent(AGENT)
                .token(TOKEN)
                .args(args)
                .env("RUST_LOG", "info")
                .start()
        });
        Target { server, proxy }
    }

    fn url(&self) -> String {
        self.proxy.as_ref().map_or(self.server.url(), |p| p.url("/mcp"))
    }
}

/// Run the suite in server mode against `url`: the whole set, or one scenario of it (as the set runs it).
fn server_run(set: &Set, url: &str, scenario: Option<&str>, dir: &Path) -> (SetResults, Run) {
    fs::create_dir_all(dir).expect("create results dir");
    let mut cmd = suite(set.release);
    cmd.args(["server", "--url", url]).arg("-o").arg(dir.join("results"));
    if set.release.server_timeout {
        cmd.args(["--timeout", SCENARIO_TIMEOUT_MS]);
    }
    match (scenario, set.requirements) {
        (None, Some(revision)) => cmd.args(["--requirements", revision]),
        (None, None) => cmd.args(["--suite", "all"]),
        (Some(name), Some(revision)) => cmd.args(["--scenario", name, "--spec-version", revision, "--force"]),
        (Some(name), None) => cmd.args(["--scenario", name]),
    };
    let run = run_suite(cmd, &dir.join("suite.log"));
    let results = if dir.join("results").is_dir() {
        read_server_results(&dir.join("results"))
    } else {
        SetResults::new()
    };
    assert!(
        !results.is_empty(),
        "server mode, {} ({url}): the suite wrote no results (exit ok: {}); log:\n{}",
        set.label,
        run.success,
        tail(&run.log, 8000)
    );
    (results, run)
}

/// The tool names the suite's `tools-list` check saw: the policy hides none of them.
fn tools_listed(results: &SetResults) -> Value {
    results
        .get("tools-list")
        .and_then(|s| s.checks.get("tools-list"))
        .and_then(|c| c.records.first())
        .map_or(Value::Null, |r| r["details"]["tools"].clone())
}

#[test]
fn server_mode_every_scenario_and_check_passing_direct_passes_through_the_proxy() {
    let started = Instant::now();
    let _ = (realenv::py2(), realenv::conformance_modules(), refs());
    let scratch = &scratch_dir("conformance-server");
    // Each leg at once, the sets in turn on each.
    let (targets, mut by_leg): (BTreeMap<Leg, Target>, BTreeMap<Leg, Vec<SetResults>>) =
        std::thread::scope(|s| {
            let handles: Vec<_> = LEGS
                .iter()
                .map(|&leg| {
                    let run_leg = move || {
                        let target = Target::start(leg);
                        let sets: Vec<SetResults> = SETS
                            .iter()
                            .enumerate()
                            .map(|(i, set)| {
                                let (results, run) = server_run(
                                    set,
                                    &target.url(),
                                    None,
                                    &scratch.join(format!("{}-{i}", slug(leg.name()))),
                                );
                                eprintln!(
                                    "server mode | {} | {}: suite ran {:.1}s",
                                    set.label,
                                    leg.name(),
                                    run.elapsed.as_secs_f64()
                                );
                                results
                            })
                            .collect();
                        (target, sets)
                    };
                    (leg, s.spawn(run_leg))
                })
                .collect();
            let mut targets = BTreeMap::new();
            let mut by_leg = BTreeMap::new();
            for (leg, handle) in handles {
                let (target, sets) = handle.join().expect("server-mode leg panicked");
                targets.insert(leg, target);
                by_leg.insert(leg, sets);
            }
            (targets, by_leg)
        });

    let known = known_failures("server");
    let mut checks = Checks::default();
    let mut summary = Vec::new();
    for (i, set) in SETS.iter().enumerate() {
        let mut legs: BTreeMap<Leg, SetResults> = LEGS
            .iter()
            .map(|leg| (*leg, std::mem::take(&mut by_leg.get_mut(leg).expect("every leg ran")[i])))
            .collect();
        let mut reruns = 0;
        let mut rerun = |leg: Leg, name: &str| {
            reruns += 1;
            let dir = scratch.join(format!("{}-{i}-alone-{reruns}", slug(leg.name())));
            server_run(set, &targets[&leg].url(), Some(name), &dir).0.remove(name)
        };
        let suspects = direct_suspects(&legs, &known);
        let mut notes = rerun_alone(&mut legs, suspects, &mut rerun);
        let suspects = proxied_suspects(&legs);
        notes.extend(rerun_alone(&mut legs, suspects, &mut rerun));
        summary.extend(compare(&mut checks, "server mode", set, &legs, &known));
        summary.extend(notes.iter().map(|n| format!("server mode | {} | {n}", set.label)));
        let direct_tools = tools_listed(&legs[&Leg::Direct]);
        checks.check(direct_tools.is_array(), format!("server mode, {}: no tool list direct", set.label));
        for leg in [Leg::Plain, Leg::PolicyOn] {
            let tools = tools_listed(&legs[&leg]);
            checks.check(
                tools == direct_tools,
                format!(
                    "server mode, {}, {}: tools listed {tools}, direct {direct_tools}",
                    set.label,
                    leg.name()
                ),
            );
        }
    }
    for (leg, target) in &targets {
        if let Some(proxy) = &target.proxy {
            let _ = fs::write(scratch.join(format!("proxy-{}.log", slug(leg.name()))), proxy.stderr_text());
        }
    }
    drop(targets);
    for line in &summary {
        eprintln!("{line}");
    }
    eprintln!(
        "server mode: {:.1}s wall; results under {}",
        started.elapsed().as_secs_f64(),
        scratch.display()
    );
    checks.finish("server mode", &[("summary", summary.join("\n"))]);
}

// ---------------------------------------------------------------------------------------------------------
// Client mode.

/// One client-mode run: a set's scenario on a leg.
struct ClientJob<'a> {
    set: &'a Set,
    scenario: String,
    leg: Leg,
    dir: PathBuf,
    /// Proxied: the proxy holds the scenario's OAuth credentials and the client none
    /// (`MCP_CONFORMANCE_PROXY_OAUTH=1`, see the wrapper), its log at trace level.
    oauth: bool,
}

fn client_job(job: &ClientJob, python: &Path, token: &Path) -> (ScenarioResult, Duration) {
    let (client, wrapper) = (client_py(), realenv::support_dir().join("conformance_client_wrapper.py"));
    let parts: Vec<&Path> = match job.leg {
        Leg::Direct => vec![python, &client],
        Leg::Plain | Leg::PolicyOn => vec![python, &wrapper, Path::new(BIN), token, &client],
    };
    // The suite splits its --command on spaces.
    let command: Vec<&str> = parts.iter().map(|p| p.to_str().expect("UTF-8 path")).collect();
    assert!(
        command.iter().all(|p| !p.contains(' ')),
        "a path with a space cannot be in --command: {command:?}"
    );
    fs::create_dir_all(&job.dir).expect("create results dir");
    let mut cmd = suite(job.set.release);
    cmd.args(["client", "--command", &command.join(" "), "--scenario", &job.scenario])
        .args(["--timeout", SCENARIO_TIMEOUT_MS])
        .arg("-o")
        .arg(job.dir.join("results"))
        .env("RUST_LOG", if job.oauth { "trace" } else { "info" })
        .env("MCP_CONFORMANCE_PROXY_OAUTH", if job.oauth { "1" } else { "0" })
        .env(
            "MCP_CONFORMANCE_PROXY_ARGS",
            serde_json::to_string(job.leg.proxy_args().unwrap_or_default()).expect("JSON array"),
        );
    if let Some(revision) = job.set.requirements {
        cmd.args(["--spec-version", revision, "--force"]);
    }
    let run = run_suite(cmd, &job.dir.join("suite.log"));
    let checks_json = find_checks(&job.dir.join("results")).unwrap_or_else(|| {
        panic!(
            "client mode, {}, {}, {}: the suite wrote no checks.json; log:\n{}",
            job.set.label,
            job.scenario,
            job.leg.name(),
            tail(&run.log, 8000)
        )
    });
    let dir = checks_json.parent().expect("checks.json has a parent").to_path_buf();
    (ScenarioResult { passed: run.success, checks: read_checks(&checks_json), dir }, run.elapsed)
}

#[test]
fn client_mode_every_scenario_and_check_passing_direct_passes_through_the_proxy() {
    let started = Instant::now();
    let python = realenv::py2();
    let _ = (realenv::conformance_modules(), refs());
    let token = token_file(TOKEN);
    let scratch = scratch_dir("conformance-client");

    // The expected difference, not run: every auth scenario (see the module doc).
    let mut jobs = Vec::new();
    let mut not_run: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (i, set) in SETS.iter().enumerate() {
        for scenario in client_scenarios(set) {
            if scenario.starts_with("auth/") {
                not_run.entry(set.label).or_default().push(scenario);
                continue;
            }
            for leg in LEGS {
                let dir = scratch.join(format!("{i}-{}-{}", scenario, slug(leg.name())));
                jobs.push(ClientJob { set, scenario: scenario.clone(), leg, dir, oauth: false });
            }
        }
    }

    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<(ScenarioResult, Duration)>>> =
        Mutex::new(jobs.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..CLIENT_WORKERS {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let result = client_job(job, python, &token);
                done.lock().unwrap()[i] = Some(result);
            });
        }
    });
    let pool_wall = started.elapsed();

    let mut by_set: BTreeMap<usize, BTreeMap<Leg, SetResults>> = BTreeMap::new();
    let mut run_seconds = 0.0;
    for (job, result) in jobs.iter().zip(done.into_inner().unwrap()) {
        let (result, elapsed) = result.expect("every job ran");
        run_seconds += elapsed.as_secs_f64();
        let i = SETS.iter().position(|s| std::ptr::eq(s, job.set)).expect("a known set");
        by_set.entry(i).or_default().entry(job.leg).or_default().insert(job.scenario.clone(), result);
    }
    let known = known_failures("client");
    let mut checks = Checks::default();
    let mut summary = Vec::new();
    for (i, legs) in &mut by_set {
        let set = &SETS[*i];
        let mut reruns = 0;
        let mut rerun = |leg: Leg, name: &str| {
            reruns += 1;
            let dir = scratch.join(format!("{i}-{name}-{}-alone-{reruns}", slug(leg.name())));
            let job = ClientJob { set, scenario: name.to_string(), leg, dir, oauth: false };
            Some(client_job(&job, python, &token).0)
        };
        let suspects = direct_suspects(legs, &known);
        let mut notes = rerun_alone(legs, suspects, &mut rerun);
        let suspects = proxied_suspects(legs);
        notes.extend(rerun_alone(legs, suspects, &mut rerun));
        summary.extend(compare(&mut checks, "client mode", set, legs, &known));
        summary.extend(notes.iter().map(|n| format!("client mode | {} | {n}", set.label)));
        // The scenario the tools/list rewriter must not break: a tool's 2020-12 inputSchema, echoed verbatim.
        if set.requirements.is_some() {
            let scenario = "json-schema-2020-12-preservation";
            let passed = LEGS.iter().all(|leg| legs[leg].get(scenario).is_some_and(|s| s.passed));
            checks.check(passed, format!("client mode, {}: `{scenario}` must pass on every leg", set.label));
        }
    }
    for (set, names) in &not_run {
        summary.push(format!(
            "client mode | {set} | not run (auth, the expected difference): {} {}",
            names.len(),
            names.join(" ")
        ));
    }
    for line in &summary {
        eprintln!("{line}");
    }
    eprintln!(
        "client mode: {} suite runs, {:.1}s wall ({:.1}s for the pool, {run_seconds:.1}s of runs); results under {}",
        jobs.len(),
        started.elapsed().as_secs_f64(),
        pool_wall.as_secs_f64(),
        scratch.display()
    );
    checks.finish("client mode", &[("summary", summary.join("\n"))]);
}

/// The OAuth extension scenarios of issue 40 (0.2.0-alpha.12, client mode), run through the proxy holding
/// the credentials: the suite plays the MCP server and its authorization server and hands the scenario's
/// credentials over `MCP_CONFORMANCE_CONTEXT`; the wrapper gives them to the proxy as `--oauth-*` files,
/// and the client (client.py's `initialize`: connect, initialize, list tools) runs at the proxy with no
/// credential at all. Beside each, the reference client's own result direct (client.py with the context).
const OAUTH_SCENARIOS: [&str; 3] =
    ["auth/client-credentials-basic", "auth/client-credentials-jwt", "auth/wif-jwt-bearer"];

/// What the scenarios' credentials and tokens look like, none of which may reach the proxy's log (at trace
/// level) or the client: the basic scenario's secret, the tokens the suite mints (`cc-token-<ms>`,
/// `test-token-<ms>`), JWTs (the workload's, the client assertions) and PEM keys.
const OAUTH_SECRETS: [&str; 5] =
    ["conformance-test-secret", "cc-token-", "test-token-", "eyJ", "PRIVATE KEY"];

#[test]
fn client_mode_oauth_scenarios_pass_through_the_proxy_holding_the_credentials() {
    let python = realenv::py2();
    let _ = (realenv::conformance_modules(), refs());
    let token = token_file(TOKEN);
    let scratch = scratch_dir("conformance-oauth");
    let set = &SETS[1];
    let known = known_failures("client");
    let mut checks = Checks::default();
    let mut table =
        vec!["| scenario | direct (client.py with the credentials) | through the proxy (client: none) |"
            .to_string()];
    for scenario in OAUTH_SCENARIOS {
        let run = |leg: Leg| {
            let dir = scratch.join(format!("{}-{}", slug(scenario), slug(leg.name())));
            let job = ClientJob { set, scenario: scenario.to_string(), leg, dir, oauth: leg != Leg::Direct };
            client_job(&job, python, &token).0
        };
        let (direct, proxied) = (run(Leg::Direct), run(Leg::Plain));
        let verdict = |r: &ScenarioResult| {
            let passing = r.checks.values().filter(|c| c.passed).count();
            let failing: Vec<&str> =
                r.checks.iter().filter(|(_, c)| !c.passed).map(|(id, _)| id.as_str()).collect();
            match (r.passed, failing.is_empty()) {
                (true, true) => format!("passed, {passing}/{} checks", r.checks.len()),
                _ => format!("FAILED, {passing}/{} checks; failing: {}", r.checks.len(), failing.join(" ")),
            }
        };
        table.push(format!("| {scenario} | {} | {} |", verdict(&direct), verdict(&proxied)));
        checks.check(
            proxied.passed && proxied.checks.values().all(|c| c.passed) && !proxied.checks.is_empty(),
            format!(
                "{scenario} through the proxy: {} (results in {})",
                verdict(&proxied),
                proxied.dir.display()
            ),
        );
        // The token request and the bearer token at the MCP server are what the scenario is about.
        for id in ["token-request", "valid-bearer-token"] {
            checks.check(
                proxied.checks.get(id).is_some_and(|c| c.passed),
                format!("{scenario} through the proxy: no passing `{id}` check"),
            );
        }
        checks.check(
            direct.passed || known.contains(scenario),
            format!("{scenario} direct: {} and not a known failure", verdict(&direct)),
        );
        let stderr = fs::read_to_string(proxied.dir.join("stderr.txt")).unwrap_or_default();
        checks.check(
            stderr.contains("oauth (start): new token"),
            format!(
                "{scenario}: the proxy's log (trace) does not say it got a token:\n{}",
                tail(&proxied.dir.join("stderr.txt"), 4000)
            ),
        );
        for secret in OAUTH_SECRETS {
            checks.check(
                !stderr.contains(secret),
                format!(
                    "{scenario}: `{secret}` in the proxy's or the client's log ({})",
                    proxied.dir.display()
                ),
            );
        }
    }
    for line in &table {
        eprintln!("{line}");
    }
    checks.finish("OAuth scenarios", &[("table", table.join("\n"))]);
}

//! Is `--stdio` the lighter stdio bridge? Against mcp-remote (npm, pinned at 0.15.1) on the same HTTP MCP
//! upstream, driven by the same stdio host (this program: it spawns each bridge, writes JSON-RPC lines to its
//! stdin and reads lines from its stdout), goals at most 0.1x mcp-remote's: the time from spawn to the
//! `initialize` answer (median of N spawns), the latency each bridge adds to a sequential `tools/call` over the
//! upstream alone (a raw keep-alive HTTP client measures the upstream's own time in the same run; p99 shown
//! too), and the bridge's RSS after N calls. Every answer is checked; on the stand-in, the proxy's must carry
//! the agent it stamped. The program exits non-zero when a check fails (a bridge that does not answer, a wrong answer, the
//! proxy not exiting 0 when its stdin ends), and when a ratio is above STDIO_BENCH_MAX_RATIO if that is set
//! (.ci/run sets 0.5); a missed goal is printed, never an exit status.
//!
//! Upstreams: `stand-in`, `benches/util/mcp_upstream.py` (Python's standard library only, under 0.2 ms a
//! call), and `agentchattr`, the real server from the snapshot beside the work tree
//! (`tests/it/support/agentchattr.rs`; 2-2.6 ms a call). mcp-remote is installed under `target/realenv/` by
//! `tests/it/support/realenv.rs` (`npm ci` of `tests/support/mcp-remote/`) and run as `node dist/proxy.js URL
//! --header-file FILE --transport http-only`: node on its entry script, so the process measured is the bridge.
//! The proxy runs as `--stdio --upstream URL --agent NAME --token-file FILE`. Neither gets the token in argv.
//!
//! `cargo bench --bench stdio`; STDIO_BENCH_CALLS (measured `tools/call`s per bridge and for the raw client,
//! default 1000), STDIO_BENCH_SPAWNS (spawns per bridge, default 10), STDIO_BENCH_UPSTREAMS (default
//! `stand-in,agentchattr`), STDIO_BENCH_BRIDGES (default `mcp-remote,proxy`), STDIO_BENCH_MAX_RATIO (unset: no
//! gate). Without Node or Python the bench says so and skips what needs it, unless `CI` is set: then it fails.

/// The integration suite's helpers, shared rather than copied: installs (`realenv`), agentchattr, scratch files,
/// the raw HTTP/1.1 client, `/proc`. This bench uses a few of them.
#[allow(dead_code, unused_imports, unused_macros)]
#[path = "../tests/it/support/mod.rs"]
mod support;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::agentchattr::{self, Agentchattr};
use support::procfs::rss_kib;
use support::proxy_process::{scratch_dir, token_file, BIN};
use support::realenv;
use support::wire::{request, RawClient};

/// The stand-in's token and the agent the proxy is given for it.
const TOKEN: &str = "stdio-bench-token-0123456789abcdef";
const AGENT: &str = "stdio-bench";
/// The `sender` the host puts in each `tools/call`: mcp-remote passes it on, the proxy stamps its agent over it.
const HOST_SENDER: &str = "stdio-bench-host";
/// The tool called (the stand-in's only tool; agentchattr's read, a stamped one).
const TOOL: &str = "chat_read";
const PROTOCOL: &str = "2025-06-18";
/// The goal for each ratio, ours over mcp-remote's (issue 32 §3).
const GOAL: f64 = 0.1;
/// Unmeasured calls before the measured ones, on every path (JIT, pools, caches).
const WARMUP: usize = 20;
/// The measured calls are made in this many rounds, each path in turn, so that a slow spell of the shared
/// machine falls on all of them.
const ROUNDS: usize = 10;
/// Bound on one answer (bridge or upstream).
const ANSWER_LIMIT: Duration = Duration::from_secs(30);
/// Bound on a bridge's exit once its stdin is closed (the proxy gives in-flight answers up to 5 s).
const EXIT_LIMIT: Duration = Duration::from_secs(10);
/// Lines of a bridge's stderr shown when it fails.
const STDERR_TAIL: usize = 20;

static FAILURES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn fail(what: String) {
    println!("CHECK FAILED: {what}");
    FAILURES.lock().unwrap().push(what);
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    let v = std::env::var(name).unwrap_or_else(|_| default.to_string());
    v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// `program --version`, or None when it cannot run.
fn version_of(program: &str) -> Option<String> {
    let out = Command::new(program).arg("--version").stdin(Stdio::null()).output().ok()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    out.status.success().then(|| text.trim().to_string())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------- upstreams ----------

/// What keeps an upstream running; dropped last.
enum Server {
    StandIn(Child),
    Agentchattr { _run: Box<Agentchattr> },
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Server::StandIn(child) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Upstream {
    name: &'static str,
    /// `http://127.0.0.1:PORT/mcp`.
    url: String,
    port: u16,
    token: String,
    /// The agent the proxy is given (agentchattr: the name it registered).
    agent: String,
    /// The stand-in echoes the `sender` it got, so each answer shows whose call it was.
    echoes_sender: bool,
    about: String,
    _server: Server,
}

/// `benches/util/mcp_upstream.py` on a free port.
fn start_stand_in() -> Result<Upstream, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/util/mcp_upstream.py");
    let mut child = Command::new("python3")
        .arg(script)
        .env("MCP_BENCH_TOKEN", TOKEN)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("start python3 {script}: {e}"))?;
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
    let Some(port) = line.strip_prefix("PORT ").and_then(|p| p.trim().parse::<u16>().ok()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("{script} printed {line:?} instead of `PORT n`"));
    };
    Ok(Upstream {
        name: "stand-in",
        url: format!("http://127.0.0.1:{port}/mcp"),
        port,
        token: TOKEN.to_string(),
        agent: AGENT.to_string(),
        echoes_sender: true,
        about: format!("benches/util/mcp_upstream.py ({})", version_of("python3").unwrap_or_default()),
        _server: Server::StandIn(child),
    })
}

/// The real agentchattr (`run.py` in its pinned venv), with an agent registered as its wrapper does.
fn start_agentchattr() -> Upstream {
    let ac = Agentchattr::start();
    let (agent, token) = ac.register("claude");
    Upstream {
        name: "agentchattr",
        url: format!("{}/mcp", ac.mcp_base()),
        port: ac.http,
        token,
        agent,
        echoes_sender: false,
        about: "agentchattr a813e38 (run.py, streamable HTTP)".to_string(),
        _server: Server::Agentchattr { _run: Box::new(ac) },
    }
}

/// A `tools/call` answer is right: a result that is not an error; from the stand-in, with `sender` in it.
fn check_call(up: &Upstream, answer: &Value, sender: &str) -> Result<(), String> {
    let result = answer.get("result").ok_or_else(|| format!("not a result: {answer}"))?;
    if result.get("isError") == Some(&Value::Bool(true)) {
        return Err(format!("a tool error: {answer}"));
    }
    if up.echoes_sender {
        let text = result["content"][0]["text"].as_str().unwrap_or("");
        let seen: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        if seen["sender"] != sender {
            return Err(format!("the upstream saw sender {}, expected {sender:?}: {answer}", seen["sender"]));
        }
    }
    Ok(())
}

fn call_params() -> Value {
    json!({"name": TOOL, "arguments": {"sender": HOST_SENDER, "limit": 5}})
}

fn initialize_params() -> Value {
    json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "stdio-bench", "version": "1"}})
}

// ---------- the raw client: the upstream's own time ----------

/// One keep-alive connection to the upstream, speaking MCP as a bridge would, minus the bridge.
struct Direct {
    client: RawClient,
    host: String,
    token: String,
    session: Option<String>,
    next_id: u64,
    /// The upstream's own `initialize`: connect, request, answer.
    init: Duration,
}

/// The JSON-RPC messages of an answer body: the body itself, or each SSE event's `data:` lines joined.
fn body_messages(content_type: &str, body: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(body);
    if !content_type.starts_with("text/event-stream") {
        return serde_json::from_str(&text).into_iter().collect();
    }
    let mut out = Vec::new();
    for event in text.replace("\r\n", "\n").split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if let Ok(v) = serde_json::from_str(&data.join("\n")) {
            out.push(v);
        }
    }
    out
}

impl Direct {
    fn connect(up: &Upstream) -> Result<Direct, String> {
        let t0 = Instant::now();
        let stream = TcpStream::connect(("127.0.0.1", up.port)).map_err(|e| format!("connect: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(ANSWER_LIMIT)).map_err(|e| e.to_string())?;
        let mut d = Direct {
            client: RawClient::new(stream),
            host: format!("127.0.0.1:{}", up.port),
            token: up.token.clone(),
            session: None,
            next_id: 1,
            init: Duration::ZERO,
        };
        let (init, _) = d.request("initialize", initialize_params())?;
        d.init = t0.elapsed();
        if init.get("result").is_none() {
            return Err(format!("initialize: {init}"));
        }
        d.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
        Ok(d)
    }

    /// POST one message; the answer's status and messages.
    fn post(&mut self, message: &Value) -> Result<(u16, Vec<Value>), String> {
        let body = message.to_string();
        let auth = format!("Bearer {}", self.token);
        let mut fields = vec![
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Authorization", auth.as_str()),
        ];
        if let Some(s) = &self.session {
            fields.push(("Mcp-Session-Id", s.as_str()));
            fields.push(("MCP-Protocol-Version", PROTOCOL));
        }
        self.client.send(&request("POST", "/mcp", &self.host, &fields, body.as_bytes()));
        let resp = self.client.read_response("POST");
        if let Some(s) = resp.all("mcp-session-id").first() {
            self.session = Some(s.to_string());
        }
        let ct = resp.all("content-type").first().map(|c| c.to_ascii_lowercase()).unwrap_or_default();
        if !(200..300).contains(&resp.status) {
            return Err(format!("HTTP {} to {message}: {}", resp.status, resp.text()));
        }
        Ok((resp.status, body_messages(&ct, &resp.body)))
    }

    /// A request and its answer, timed from the first byte written to the last byte read.
    fn request(&mut self, method: &str, params: Value) -> Result<(Value, Duration), String> {
        let id = self.next_id;
        self.next_id += 1;
        let t0 = Instant::now();
        let (_, messages) =
            self.post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let took = t0.elapsed();
        let answer =
            messages.into_iter().find(|m| m["id"] == id).ok_or_else(|| format!("no answer to {method}"))?;
        Ok((answer, took))
    }
}

// ---------- the bridges ----------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    McpRemote,
    Proxy,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::McpRemote => "mcp-remote",
            Kind::Proxy => "proxy",
        }
    }

    /// The `sender` the upstream should see from this bridge.
    fn sender(self, up: &Upstream) -> String {
        match self {
            Kind::McpRemote => HOST_SENDER.to_string(),
            Kind::Proxy => up.agent.clone(),
        }
    }
}

/// The files of the bridges for one upstream, made once: the proxy's token file, mcp-remote's header file
/// and its HOME (where it keeps `~/.mcp-auth`), and where each bridge's stderr goes.
struct BridgeFiles {
    dir: PathBuf,
    token_file: PathBuf,
    header_file: PathBuf,
    home: PathBuf,
}

impl BridgeFiles {
    fn new(up: &Upstream) -> BridgeFiles {
        let dir = scratch_dir(&format!("stdio-bench-{}", up.name));
        let header_file = dir.join("headers.txt");
        std::fs::write(&header_file, format!("Authorization: Bearer {}\n", up.token))
            .expect("write header file");
        let home = dir.join("home");
        std::fs::create_dir_all(&home).expect("mkdir home");
        BridgeFiles { token_file: token_file(&up.token), header_file, home, dir }
    }

    /// Every run of `kind` appends its stderr here.
    fn stderr(&self, kind: Kind) -> PathBuf {
        self.dir.join(format!("{}.stderr", kind.name()))
    }

    /// The last lines `kind` wrote on stderr, for a failure's message.
    fn stderr_tail(&self, kind: Kind) -> String {
        let path = self.stderr(kind);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(STDERR_TAIL)..].join("\n");
        format!("\n--- the last lines of {} ---\n{tail}", path.display())
    }
}

/// stdout of a bridge, read one line at a time with a deadline (poll(2), no thread between the pipe and the
/// clock).
struct Lines {
    pipe: ChildStdout,
    pending: Vec<u8>,
}

impl Lines {
    fn next(&mut self, deadline: Instant) -> Result<Vec<u8>, String> {
        loop {
            if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.pending.drain(..=i).collect();
                line.pop();
                return Ok(line);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("no answer line within {ANSWER_LIMIT:?}"));
            }
            let mut pfd = libc::pollfd { fd: self.pipe.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd, its fd owned by `self.pipe`.
            let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32 + 1) };
            if n <= 0 {
                continue;
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.pipe.read(&mut chunk) {
                Ok(0) => return Err("stdout closed".to_string()),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("read stdout: {e}")),
            }
        }
    }
}

/// A bridge as its host runs it: a child with piped stdin and stdout, its stderr appended to a file.
struct Bridge {
    kind: Kind,
    child: Child,
    stdin: Option<ChildStdin>,
    out: Lines,
    next_id: u64,
    /// Lines that were not the answer awaited (server notifications).
    others: usize,
}

impl Bridge {
    fn command(kind: Kind, up: &Upstream, files: &BridgeFiles) -> Command {
        match kind {
            Kind::McpRemote => {
                let mut cmd = Command::new("node");
                cmd.arg(realenv::mcp_remote())
                    .arg(&up.url)
                    .arg("--header-file")
                    .arg(&files.header_file)
                    .args(["--transport", "http-only"])
                    .env("HOME", &files.home);
                cmd
            }
            Kind::Proxy => {
                let mut cmd = Command::new(BIN);
                cmd.args(["--stdio", "--upstream", &up.url, "--agent", &up.agent])
                    .arg("--token-file")
                    .arg(&files.token_file)
                    .env_remove("RUST_LOG");
                cmd
            }
        }
    }

    /// Spawn, send `initialize` at once, wait for its answer: the bridge and the time from spawn to the answer.
    fn start(kind: Kind, up: &Upstream, files: &BridgeFiles) -> Result<(Bridge, Duration), String> {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(files.stderr(kind))
            .expect("stderr file");
        let mut cmd = Self::command(kind, up, files);
        let t0 = Instant::now();
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", kind.name()))?;
        let out = Lines { pipe: child.stdout.take().expect("piped"), pending: Vec::new() };
        let mut bridge = Bridge { kind, stdin: child.stdin.take(), child, out, next_id: 1, others: 0 };
        let (init, _) = bridge.request("initialize", initialize_params())?;
        let took = t0.elapsed();
        if init["result"]["protocolVersion"].as_str().is_none() {
            return Err(format!("initialize answered {init}"));
        }
        Ok((bridge, took))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn send(&mut self, message: &Value) -> Result<(), String> {
        let mut line = message.to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush()).map_err(|e| format!("write stdin: {e}"))
    }

    /// A request and its answer, timed from the line written to the answer's line read.
    fn request(&mut self, method: &str, params: Value) -> Result<(Value, Duration), String> {
        let id = self.next_id;
        self.next_id += 1;
        let t0 = Instant::now();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let deadline = t0 + ANSWER_LIMIT;
        loop {
            let line = self.out.next(deadline).map_err(|e| format!("{method}: {e}"))?;
            let took = t0.elapsed();
            let message: Value = serde_json::from_slice(&line).map_err(|_| {
                format!("wrote a line that is not JSON on stdout: {:?}", String::from_utf8_lossy(&line))
            })?;
            if message["id"] == id && (message.get("result").is_some() || message.get("error").is_some()) {
                return Ok((message, took));
            }
            self.others += 1;
        }
    }

    /// `notifications/initialized` and a `tools/list` that names the tool: the session a host has.
    fn open_session(&mut self) -> Result<(), String> {
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
        let (list, _) = self.request("tools/list", json!({}))?;
        let tools = list["result"]["tools"].as_array().cloned().unwrap_or_default();
        if !tools.iter().any(|t| t["name"] == TOOL) {
            return Err(format!("tools/list has no {TOOL}: {list}"));
        }
        Ok(())
    }

    /// Close stdin (what a host does to stop its server) and wait for the exit.
    fn close(mut self) -> Result<ExitStatus, String> {
        drop(self.stdin.take());
        let deadline = Instant::now() + EXIT_LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err(format!("still running {EXIT_LIMIT:?} after its stdin closed"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Close a bridge: the proxy must exit 0 (its contract); mcp-remote's status is only reported.
fn close_checked(bridge: Bridge, files: &BridgeFiles) -> Result<(), String> {
    let kind = bridge.kind;
    match bridge.close() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) if kind == Kind::McpRemote => {
            println!("   note: mcp-remote exited with {status} when its stdin closed");
            Ok(())
        }
        Ok(status) => Err(format!("exited with {status} when its stdin closed{}", files.stderr_tail(kind))),
        Err(e) => Err(format!("{e}{}", files.stderr_tail(kind))),
    }
}

/// RSS of `pid` and every process under it (KiB).
fn tree_rss_kib(pid: u32) -> (u64, usize) {
    let mut total = rss_kib(pid);
    let mut count = 1;
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        let Ok(dir) = std::fs::read_dir("/proc") else { break };
        for p in dir.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()) {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let ppid = stat.rfind(')').and_then(|i| stat[i + 2..].split(' ').nth(1)?.parse::<u32>().ok());
            if ppid == Some(parent) {
                total += rss_kib(p);
                count += 1;
                queue.push(p);
            }
        }
    }
    (total, count)
}

// ---------- one upstream ----------

#[derive(Default)]
struct Figures {
    spawn_ms: Vec<f64>,
    /// Sorted round trips of the measured calls, ms.
    calls_ms: Vec<f64>,
    rss_kib: u64,
    processes: usize,
    others: usize,
}

struct Measured {
    upstream: &'static str,
    /// Sorted: the raw client's connect + `initialize` on a new connection, once per spawn round.
    direct_init_ms: Vec<f64>,
    direct_ms: Vec<f64>,
    bridges: Vec<(Kind, Figures)>,
}

/// Spawns, then a session on each bridge and on the raw client with the calls in rounds, then RSS; the first
/// failure ends it.
fn measure(up: &Upstream, kinds: &[Kind], calls: usize, spawns: usize) -> Result<Measured, String> {
    let files = BridgeFiles::new(up);
    let failed =
        |kind: Kind, what: &str, e: String| format!("{} {what}: {e}{}", kind.name(), files.stderr_tail(kind));
    let mut figures: Vec<(Kind, Figures)> = kinds.iter().map(|&k| (k, Figures::default())).collect();
    // Spawn to the initialize answer, the bridges in turn, and the upstream's own connect + initialize.
    let mut direct_init_ms = Vec::new();
    for _ in 0..spawns {
        let fresh = Direct::connect(up).map_err(|e| format!("the raw client: {e}"))?;
        direct_init_ms.push(ms(fresh.init));
        for (kind, f) in figures.iter_mut() {
            let (bridge, took) = Bridge::start(*kind, up, &files)
                .map_err(|e| failed(*kind, "did not answer initialize", e))?;
            f.spawn_ms.push(ms(took));
            close_checked(bridge, &files).map_err(|e| format!("{}: {e}", kind.name()))?;
        }
    }
    // One session each, and the raw client's.
    let mut bridges = Vec::new();
    for &kind in kinds {
        let (mut bridge, _) = Bridge::start(kind, up, &files).map_err(|e| failed(kind, "initialize", e))?;
        bridge.open_session().map_err(|e| failed(kind, "session", e))?;
        bridges.push(bridge);
    }
    let mut direct = Direct::connect(up).map_err(|e| format!("the raw client: {e}"))?;
    let params = call_params();
    let mut direct_ms = Vec::new();
    let per_round = calls.div_ceil(ROUNDS);
    for round in 0..=ROUNDS {
        // Round 0 is the warm-up, not recorded.
        let (n, keep) = if round == 0 { (WARMUP, false) } else { (per_round, true) };
        for _ in 0..n {
            let (answer, took) =
                direct.request("tools/call", params.clone()).map_err(|e| format!("the raw client: {e}"))?;
            check_call(up, &answer, HOST_SENDER).map_err(|e| format!("the raw client: {e}"))?;
            if keep {
                direct_ms.push(ms(took));
            }
        }
        for (bridge, (kind, f)) in bridges.iter_mut().zip(figures.iter_mut()) {
            let sender = kind.sender(up);
            for _ in 0..n {
                let answer = bridge.request("tools/call", params.clone());
                let took = answer
                    .and_then(|(a, took)| check_call(up, &a, &sender).map(|()| took))
                    .map_err(|e| failed(*kind, "tools/call", e))?;
                if keep {
                    f.calls_ms.push(ms(took));
                }
            }
        }
    }
    for (bridge, (kind, f)) in bridges.into_iter().zip(figures.iter_mut()) {
        (f.rss_kib, f.processes) = tree_rss_kib(bridge.pid());
        f.others = bridge.others;
        close_checked(bridge, &files).map_err(|e| format!("{}: {e}", kind.name()))?;
    }
    for (_, f) in figures.iter_mut() {
        f.calls_ms = sorted(std::mem::take(&mut f.calls_ms));
        f.spawn_ms = sorted(std::mem::take(&mut f.spawn_ms));
    }
    Ok(Measured {
        upstream: up.name,
        direct_init_ms: sorted(direct_init_ms),
        direct_ms: sorted(direct_ms),
        bridges: figures,
    })
}

// ---------- report ----------

/// One goal's line: the ratio, and whether it is met; a ratio over `gate` fails the run.
fn judge(upstream: &str, what: &str, ours: f64, theirs: f64, goal: Option<f64>, gate: Option<f64>) {
    let ratio = ours / theirs;
    let verdict = match goal {
        Some(g) if ratio <= g => format!("goal <= {g}x: met"),
        Some(g) => format!("goal <= {g}x: MISSED"),
        None => "(no goal)".to_string(),
    };
    println!("   {what:<34} {ratio:>8.3}x   {verdict}");
    if let (Some(_), Some(gate)) = (goal, gate) {
        if ratio.is_nan() || ratio > gate {
            fail(format!("{upstream}: {what}: {ratio:.3}x mcp-remote's, over STDIO_BENCH_MAX_RATIO {gate}x"));
        }
    }
}

fn report(m: &Measured, calls: usize, spawns: usize, gate: Option<f64>) {
    let d = &m.direct_ms;
    let (d50, d99) = (percentile(d, 0.5), percentile(d, 0.99));
    println!(
        "   raw keep-alive client: connect + initialize p50 {:.1} ms; {} tools/call: p50 {d50:.3} ms, p99 {d99:.3} ms",
        percentile(&m.direct_init_ms, 0.5),
        d.len()
    );
    println!(
        "   {:<11} {:>16} {:>10} {:>10} {:>11} {:>11} {:>14}",
        "bridge", "spawn->init p50", "call p50", "call p99", "added p50", "added p99", "RSS"
    );
    for (kind, f) in &m.bridges {
        let (c50, c99) = (percentile(&f.calls_ms, 0.5), percentile(&f.calls_ms, 0.99));
        let procs = if f.processes > 1 { format!(" ({} procs)", f.processes) } else { String::new() };
        println!(
            "   {:<11} {:>13.1} ms {:>7.3} ms {:>7.3} ms {:>8.3} ms {:>8.3} ms {:>10.1} MiB{procs}",
            kind.name(),
            percentile(&f.spawn_ms, 0.5),
            c50,
            c99,
            c50 - d50,
            c99 - d99,
            f.rss_kib as f64 / 1024.0
        );
        if f.others > 0 {
            println!("   ({}: {} lines besides the answers, skipped)", kind.name(), f.others);
        }
    }
    println!(
        "   (spawn->init: median of {spawns} spawns; calls: {calls} after {WARMUP} warm-up, in {ROUNDS} rounds; \
         RSS: VmRSS after the calls)"
    );
    let get = |k: Kind| m.bridges.iter().find(|(kind, _)| *kind == k).map(|(_, f)| f);
    let (Some(ours), Some(theirs)) = (get(Kind::Proxy), get(Kind::McpRemote)) else {
        println!("   no ratios: both bridges are needed");
        return;
    };
    let added = |f: &Figures, p: f64| percentile(&f.calls_ms, p) - percentile(d, p);
    println!("   ratio, proxy / mcp-remote:");
    let spawn = |f: &Figures| percentile(&f.spawn_ms, 0.5);
    judge(m.upstream, "spawn to the initialize answer", spawn(ours), spawn(theirs), Some(GOAL), gate);
    judge(m.upstream, "latency added, p50", added(ours, 0.5), added(theirs, 0.5), Some(GOAL), gate);
    judge(m.upstream, "latency added, p99", added(ours, 0.99), added(theirs, 0.99), None, gate);
    judge(m.upstream, "RSS after the calls", ours.rss_kib as f64, theirs.rss_kib as f64, Some(GOAL), gate);
}

fn main() -> ExitCode {
    let calls = env_usize("STDIO_BENCH_CALLS", 1000).max(ROUNDS);
    let spawns = env_usize("STDIO_BENCH_SPAWNS", 10).max(1);
    let gate = std::env::var("STDIO_BENCH_MAX_RATIO").ok().and_then(|v| v.trim().parse::<f64>().ok());
    let upstreams = env_list("STDIO_BENCH_UPSTREAMS", "stand-in,agentchattr");
    let mut kinds: Vec<Kind> = Vec::new();
    for b in env_list("STDIO_BENCH_BRIDGES", "mcp-remote,proxy") {
        match b.as_str() {
            "mcp-remote" => kinds.push(Kind::McpRemote),
            "proxy" => kinds.push(Kind::Proxy),
            other => {
                println!("STDIO_BENCH_BRIDGES: unknown bridge {other:?} (mcp-remote, proxy)");
                return ExitCode::FAILURE;
            }
        }
    }
    let ci = in_ci();
    println!("stdio bench: {BIN} ({})", version_of(BIN).unwrap_or_else(|| "no --version".into()));
    let need = |what: &str, why: &str| {
        if ci {
            fail(format!("{what} is missing and CI is set: {why}"));
        } else {
            println!("   skipped: {what} is missing: {why}");
        }
    };
    if kinds.contains(&Kind::McpRemote) {
        match version_of("node") {
            Some(v) => {
                let script = realenv::mcp_remote();
                let manifest = script.parent().and_then(Path::parent).map(|p| p.join("package.json"));
                let text = manifest.and_then(|m| std::fs::read_to_string(m).ok()).unwrap_or_default();
                let version = serde_json::from_str::<Value>(&text)
                    .ok()
                    .map(|m| m["version"].as_str().unwrap_or("?").to_string());
                println!("   mcp-remote {} on node {v}: {}", version.unwrap_or_default(), script.display());
            }
            None => {
                need("node", "mcp-remote runs on Node.js (apt-get install -y nodejs npm)");
                kinds.retain(|k| *k != Kind::McpRemote);
            }
        }
    }
    let python = version_of("python3");
    if python.is_none() {
        need("python3", "both upstreams are Python servers (apt-get install -y python3 python3-venv)");
    }
    let mut results = Vec::new();
    for name in &upstreams {
        if python.is_none() || !FAILURES.lock().unwrap().is_empty() {
            break;
        }
        let up = match name.as_str() {
            "stand-in" => start_stand_in(),
            "agentchattr" if !Path::new(agentchattr::SNAPSHOT).is_file() => {
                need("the agentchattr snapshot", agentchattr::SNAPSHOT);
                continue;
            }
            "agentchattr" => Ok(start_agentchattr()),
            other => {
                Err(format!("STDIO_BENCH_UPSTREAMS: unknown upstream {other:?} (stand-in, agentchattr)"))
            }
        };
        let up = match up {
            Ok(up) => up,
            Err(e) => {
                fail(e);
                continue;
            }
        };
        println!();
        println!("== {}: {} at {} ==", up.name, up.about, up.url);
        let _ = std::io::stdout().flush();
        match measure(&up, &kinds, calls, spawns) {
            Ok(m) => {
                report(&m, calls, spawns, gate);
                results.push(m);
            }
            Err(e) => fail(format!("{}: {e}", up.name)),
        }
    }
    println!();
    let failures = FAILURES.lock().unwrap();
    println!("== summary: {} upstreams measured, {} failed checks ==", results.len(), failures.len());
    for f in failures.iter() {
        println!("CHECK FAILED: {f}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

//! Real agent CLIs (the hosts: Codex, Claude Code, Gemini CLI) making one non-interactive turn against the
//! real agentchattr through the proxy, with a scripted stand-in for their model:
//!
//! - [`Stage::command`] and [`Stage::run`]: the CLI with an environment of its own (PATH only from ours, HOME
//!   and TMPDIR in the test's scratch dir, every proxy variable on the [`trap`]), in a process group of its
//!   own (launchers spawn native binaries, which spawn helpers), bounded, and killed whole on the way out,
//!   after the stdio proxies it spawned had their time to finish.
//! - [`trap`] and [`check_trap`]: a loopback recorder that refuses whatever would have left the machine; a
//!   turn fails if it saw a connection.
//! - [`Stage`]: what a turn starts from: agentchattr with the agent registered and its own tool list checked,
//!   the trap, the host's HOME and working directory; [`Stage::proxy`] the proxy in front of agentchattr, and
//!   [`Stage::serve`] it as the host's MCP server [`Via`] HTTP (listening) or stdio (spawned by the host).
//! - [`check_offered`]: what the host offered its model of agentchattr's tools: all of them, none with a
//!   `sender` parameter (the proxy's default stamps take it out of the listed schemas).
//! - [`Stage::check_landing`]: what every turn must leave: the `chat_send` (claiming [`CLAIMED`]) stored once
//!   under the agent's registered name, its answer (`Sent (id=N)`) given back to the model, and `chat_read`'s
//!   result given back to the model holding that message under the agent's name.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::agentchattr::{Agentchattr, TOOLS};
use crate::support::checks::Checks;
use crate::support::proxy_process::{drain, scratch_dir, ProxyBuilder, ProxyProcess, BIN};
use crate::support::wire::{response, Next, StubUpstream};

/// The sender a model's `chat_send` claims: someone the agent is not.
pub const CLAIMED: &str = "someone-else";
/// agentchattr's name in each host's MCP configuration.
pub const SERVER: &str = "agentchattr";
/// What each host is asked.
pub const PROMPT: &str = "Post a short hello to #general with chat_send, then read #general.";
/// The stand-in model's last words.
pub const FINAL: &str = "Posted to #general and read it back.";
/// Bound on one host run (1 to 3 s on an idle machine; several times that on a loaded two-core one).
pub const TURN_LIMIT: Duration = Duration::from_secs(90);

/// How long a stdio proxy may take to exit once its host has: the host signals it (see [`StdioEnd`]) or its
/// stdin ends with the host, and it lets answers in flight finish (5 s at most), DELETEs the session, exits.
const PROXY_GRACE: Duration = Duration::from_secs(8);

/// What one host run left.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// The stdio proxies the host spawned still running [`PROXY_GRACE`] after it exited (then killed).
    pub proxies_left: usize,
}

/// A stand-in model: each `POST` to `path` is answered with the event stream `answer` makes of its JSON body
/// (null if it is not JSON); anything else is a 404.
pub fn stand_in(
    path: &'static str,
    answer: impl Fn(&Value) -> String + Send + Sync + 'static,
) -> StubUpstream {
    StubUpstream::start(move |req, s| {
        let bytes = if req.method == "POST" && req.target == path {
            let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
            response("200 OK", &[("Content-Type", "text/event-stream")], answer(&body).as_bytes())
        } else {
            response(
                "404 Not Found",
                &[("Content-Type", "text/plain")],
                b"the stand-in model has no such path",
            )
        };
        let _ = s.write_all(&bytes);
        Next::KeepAlive
    })
}

/// The network trap: every proxy variable of a host points at it, and it answers whatever comes with 403.
pub fn trap() -> StubUpstream {
    StubUpstream::start(|_, s| {
        let _ = s.write_all(&response("403 Forbidden", &[], b"this test reaches nothing but loopback"));
        Next::Close
    })
}

/// A failed check if the trap saw a connection: the host tried to leave loopback.
pub fn check_trap(c: &mut Checks, host: &str, trap: &StubUpstream) {
    c.check(
        trap.connections() == 0,
        format!(
            "{host} tried to leave loopback: {:?}",
            trap.requests().iter().map(|r| r.head.start.clone()).collect::<Vec<_>>()
        ),
    );
}

/// How a host reaches agentchattr through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// The proxy listening on a loopback port, started by the test; the host's MCP entry is its URL.
    Http,
    /// The proxy as the host's stdio MCP server (`--stdio`): the host spawns it, and speaks JSON-RPC lines on
    /// its stdin and stdout.
    Stdio,
}

/// How a host ends its stdio server when its turn is over (measured with strace), and so what the proxy has
/// time for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdioEnd {
    /// A signal, and time: Claude Code sends SIGINT and looks 50 ms later whether the server is gone; Gemini
    /// CLI sends SIGTERM. The proxy DELETEs the session and exits: its audit log ends with the deletion.
    Signal,
    /// Codex sends SIGTERM to the server's process group and SIGKILL about 3 ms later: the proxy's DELETE
    /// races the kill (and lost it in about one run in eight here), so the deletion may be missing.
    SignalThenKill,
}

/// The proxy as a host's MCP server ([`Stage::serve`]).
pub enum Served {
    /// Listening: `url` is agentchattr's `/mcp` through it.
    Http { proxy: ProxyProcess, url: String },
    /// For the host to spawn: `command` (the binary under test) with `args` (the token in a file, as ever).
    Stdio { command: String, args: Vec<String> },
}

impl Served {
    /// Stop a listening proxy (the host stops its stdio server itself).
    pub fn stop(&mut self) {
        if let Served::Http { proxy, .. } = self {
            proxy.stop();
        }
    }

    /// A listening proxy's stderr (a stdio server's goes to the host).
    pub fn log(&self) -> String {
        match self {
            Served::Http { proxy, .. } => proxy.stderr_text(),
            Served::Stdio { .. } => "(a stdio server: its stderr went to the host)".to_string(),
        }
    }
}

/// What a turn starts from. Make it after anything that takes long (installing the host, on a first run):
/// agentchattr drops an agent it has not heard of for 15 s since its registration (its crash timeout; a tool
/// call is what it hears), and the agent's token goes stale with it.
pub struct Stage {
    pub ac: Agentchattr,
    /// The agent's registered name and its token.
    pub agent: String,
    pub token: String,
    /// agentchattr's own `tools/list`, asked directly.
    pub tools: Vec<Value>,
    pub trap: StubUpstream,
    /// The test's scratch directory, and the host's HOME and working directory in it.
    pub scratch: PathBuf,
    /// The proxy's audit log (`--audit-log`), in the scratch directory.
    pub audit: PathBuf,
    pub home: PathBuf,
    pub work: PathBuf,
    pub started: Instant,
}

impl Stage {
    /// agentchattr started, an agent of `base` (`claude`, `gemini`, ...) registered, agentchattr's tool list
    /// checked (the premise: its twelve tools, its `chat_send` requiring a `sender`), the trap, and empty
    /// HOME and working directories under a scratch dir named after `test`.
    #[track_caller]
    pub fn new(test: &str, base: &str) -> Stage {
        let started = Instant::now();
        let ac = Agentchattr::start();
        let (agent, token) = ac.register(base);
        let tools = ac.tools();
        let mut names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
        names.sort_unstable();
        let mut known = TOOLS.to_vec();
        known.sort_unstable();
        assert_eq!(names, known, "agentchattr's own tools/list is not its known tool set");
        let send = tools.iter().find(|t| t["name"] == "chat_send").expect("agentchattr lists chat_send");
        assert!(
            send["inputSchema"]["required"].as_array().is_some_and(|r| r.contains(&json!("sender"))),
            "agentchattr's chat_send does not require a sender: {send}"
        );
        let scratch = scratch_dir(test);
        let (home, work) = (scratch.join("home"), scratch.join("work"));
        for dir in [&home, &work] {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        }
        let audit = scratch.join("audit.jsonl");
        Stage { ac, agent, token, tools, trap: trap(), scratch, audit, home, work, started }
    }

    /// `program` in the host's working directory with an environment of its own: PATH only from ours, `HOME`
    /// and `TMPDIR` (created) in the stage, every proxy variable on the trap (loopback exempt), stdin closed,
    /// output piped, a process group of its own. The caller adds its arguments and variables, then hands it
    /// to [`Stage::run`].
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let tmp = self.home.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("mkdir {}: {e}", tmp.display()));
        let trap_url = format!("http://{}", self.trap.authority());
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("TMPDIR", &tmp)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
            cmd.env(var, &trap_url);
        }
        cmd
    }

    /// Run `cmd` (made by [`Stage::command`]) until it exits or `limit` passes. Then the stdio proxies it
    /// spawned get [`PROXY_GRACE`] to finish (hosts start them in process groups of their own, or in theirs:
    /// either way they are found by their command line, which names this stage's audit log), and whatever is
    /// left, the host's process group and those proxies, is killed. Panics if the host ran past `limit`.
    #[track_caller]
    pub fn run(&self, what: &str, mut cmd: Command, limit: Duration) -> Run {
        let started = Instant::now();
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {what}: {e}"));
        let out = drain(child.stdout.take().expect("stdout piped"));
        let err = drain(child.stderr.take().expect("stderr piped"));
        let mut timed_out = false;
        while !exited(&child) {
            if started.elapsed() > limit {
                timed_out = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let elapsed = started.elapsed();
        let settling = Instant::now();
        let mut proxies = self.stdio_proxies();
        while !timed_out && !proxies.is_empty() && settling.elapsed() < PROXY_GRACE {
            std::thread::sleep(Duration::from_millis(20));
            proxies = self.stdio_proxies();
        }
        // SAFETY: kill(2) on the process group this test created, its leader not reaped yet (so the group's
        // id is still ours); what the host started and left running in it goes with it. Then each proxy of
        // this stage still running: started by this test's host, found by its own command line just now.
        unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
        for pid in &proxies {
            unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
        }
        let status = child.wait().unwrap_or_else(|e| panic!("reap {what}: {e}"));
        std::thread::sleep(Duration::from_millis(50));
        let text = |b: &Arc<Mutex<Vec<u8>>>| String::from_utf8_lossy(&b.lock().unwrap()).into_owned();
        let run =
            Run { status, stdout: text(&out), stderr: text(&err), elapsed, proxies_left: proxies.len() };
        assert!(
            !timed_out,
            "{what} ran past {limit:?} and was killed\n--- stdout ---\n{}\n--- stderr ---\n{}",
            run.stdout, run.stderr
        );
        run
    }

    /// The stdio proxies of this stage still running: the binary under test with `--stdio` and this stage's
    /// audit log on its command line.
    fn stdio_proxies(&self) -> Vec<u32> {
        #[cfg(target_os = "linux")]
        return crate::support::procfs::running_with(
            std::path::Path::new(BIN),
            &[OsStr::new("--stdio"), self.audit.as_os_str()],
        );
        #[cfg(not(target_os = "linux"))]
        return Vec::new();
    }

    /// What every turn must leave, checked into `c`: the model's `chat_send` of `message` (claiming
    /// [`CLAIMED`], or no sender at all) stored once in agentchattr, in #general, under the agent's name; its
    /// answer `Sent (id=N)`, as the host gave it to the model, naming that message; and `chat_read`'s result,
    /// as the host gave it to the model, holding that message under the agent's name, nothing under
    /// [`CLAIMED`]. Returns the message's id.
    pub fn check_landing(&self, c: &mut Checks, message: &str, turns: &Turns) -> Option<u64> {
        let agent = self.agent.as_str();
        let (send_output, read_output) = (turns.send_output.as_deref(), turns.read_output.as_deref());
        c.check(send_output.is_some(), "the model never got chat_send's result".to_string());
        let id = send_output.and_then(sent_id);
        c.check(
            id.is_some(),
            format!(
                "chat_send's result given to the model is not agentchattr's \"Sent (id=N)\": {send_output:?}"
            ),
        );

        let messages = self.ac.messages();
        let stored: Vec<&Value> = messages.iter().filter(|m| m["text"] == message).collect();
        c.check(stored.len() == 1, format!("stored {} times, want once: {stored:?}", stored.len()));
        if let Some(m) = stored.first() {
            c.eq("the stored sender", &m["sender"], &json!(agent));
            c.eq("the stored channel", &m["channel"], &json!("general"));
            c.check(m["id"].as_u64() == id, format!("stored as id {}, chat_send answered {id:?}", m["id"]));
        }
        let claimed: Vec<&Value> = messages.iter().filter(|m| m["sender"] == CLAIMED).collect();
        c.check(claimed.is_empty(), format!("stored under the claimed sender {CLAIMED:?}: {claimed:?}"));

        c.check(read_output.is_some(), "the model never got chat_read's result".to_string());
        let entries = read_output.map(chat_entries).unwrap_or_default();
        let read: Vec<&Value> = entries.iter().filter(|e| e["text"] == message).collect();
        c.check(
            read.len() == 1,
            format!(
                "chat_read's result given to the model holds the message {} times, want once: {read_output:?}",
                read.len()
            ),
        );
        if let Some(e) = read.first() {
            c.eq("the sender chat_read gave the model", &e["sender"], &json!(agent));
            c.check(
                e["id"].as_u64() == id,
                format!("chat_read gave the model id {}, chat_send answered {id:?}", e["id"]),
            );
        }
        c.check(
            entries.iter().all(|e| e["sender"] != CLAIMED),
            format!("chat_read gave the model a message under {CLAIMED:?}: {read_output:?}"),
        );
        id
    }

    /// The checks every turn ends with: `host` exited 0; the proxy's audit log ([`Stage::check_audit`]); a
    /// stdio proxy gone with its host ([`check_proxy_exit`]); the trap untouched ([`check_trap`]).
    pub fn check_ending(
        &self,
        c: &mut Checks,
        host: &str,
        via: Via,
        end: StdioEnd,
        claimed: Option<&str>,
        run: &Run,
    ) {
        c.check(run.status.success(), format!("{host} exited with {}", run.status));
        self.check_audit(c, via, end, claimed);
        check_proxy_exit(c, via, run);
        check_trap(c, host, &self.trap);
    }

    /// Panics with every failed check of `c` and the evidence: `host`'s output, what the model was asked and
    /// given (the requests, the first turn's tools, the two calls' results), the proxy's log and audit log,
    /// agentchattr's output. Else says how long it took.
    #[track_caller]
    pub fn finish(&self, c: Checks, test: &str, host: &str, run: &Run, served: &Served, turns: &Turns) {
        let (out, err) = (format!("{host} stdout"), format!("{host} stderr"));
        let evidence = [
            (out.as_str(), run.stdout.clone()),
            (err.as_str(), run.stderr.clone()),
            ("model requests", turns.seen.clone()),
            (
                "tools on the first turn",
                serde_json::to_string_pretty(&turns.get(0)["tools"]).unwrap_or_default(),
            ),
            ("chat_send's result given to the model", format!("{:?}", turns.send_output)),
            ("chat_read's result given to the model", format!("{:?}", turns.read_output)),
            ("the proxy's log", served.log()),
            ("the proxy's audit log", self.audit_text()),
            ("agentchattr's output", self.ac.log_text()),
        ];
        c.finish(test, &evidence);
        eprintln!(
            "{test}: {host} {:.1} s (whole test {:.1} s); agent {}",
            run.elapsed.as_secs_f64(),
            self.started.elapsed().as_secs_f64(),
            self.agent
        );
    }

    /// The proxy in front of agentchattr's `/mcp` as the registered agent, logging each exchange (`info`),
    /// with an audit log ([`Stage::audit`]).
    pub fn proxy(&self) -> ProxyBuilder {
        self.proxy_to(format!("{}/mcp", self.ac.mcp_base()))
    }

    /// The same in front of `upstream` (agentchattr behind something else).
    pub fn proxy_to(&self, upstream: String) -> ProxyBuilder {
        ProxyProcess::builder(upstream)
            .agent(&self.agent)
            .token(&self.token)
            .arg("--audit-log", &self.audit)
            .env("RUST_LOG", "info")
    }

    /// `proxy` (from [`Stage::proxy`]) as the host's MCP server `via` HTTP (started, listening) or stdio (its
    /// command line with `--stdio`, for the host to spawn).
    #[track_caller]
    pub fn serve(&self, via: Via, proxy: ProxyBuilder) -> Served {
        match via {
            Via::Http => {
                let proxy = proxy.start();
                let url = proxy.url("/mcp");
                Served::Http { proxy, url }
            }
            Via::Stdio => {
                let args = proxy.flag("--stdio").argv();
                let args = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
                Served::Stdio { command: BIN.to_string(), args }
            }
        }
    }

    /// The proxy's audit log so far (empty if it wrote none).
    pub fn audit_text(&self) -> String {
        std::fs::read_to_string(&self.audit).unwrap_or_default()
    }

    /// The proxy's audit records so far.
    pub fn audit_records(&self) -> Vec<Value> {
        self.audit_text().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// Checks into `c` what the proxy's audit log says of the turn: the host's `tools/call`s were `chat_send`
    /// then `chat_read`, each answered by agentchattr (`ok`), `chat_send`'s claiming `claimed` as its sender
    /// (the proxy's record of an impersonation attempt; `None`: it named no sender). A stdio server given
    /// the time ([`StdioEnd::Signal`]) ends its log with its session's deletion: the host ended it, and the
    /// proxy said goodbye upstream.
    pub fn check_audit(&self, c: &mut Checks, via: Via, end: StdioEnd, claimed: Option<&str>) {
        let records = self.audit_records();
        let calls: Vec<Value> = records
            .iter()
            .filter(|r| r["event"] == "request" && r["mcp.method.name"] == "tools/call")
            .map(|r| json!([r["gen_ai.tool.name"], r["outcome"], r["answered_by"], r["claimed"]]))
            .collect();
        c.eq(
            "the tools/calls in the proxy's audit log (tool, outcome, answered by, claimed)",
            &json!(calls),
            &json!([["chat_send", "ok", "upstream", claimed], ["chat_read", "ok", "upstream", null]]),
        );
        if via == Via::Stdio && end == StdioEnd::Signal {
            let last = records.last().map(|r| &r["event"]);
            c.check(
                last == Some(&json!("session.deleted")),
                format!("the stdio proxy's last audit record is {last:?}, not its session's deletion"),
            );
        }
    }
}

/// Checks into `c` what a host offered its model of agentchattr's tools, given as (agentchattr's name, the
/// declaration's parameter schema), the host's own tools left out: each of agentchattr's twelve but `hidden`
/// (the proxy's `--deny-tool`s) once, none with a `sender` parameter, `chat_send` still with its `message`.
pub fn check_offered(c: &mut Checks, host: &str, offered: &[(String, Value)], hidden: &[&str]) {
    let mut got: Vec<&str> = offered.iter().map(|(n, _)| n.as_str()).collect();
    got.sort_unstable();
    let mut want: Vec<&str> = TOOLS.iter().copied().filter(|t| !hidden.contains(t)).collect();
    want.sort_unstable();
    c.check(got == want, format!("{host} offered agentchattr's tools {got:?}, want {want:?}"));
    let with_sender: Vec<&str> = offered
        .iter()
        .filter(|(_, schema)| {
            schema["properties"].get("sender").is_some()
                || schema["required"].as_array().is_some_and(|r| r.contains(&json!("sender")))
        })
        .map(|(n, _)| n.as_str())
        .collect();
    c.check(with_sender.is_empty(), format!("{host} offered with a sender parameter: {with_sender:?}"));
    let send = offered.iter().find(|(n, _)| n == "chat_send").map(|(_, s)| s);
    c.check(
        send.is_some_and(|s| s["properties"].get("message").is_some()),
        format!("{host} offered chat_send without its message parameter: {send:?}"),
    );
}

/// The model's turns in one host run.
pub struct Turns {
    /// The request bodies in order: the first offers the tools, the second carries `chat_send`'s result, the
    /// third `chat_read`'s.
    pub bodies: Vec<Value>,
    /// Every request the stand-in got (method and target), one a line, for the evidence.
    pub seen: String,
    /// `chat_send`'s result as the host gave it to the model on the second turn, and `chat_read`'s on the
    /// third.
    pub send_output: Option<String>,
    pub read_output: Option<String>,
}

impl Turns {
    /// The stand-in's `POST`s to `path`, checked into `c` to be three (chat_send, chat_read, the end) and
    /// all that the stand-in was asked; `result(body, tool)` finds the result of agentchattr's `tool` in a
    /// body, as the host gave it to the model.
    pub fn of(
        c: &mut Checks,
        model: &StubUpstream,
        path: &str,
        result: impl Fn(&Value, &str) -> Option<String>,
    ) -> Turns {
        let reqs = model.requests();
        let bodies: Vec<Value> = reqs
            .iter()
            .filter(|r| r.method == "POST" && r.target == path)
            .map(|r| serde_json::from_slice(&r.body).unwrap_or(Value::Null))
            .collect();
        let seen: Vec<String> = reqs.iter().map(|r| format!("{} {}", r.method, r.target)).collect();
        c.check(
            bodies.len() == 3,
            format!(
                "the model was asked {} times, want 3 (chat_send, chat_read, the end): {seen:?}",
                bodies.len()
            ),
        );
        c.check(
            bodies.len() == reqs.len(),
            format!("the model got requests other than POST {path}: {seen:?}"),
        );
        let send_output = bodies.get(1).and_then(|b| result(b, "chat_send"));
        let read_output = bodies.get(2).and_then(|b| result(b, "chat_read"));
        Turns { bodies, seen: seen.join("\n"), send_output, read_output }
    }

    /// The `n`th turn's body (0: the first), or null.
    pub fn get(&self, n: usize) -> &Value {
        self.bodies.get(n).unwrap_or(&Value::Null)
    }
}

/// A failed check if a stdio proxy outlived its host by [`PROXY_GRACE`].
pub fn check_proxy_exit(c: &mut Checks, via: Via, run: &Run) {
    c.check(
        via == Via::Http || run.proxies_left == 0,
        format!("{} stdio proxy(ies) still running {PROXY_GRACE:?} after the host exited", run.proxies_left),
    );
}

/// Whether `child` has exited, left unreaped (`WNOWAIT`): until `Child::wait` its pid, and so the id of the
/// process group it leads, cannot be taken by another process.
fn exited(child: &std::process::Child) -> bool {
    // SAFETY: zeroed is a valid siginfo_t; waitid(2) on our own child writes it on success.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    let rc = unsafe { libc::waitid(libc::P_PID, child.id() as libc::id_t, &mut info, options) };
    // With WNOHANG and nothing to report, waitid returns 0 and leaves si_pid 0.
    rc == 0 && unsafe { info.si_pid() } != 0
}

/// A tool result's content as a host hands it to its model, as text: a string, or the text of a list of
/// parts (`{"text": ...}`), or the JSON of anything else.
pub fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"),
        other => other.to_string(),
    }
}

/// `Sent (id=N)`, agentchattr's answer to a `chat_send`, somewhere in `text`: N.
pub fn sent_id(text: &str) -> Option<u64> {
    let rest = &text[text.find("Sent (id=")? + "Sent (id=".len()..];
    rest[..rest.find(')')?].parse().ok()
}

/// The chat messages (objects with an `id`, a `sender` and a `text`) in a tool result as a host hands it to
/// its model: agentchattr's `chat_read` answers with a JSON array as text, which hosts pass on as it is,
/// inside a JSON object of their own (Claude Code: `{"result": "[...]"}`), or inside markup (Gemini CLI:
/// `<untrusted_context>...</untrusted_context>`).
pub fn chat_entries(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    entries_in_text(text, &mut out);
    out
}

fn entries_in_text(text: &str, out: &mut Vec<Value>) {
    if let Ok(v) = serde_json::from_str::<Value>(text.trim()) {
        entries_in_value(&v, out);
        return;
    }
    // JSON with text around it: the first `[` or `{` that starts a JSON value.
    for (i, _) in text.char_indices().filter(|&(_, ch)| ch == '[' || ch == '{') {
        if let Some(Ok(v)) = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>().next() {
            entries_in_value(&v, out);
            return;
        }
    }
}

fn entries_in_value(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(m) if m.contains_key("id") && m.contains_key("sender") && m.contains_key("text") => {
            out.push(v.clone())
        }
        Value::Object(m) => m.values().for_each(|x| entries_in_value(x, out)),
        Value::Array(a) => a.iter().for_each(|x| entries_in_value(x, out)),
        Value::String(s) => entries_in_text(s, out),
        _ => {}
    }
}

#[cfg(test)]
mod selfcheck {
    use super::*;

    #[test]
    fn chat_entries_found_in_each_hosts_wrapping() {
        let array = r#"[{"id": 3, "sender": "claude", "text": "hi", "channel": "general"}]"#;
        let wrapped = json!({ "result": array }).to_string();
        let marked = format!("<untrusted_context>\n{array}\n</untrusted_context>");
        for text in [array.to_string(), wrapped, marked] {
            let got = chat_entries(&text);
            assert_eq!(got.len(), 1, "{text}");
            assert_eq!(got[0]["id"], 3, "{text}");
        }
        assert!(chat_entries("No new messages.").is_empty());
        assert_eq!(sent_id("{\"result\":\"Sent (id=12)\"}"), Some(12));
    }
}

//! The real agentchattr (maxlamagna/agentchattr a813e38, `../shared/agentchattr/`), as test data: its source
//! unpacked at test time, its `run.py` started on free loopback ports with a data dir of its own, and a
//! [`Wrapper`] driving it as its `wrapper.py` does, with the project's drop-in as the proxy.
//!
//! - [`tree`]: the snapshot unpacked (`tar -xzf`) once per test process into a scratch dir. A missing snapshot
//!   or `tar` fails the test with what is missing: never a skip, with or without `CI`.
//! - [`Agentchattr`]: `run.py --port P --mcp-http-port M --mcp-sse-port S --data-dir D --upload-dir U` in the
//!   `agentchattr` venv ([`realenv::agentchattr_py`]); its `Session token: <hex>` line read, its three ports
//!   waited for. SIGKILLed and started again on the same ports and data dir, optionally without
//!   `D/registry.json` (the tokens it issued). Its web API (history, renames) and its own `tools/list` over a
//!   raw HTTP/1.1 client.
//! - [`Wrapper`]: `tests/support/agentchattr_wrapper.py` (register, `McpIdentityProxy` from `python/`, heartbeat,
//!   re-register on 409) in the same venv; its events are JSON lines, its stderr holds the proxy's log.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::proxy_process::{drain_into, scratch_dir, BIN};
use crate::support::realenv;
use crate::support::wire::{request, RawClient, Resp};

/// The snapshot: agentchattr's source tree at a813e38 (MIT), kept beside the work tree, never copied into it.
pub const SNAPSHOT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/agentchattr/agentchattr-maxlamagna-a813e38.tar.gz");

/// agentchattr's twelve tools (`mcp_bridge.py`), as its `tools/list` names them.
pub const TOOLS: [&str; 12] = [
    "chat_send",
    "chat_read",
    "chat_resync",
    "chat_join",
    "chat_who",
    "chat_rules",
    "chat_decision",
    "chat_channels",
    "chat_set_hat",
    "chat_claim",
    "chat_summary",
    "chat_propose_job",
];

/// Bound on one start of `run.py` (it takes about 1.5 s idle, a few seconds on a loaded 2-core machine).
const START_LIMIT: Duration = Duration::from_secs(45);

/// The unpacked tree (the directory holding `run.py`), unpacked once per test process.
pub fn tree() -> &'static Path {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(unpack)
}

fn unpack() -> PathBuf {
    let snapshot = Path::new(SNAPSHOT);
    assert!(
        snapshot.is_file(),
        "agentchattr snapshot missing: {} does not exist.\n\
         The agentchattr tests run the real agentchattr server from this tarball (issue 21); it lives in\n\
         ../shared/agentchattr/ beside the work tree. These tests never skip: restore the file to run them.",
        snapshot.display()
    );
    let dir = scratch_dir("agentchattr-tree");
    let out =
        Command::new("tar").arg("-xzf").arg(snapshot).arg("-C").arg(&dir).output().unwrap_or_else(|e| {
            panic!("cannot run `tar -xzf {}` (is tar installed?): {e}", snapshot.display())
        });
    assert!(
        out.status.success(),
        "tar -xzf {} -C {} failed ({}): {}",
        snapshot.display(),
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let root = dir.join("agentchattr");
    assert!(
        root.join("run.py").is_file() && root.join("config.toml").is_file(),
        "the snapshot {} unpacked into {} has no agentchattr/run.py and config.toml",
        snapshot.display(),
        dir.display()
    );
    root
}

/// A loopback port nothing listens on, below the kernel's ephemeral range when it can be (so that neither
/// another test's `bind(0)` nor a client's source port takes it while `run.py` is down between restarts).
pub fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32768);
    if low > 12_000 {
        let span = low - 11_000;
        let _ = NEXT.compare_exchange(
            0,
            (std::process::id() % u32::from(span)) as u16,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        for _ in 0..span {
            let port = 11_000 + NEXT.fetch_add(1, Ordering::SeqCst) % span;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind a free port").port()
}

/// A running `run.py`. Killed (SIGKILL) on drop.
pub struct Agentchattr {
    child: Option<Child>,
    /// The web UI and API.
    pub web: u16,
    /// Streamable HTTP MCP (`/mcp`).
    pub http: u16,
    /// Legacy SSE MCP (`/sse`).
    pub sse: u16,
    pub data_dir: PathBuf,
    upload_dir: PathBuf,
    /// The current process's session token (a new one per process).
    pub session_token: String,
    /// stdout and stderr of every process, in order, with a line between generations.
    log: Arc<Mutex<Vec<u8>>>,
    /// 1 for the first process, +1 per restart.
    pub generation: u32,
    /// How long each start took, from spawn to all three ports answering.
    pub starts: Vec<Duration>,
}

impl Agentchattr {
    /// Start `run.py` on three free ports with a fresh data dir; wait for its session token and its ports.
    #[track_caller]
    pub fn start() -> Agentchattr {
        let scratch = scratch_dir("agentchattr-run");
        let mut ac = Agentchattr {
            child: None,
            web: free_port(),
            http: free_port(),
            sse: free_port(),
            data_dir: scratch.join("data"),
            upload_dir: scratch.join("uploads"),
            session_token: String::new(),
            log: Arc::new(Mutex::new(Vec::new())),
            generation: 0,
            starts: Vec::new(),
        };
        ac.spawn();
        ac
    }

    /// Start a process on this instance's ports and data dir (none may be running).
    #[track_caller]
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "run.py is already running");
        let python = realenv::agentchattr_py();
        self.generation += 1;
        self.log
            .lock()
            .unwrap()
            .extend_from_slice(format!("===== run.py generation {} =====\n", self.generation).as_bytes());
        let started = Instant::now();
        let mut child = Command::new(python)
            .arg("run.py")
            .args(["--port", &self.web.to_string()])
            .args(["--mcp-http-port", &self.http.to_string()])
            .args(["--mcp-sse-port", &self.sse.to_string()])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--upload-dir")
            .arg(&self.upload_dir)
            .current_dir(tree())
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start agentchattr's run.py with {}: {e}", python.display()));
        drain_into(child.stderr.take().unwrap(), self.log.clone());
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                log.lock().unwrap().extend_from_slice(format!("{line}\n").as_bytes());
                if let Some(token) = line.trim().strip_prefix("Session token: ") {
                    let _ = tx.send(token.trim().to_string());
                }
            }
        });
        self.child = Some(child);
        let token = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(token) => break token,
                Err(_) if started.elapsed() > START_LIMIT => {
                    self.fail(&format!("printed no `Session token:` line in {START_LIMIT:?}"))
                }
                Err(_) => {}
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                self.fail(&format!("exited with {status} before printing its session token"));
            }
        };
        assert!(
            token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()),
            "unexpected session token {token:?}"
        );
        self.session_token = token;
        for port in [self.http, self.sse, self.web] {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                if started.elapsed() > START_LIMIT {
                    self.fail(&format!("port {port} not answering {START_LIMIT:?} after the start"));
                }
                if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    self.child = None;
                    self.fail(&format!("exited with {status} before port {port} answered"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.starts.push(started.elapsed());
    }

    #[track_caller]
    fn fail(&mut self, why: &str) -> ! {
        self.kill();
        std::thread::sleep(Duration::from_millis(50));
        panic!(
            "agentchattr's run.py (generation {}, ports web {} mcp {} sse {}) {why}\n--- its output ---\n{}",
            self.generation,
            self.web,
            self.http,
            self.sse,
            self.log_text()
        )
    }

    /// SIGKILL the running process and reap it (its ports are free when this returns).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start again on the same ports and data dir after [`Agentchattr::kill`]; `lose_registry` removes
    /// `registry.json` first (every token it issued is forgotten: heartbeats get 409).
    #[track_caller]
    pub fn start_again(&mut self, lose_registry: bool) {
        assert!(self.child.is_none(), "start_again: run.py is still running (kill it first)");
        if lose_registry {
            let registry = self.data_dir.join("registry.json");
            std::fs::remove_file(&registry)
                .unwrap_or_else(|e| panic!("remove {} before the restart: {e}", registry.display()));
        }
        self.spawn();
    }

    /// SIGKILL, then [`Agentchattr::start_again`]; returns the time from the kill to all three ports answering.
    #[track_caller]
    pub fn restart(&mut self, lose_registry: bool) -> Duration {
        let t0 = Instant::now();
        self.kill();
        self.start_again(lose_registry);
        t0.elapsed()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// `http://127.0.0.1:<MCP port>` (streamable HTTP; the path is `/mcp`).
    pub fn mcp_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    /// `http://127.0.0.1:<SSE port>` (legacy SSE; the path is `/sse`).
    pub fn sse_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.sse)
    }

    /// Everything every process printed so far.
    pub fn log_text(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().unwrap()).into_owned()
    }

    /// One request to the web API on a new connection: (status, JSON body, or the text as a JSON string).
    #[track_caller]
    pub fn api(&self, method: &str, path: &str, fields: &[(&str, &str)], body: &[u8]) -> (u16, Value) {
        let stream = TcpStream::connect(("127.0.0.1", self.web))
            .unwrap_or_else(|e| panic!("connect to agentchattr's web port {}: {e}", self.web));
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = RawClient::new(stream);
        let host = format!("127.0.0.1:{}", self.web);
        let mut all = vec![("Connection", "close")];
        all.extend_from_slice(fields);
        c.send(&request(method, path, &host, &all, body));
        let resp = c.read_response(method);
        let text = resp.text();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (resp.status, value)
    }

    /// The history as agentchattr stored it (`GET /api/messages`, the UI's session token): newest 500.
    #[track_caller]
    pub fn messages(&self) -> Vec<Value> {
        let (status, body) =
            self.api("GET", "/api/messages?limit=500", &[("X-Session-Token", &self.session_token)], b"");
        assert_eq!(status, 200, "GET /api/messages: {status} {body}");
        body.as_array().cloned().unwrap_or_else(|| panic!("GET /api/messages: not a list: {body}"))
    }

    /// Register an agent of `base` (`claude`, `codex`, ...) as `wrapper.py:_register_instance` does: its
    /// (name, token).
    #[track_caller]
    pub fn register(&self, base: &str) -> (String, String) {
        let body = json!({"base": base, "label": null, "ready_gate": false}).to_string();
        let (status, v) =
            self.api("POST", "/api/register", &[("Content-Type", "application/json")], body.as_bytes());
        assert_eq!(status, 200, "POST /api/register: {v}");
        let field =
            |k: &str| v[k].as_str().unwrap_or_else(|| panic!("POST /api/register: no {k}: {v}")).to_string();
        (field("name"), field("token"))
    }

    /// The web UI's rename (`POST /api/label/<name> {"label": ...}` with the session token): its JSON answer
    /// (`{"ok": true, "new_name": ...}` for a new id).
    #[track_caller]
    pub fn rename(&self, name: &str, label: &str) -> Value {
        let body = json!({ "label": label }).to_string();
        let (status, answer) = self.api(
            "POST",
            &format!("/api/label/{name}"),
            &[("X-Session-Token", &self.session_token), ("Content-Type", "application/json")],
            body.as_bytes(),
        );
        assert_eq!(status, 200, "POST /api/label/{name}: {status} {answer}");
        answer
    }

    /// agentchattr's own `tools/list`, asked directly (no proxy) on one connection: initialize, initialized,
    /// list.
    #[track_caller]
    pub fn tools(&self) -> Vec<Value> {
        let stream = TcpStream::connect(("127.0.0.1", self.http)).expect("connect to agentchattr's MCP port");
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = RawClient::new(stream);
        let host = format!("127.0.0.1:{}", self.http);
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "tools-test", "version": "0"}}});
        let resp = mcp_post(&mut c, &host, None, &init);
        let session = resp.one("mcp-session-id").to_string();
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = mcp_post(&mut c, &host, Some(&session), &initialized);
        assert_eq!(resp.status, 202, "notifications/initialized: {}", resp.raw_text());
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
        let answer = answer_of(&mcp_post(&mut c, &host, Some(&session), &list));
        answer["result"]["tools"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("agentchattr's tools/list: no tools in {answer}"))
    }
}

/// One MCP POST to `/mcp` on `c`, with the session when there is one.
fn mcp_post(c: &mut RawClient, host: &str, session: Option<&str>, body: &Value) -> Resp {
    let mut fields =
        vec![("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    if let Some(s) = session {
        fields.push(("Mcp-Session-Id", s));
    }
    c.send(&request("POST", "/mcp", host, &fields, body.to_string().as_bytes()));
    c.read_response("POST")
}

/// The JSON-RPC answer in a JSON body or in an event stream's `data:` line.
fn answer_of(resp: &Resp) -> Value {
    let text = resp.text();
    let data = text.lines().find_map(|l| l.strip_prefix("data:")).unwrap_or(&text);
    serde_json::from_str(data.trim())
        .unwrap_or_else(|e| panic!("not a JSON-RPC answer ({e}): {}", resp.raw_text()))
}

impl Drop for Agentchattr {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `tests/support/agentchattr_wrapper.py`: wrapper.py's registration, proxy start, heartbeat and 409 path,
/// with `mcp_identity_proxy.McpIdentityProxy` from `python/` starting [`BIN`]. Stopped on drop (stdin
/// closed: `proxy.stop()`), killed if it does not exit.
pub struct Wrapper {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    events: Arc<Mutex<Vec<Value>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The agent's MCP URL: the proxy's URL and the upstream path.
    pub url: String,
    /// The first registration.
    pub name: String,
    pub token: String,
}

/// How the wrapper hands a re-registered identity to the proxy.
#[derive(Clone, Copy, Debug)]
pub enum On409 {
    /// `proxy.set_identity(name, token)`: one control line.
    SetIdentity,
    /// `proxy.agent_name = name; proxy.token = token`, as wrapper.py's `set_runtime_identity` does.
    Setters,
}

impl Wrapper {
    /// Start the wrapper for base `claude` in front of `ac`'s streamable HTTP (`path` "/mcp") or SSE ("/sse")
    /// MCP port, heartbeating every 0.5 s (wrapper.py: 5 s); waits for its proxy (30 s bound).
    #[track_caller]
    pub fn start(ac: &Agentchattr, path: &str, on_409: On409) -> Wrapper {
        let base = if path == "/sse" { ac.sse_base() } else { ac.mcp_base() };
        let how = match on_409 {
            On409::SetIdentity => "set_identity",
            On409::Setters => "setters",
        };
        let mut cmd = realenv::python_script(
            realenv::agentchattr_py(),
            "agentchattr_wrapper.py",
            &[
                "--server-port",
                &ac.web.to_string(),
                "--upstream-base",
                &base,
                "--path",
                path,
                "--heartbeat",
                "0.5",
                "--on-409",
                how,
            ],
        );
        let python_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
        let mut child = cmd
            .env("PYTHONPATH", python_dir)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("MCP_IDENTITY_PROXY_BIN", BIN)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "debug".to_string()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start tests/support/agentchattr_wrapper.py: {e}"));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        drain_into(child.stderr.take().unwrap(), stderr.clone());
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let event =
                    serde_json::from_str(&line).unwrap_or_else(|_| json!({"event": "stdout", "line": line}));
                sink.lock().unwrap().push(event);
            }
        });
        let stdin = child.stdin.take();
        let mut w = Wrapper {
            child: Some(child),
            stdin,
            events,
            stderr,
            url: String::new(),
            name: String::new(),
            token: String::new(),
        };
        let proxy = w.wait_for("its proxy listening", Duration::from_secs(30), |e| {
            e["event"] == "proxy" || e["event"] == "fatal"
        });
        match proxy {
            Some(p) if p["event"] == "proxy" => {
                w.url = p["url"].as_str().unwrap_or("").to_string();
                // The drop-in looks beside its interpreter first: a wheel installed into the venv would win.
                if !p["binary"].is_null() && p["binary"] != BIN {
                    w.fail(&format!("ran the binary {}, not this build's {BIN}", p["binary"]));
                }
            }
            _ => w.fail("did not start its proxy"),
        }
        let reg = w.events().into_iter().find(|e| e["event"] == "registered").unwrap_or(Value::Null);
        w.name = reg["name"].as_str().unwrap_or("").to_string();
        w.token = reg["token"].as_str().unwrap_or("").to_string();
        w
    }

    #[track_caller]
    fn fail(&mut self, why: &str) -> ! {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::thread::sleep(Duration::from_millis(50));
        panic!(
            "agentchattr wrapper {why}\n--- events ---\n{}\n--- stderr ---\n{}",
            self.events_text(),
            self.stderr_text()
        )
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Value> {
        self.events.lock().unwrap().clone()
    }

    /// The first event matching `pred` (past or future), waiting up to `limit`; None if none came.
    pub fn wait_for(&self, _what: &str, limit: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        let t0 = Instant::now();
        loop {
            if let Some(e) = self.events.lock().unwrap().iter().find(|e| pred(e)) {
                return Some(e.clone());
            }
            if t0.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The identity the wrapper holds now: the last registration, re-registration or rename.
    pub fn current(&self) -> (String, String) {
        let (mut name, mut token) = (self.name.clone(), self.token.clone());
        for e in self.events() {
            match e["event"].as_str() {
                Some("reregistered") => {
                    name = e["name"].as_str().unwrap_or("").to_string();
                    token = e["token"].as_str().unwrap_or("").to_string();
                }
                Some("renamed") => name = e["new"].as_str().unwrap_or("").to_string(),
                _ => {}
            }
        }
        (name, token)
    }

    /// The events, one JSON line each (a run of heartbeats with the same outcome folded into its first and a
    /// count).
    pub fn events_text(&self) -> String {
        let mut out = String::new();
        // A run of heartbeats with the same outcome: the first one, and how many more.
        let mut run: Option<(String, usize)> = None;
        let flush = |out: &mut String, run: &mut Option<(String, usize)>| {
            if let Some((key, n)) = run.take() {
                if n > 0 {
                    out.push_str(&format!("  ... and {n} more heartbeats: {key}\n"));
                }
            }
        };
        for e in self.events() {
            if e["event"] == "heartbeat" {
                let key = format!(
                    "status {} name {} sent as {} {}",
                    e["status"], e["name"], e["sent_as"], e["error"]
                );
                match &mut run {
                    Some((k, n)) if *k == key => *n += 1,
                    _ => {
                        flush(&mut out, &mut run);
                        out.push_str(&format!("{e}\n"));
                        run = Some((key, 0));
                    }
                }
                continue;
            }
            flush(&mut out, &mut run);
            out.push_str(&format!("{e}\n"));
        }
        flush(&mut out, &mut run);
        out
    }

    /// The wrapper's stderr: the proxy's log (inherited by the binary), and the drop-in's lines.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }
}

impl Drop for Wrapper {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        let Some(mut child) = self.child.take() else { return };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

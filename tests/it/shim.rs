//! agentchattr drop-in: the `mcp_identity_proxy` package (`python/`) drives the real
//! binary the way agentchattr's wrapper drives its Python proxy (start on
//! port 0, read the port, rename, rotate the token, both at once, stop; a
//! fixed port that is taken makes `start()` return False). Runs with the
//! system `python3` and its standard library only, against a std::net stub
//! upstream that records the stamped sender and the token it received.

use crate::support::proxy_process::BIN;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the stub upstream saw on one request.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SeenRequest {
    method: String,
    path: String,
    sender: Option<String>,
    authorization: Option<String>,
    x_agent_token: Option<String>,
}

/// A keep-alive HTTP/1.1 upstream that answers every request with what it
/// saw, as a JSON-RPC result.
fn stub_upstream() -> (SocketAddr, Arc<Mutex<Vec<SeenRequest>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind stub upstream");
    let addr = listener.local_addr().expect("stub address");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let log = log.clone();
            std::thread::spawn(move || serve(stream, &log));
        }
    });
    (addr, seen)
}

fn serve(stream: TcpStream, log: &Mutex<Vec<SeenRequest>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(read_half) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    loop {
        let mut start = String::new();
        if reader.read_line(&mut start).unwrap_or(0) == 0 {
            return;
        }
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((n, v)) = line.split_once(':') {
                headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        let len: usize = header("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut parts = start.split_whitespace();
        let seen = SeenRequest {
            method: parts.next().unwrap_or("").to_string(),
            path: parts.next().unwrap_or("").to_string(),
            sender: body.pointer("/params/arguments/sender").and_then(Value::as_str).map(String::from),
            authorization: header("authorization"),
            x_agent_token: header("x-agent-token"),
        };
        log.lock().unwrap().push(seen.clone());
        let reply = json!({"jsonrpc": "2.0", "id": body.get("id").cloned().unwrap_or(Value::Null),
            "result": {"sender": seen.sender, "authorization": seen.authorization,
                       "x_agent_token": seen.x_agent_token}})
        .to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: s1\r\ncontent-length: {}\r\n\r\n",
            reply.len()
        );
        if writer.write_all(head.as_bytes()).and_then(|_| writer.write_all(reply.as_bytes())).is_err() {
            return;
        }
    }
}

/// agentchattr-style calls through the shim; one JSON object per line on
/// stdout (the shim also prints the binary's port lines, as agentchattr does).
const DRIVER: &str = r#"
import json, os, urllib.request
from mcp_identity_proxy import McpIdentityProxy

def out(**kw):
    print(json.dumps(kw), flush=True)

def call(proxy, sender):
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "chat_send", "arguments": {"sender": sender, "message": "hi"}}}).encode()
    req = urllib.request.Request(proxy.url + "/mcp", data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "Authorization": "Bearer not-the-agents"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, json.loads(r.read())["result"]

base = os.environ["UPSTREAM_BASE"]
proxy = McpIdentityProxy(base, "/mcp", "claude-prime", "tok-one")
out(event="before", port=proxy.port)
ok = proxy.start()
cmdline = open(f"/proc/{proxy._proc.pid}/cmdline", "rb").read().split(b"\0")
out(event="started", ok=ok, port=proxy.port, url=proxy.url,
    argv=[a.decode() for a in cmdline if a])
status, seen = call(proxy, "mallory")
out(event="call", status=status, seen=seen)
proxy.agent_name = "claude-prime-2"
proxy.token = "tok-two"
out(event="renamed", agent=proxy.agent_name)
status, seen = call(proxy, "mallory")
out(event="call", status=status, seen=seen)
proxy.set_identity("claude-prime-3", "tok-three")
status, seen = call(proxy, "mallory")
out(event="call", status=status, seen=seen)
proxy.stop()
out(event="stopped", returncode=proxy.returncode, port=proxy.port)

taken = McpIdentityProxy(base, "/mcp", "claude-prime", "tok-one", port=int(os.environ["TAKEN_PORT"]))
out(event="taken", ok=taken.start(), returncode=taken.returncode, port=taken.port)
"#;

#[test]
fn agentchattr_shim_start_rename_rotate_stop_and_taken_port() {
    let (upstream, seen) = stub_upstream();
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind the port to take");
    let taken_port = taken.local_addr().expect("taken port").port();
    let support = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(DRIVER)
        .env("PYTHONPATH", support)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("MCP_IDENTITY_PROXY_BIN", BIN)
        .env("UPSTREAM_BASE", format!("http://{upstream}"))
        .env("TAKEN_PORT", taken_port.to_string())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3 (the agentchattr shim test needs the system python3)");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for python3") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the shim driver did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    let _ = child.stdout.take().map(|mut s| s.read_to_string(&mut stdout));
    let _ = child.stderr.take().map(|mut s| s.read_to_string(&mut stderr));
    assert!(status.success(), "python3 driver failed ({status}):\n{stdout}\nstderr:\n{stderr}");
    drop(taken);

    let events: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("event"))
        .collect();
    let port_lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("  MCP proxy: port ")).collect();
    let event = |name: &str, nth: usize| -> &Value {
        events.iter().filter(|e| e["event"] == name).nth(nth).unwrap_or_else(|| panic!("no {name} #{nth}"))
    };

    // Before start: port 0. start() on port 0: True, the OS-chosen port,
    // the binary's port line echoed verbatim, the token not in argv.
    assert_eq!(event("before", 0)["port"], 0);
    let started = event("started", 0);
    assert_eq!(started["ok"], true);
    let port = started["port"].as_u64().expect("port");
    assert!(port > 0);
    assert_eq!(started["url"], format!("http://127.0.0.1:{port}"));
    assert_eq!(port_lines.first().copied(), Some(format!("  MCP proxy: port {port}").as_str()));
    let argv: Vec<&str> =
        started["argv"].as_array().expect("argv").iter().filter_map(Value::as_str).collect();
    assert_eq!(
        &argv[1..],
        ["--upstream", &format!("http://{upstream}/mcp"), "--control-stdin", "--agent", "claude-prime"]
    );
    assert!(!argv.iter().any(|a| a.contains("tok-one")), "the token must not be in argv");

    // The first call carries the first identity, the second the new one.
    let call1 = event("call", 0);
    assert_eq!(call1["status"], 200);
    assert_eq!(
        call1["seen"],
        json!({"sender": "claude-prime", "authorization": "Bearer tok-one", "x_agent_token": "tok-one"})
    );
    assert_eq!(event("renamed", 0)["agent"], "claude-prime-2");
    let call2 = event("call", 1);
    assert_eq!(
        call2["seen"],
        json!({"sender": "claude-prime-2", "authorization": "Bearer tok-two", "x_agent_token": "tok-two"})
    );
    // set_identity(): name and token in one control line.
    assert_eq!(
        event("call", 2)["seen"],
        json!({"sender": "claude-prime-3", "authorization": "Bearer tok-three", "x_agent_token": "tok-three"})
    );
    let recorded = seen.lock().unwrap().clone();
    let calls: Vec<(&str, Option<&str>, Option<&str>)> =
        recorded.iter().map(|s| (s.path.as_str(), s.sender.as_deref(), s.authorization.as_deref())).collect();
    assert_eq!(
        calls,
        [
            ("/mcp", Some("claude-prime"), Some("Bearer tok-one")),
            ("/mcp", Some("claude-prime-2"), Some("Bearer tok-two")),
            ("/mcp", Some("claude-prime-3"), Some("Bearer tok-three")),
        ]
    );
    assert!(recorded.iter().all(|s| s.method == "POST"));

    // stop(): stdin closed, the child exits 0 by itself, port back to 0.
    let stopped = event("stopped", 0);
    assert_eq!(stopped["returncode"], 0, "stderr:\n{stderr}");
    assert_eq!(stopped["port"], 0);
    assert!(stderr.contains("control stdin closed"), "the proxy stopped at stdin EOF:\n{stderr}");

    // A fixed port already in use: False, agentchattr's line, exit 3.
    let t = event("taken", 0);
    assert_eq!(t["ok"], false);
    assert_eq!(t["returncode"], 3);
    assert_eq!(t["port"], 0);
    assert!(
        port_lines.contains(
            &format!("  MCP proxy: port {taken_port} in use (shared with another instance)").as_str()
        ),
        "{stdout}"
    );
}

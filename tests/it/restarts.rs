//! The upstream restarts under a live MCP session: a request in a session
//! the proxy saw created waits `--restart-grace` for the upstream to come
//! back, then gets an answer the session survives (200 with a JSON-RPC
//! error carrying its id; 202 for notifications; 502 for GET and DELETE).
//! Outside a recorded session an unreachable upstream is 502, with the
//! request's id in the body.

use std::io::Write;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::exchange::{client, host};
use crate::support::proxy_process::ProxyProcess;
use crate::support::restarting::RestartingUpstream;
use crate::support::wire::{request, Next, Resp};

const TOKEN: &str = "tok-RESTART-1";
const SESSION: &str = "sess-restart-1";

/// An MCP-ish upstream that can be stopped and restarted on the same port:
/// `initialize` gets a session id; every other request an echo of its id.
fn restarting_upstream() -> RestartingUpstream {
    RestartingUpstream::start(|req, s, _| {
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let (status, extra, body) = match (req.method.as_str(), v["method"].as_str()) {
            ("POST", Some("initialize")) => (
                "200 OK",
                format!("Mcp-Session-Id: {SESSION}\r\n"),
                json!({"jsonrpc":"2.0","id":v["id"],"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"stub","version":"1"}}}).to_string(),
            ),
            ("POST", _) if v.get("id").is_none() => ("202 Accepted", String::new(), String::new()),
            _ => ("200 OK", String::new(), json!({"jsonrpc":"2.0","id":v["id"],"result":{"served":true}}).to_string()),
        };
        let resp = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        match s.write_all(resp.as_bytes()) {
            Ok(()) => Next::KeepAlive,
            Err(_) => Next::Close,
        }
    })
}

#[track_caller]
fn call(p: &ProxyProcess, method: &str, session: Option<&str>, body: &[u8]) -> (Resp, Duration) {
    let mut fields =
        vec![("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    if let Some(s) = session {
        fields.push(("Mcp-Session-Id", s));
    }
    let t0 = Instant::now();
    let mut c = client(p);
    c.send(&request(method, "/mcp", &host(p), &fields, body));
    let resp = c.read_response(method);
    (resp, t0.elapsed())
}

fn json_of(resp: &Resp) -> Value {
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", resp.raw_text()))
}

#[track_caller]
fn initialize(p: &ProxyProcess) {
    let (resp, _) = call(p, "POST", None, br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#);
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(resp.one("mcp-session-id"), SESSION);
}

const TOOL_CALL_42: &[u8] =
    br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"chat_read","arguments":{}}}"#;

#[test]
fn call_in_a_recorded_session_while_the_upstream_is_down_gets_200_with_its_id_after_the_grace() {
    let mut up = restarting_upstream();
    let p = ProxyProcess::builder(up.url()).agent("a").token(TOKEN).arg("--restart-grace", "1").start();
    initialize(&p);
    up.stop();

    let (resp, took) = call(&p, "POST", Some(SESSION), TOOL_CALL_42);
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    let v = json_of(&resp);
    assert_eq!(v["id"], 42, "{v}");
    assert_eq!(v["error"]["code"], -32000, "{v}");
    assert!(v.get("result").is_none(), "{v}");
    assert!(took >= Duration::from_millis(800) && took < Duration::from_secs(2), "answered after {took:?}");

    // A batch: one error per request, each with its id; the notification none.
    let batch = br#"[{"jsonrpc":"2.0","id":5,"method":"tools/list"},{"jsonrpc":"2.0","method":"notifications/progress"},{"jsonrpc":"2.0","id":"x-7","method":"ping"}]"#;
    let (resp, _) = call(&p, "POST", Some(SESSION), batch);
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    let v = json_of(&resp);
    let ids: Vec<Value> =
        v.as_array().expect("an array for a batch").iter().map(|e| e["id"].clone()).collect();
    assert_eq!(ids, [json!(5), json!("x-7")], "{v}");

    // A notification is accepted (and dropped); Python SDK 1.x would die on a 5xx.
    let (resp, _) =
        call(&p, "POST", Some(SESSION), br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    assert_eq!(resp.status, 202, "{:?}", resp.raw_text());
    assert!(resp.body.is_empty());

    // GET (the stream) is 502, never 404: the session is not declared gone.
    let (resp, _) = call(&p, "GET", Some(SESSION), b"");
    assert_eq!(resp.status, 502, "{:?}", resp.raw_text());

    // Back up: the next call in the session is served.
    up.restart();
    let (resp, _) = call(&p, "POST", Some(SESSION), TOOL_CALL_42);
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(json_of(&resp)["result"]["served"], true);
}

#[test]
fn upstream_back_within_the_grace_is_invisible_to_the_call() {
    let mut up = restarting_upstream();
    let p = ProxyProcess::builder(up.url()).agent("a").token(TOKEN).arg("--restart-grace", "4").start();
    initialize(&p);
    up.stop();
    let port = up.port;
    let restarter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1200));
        TcpListener::bind(("127.0.0.1", port)).expect("rebind")
    });
    let t0 = Instant::now();
    let mut c = client(&p);
    let fields = [("Content-Type", "application/json"), ("Mcp-Session-Id", SESSION)];
    c.send(&request("POST", "/mcp", &host(&p), &fields, TOOL_CALL_42));
    let listener = restarter.join().unwrap();
    up.serve(listener);
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(json_of(&resp)["result"]["served"], true, "{:?}", resp.raw_text());
    assert!(t0.elapsed() < Duration::from_secs(4), "took {:?}", t0.elapsed());
}

#[test]
fn unreachable_upstream_outside_a_recorded_session_gets_502_with_the_id() {
    let mut up = restarting_upstream();
    let p = ProxyProcess::builder(up.url()).agent("a").token(TOKEN).arg("--restart-grace", "5").start();
    up.stop();
    // A session id the proxy never saw created: no grace, today's quick 502.
    let (resp, took) = call(&p, "POST", Some("never-recorded"), TOOL_CALL_42);
    assert_eq!(resp.status, 502, "{:?}", resp.raw_text());
    assert_eq!(json_of(&resp)["id"], 42);
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn a_deleted_session_is_forgotten_and_gets_no_grace() {
    let mut up = restarting_upstream();
    let p = ProxyProcess::builder(up.url()).agent("a").token(TOKEN).arg("--restart-grace", "5").start();
    initialize(&p);
    let (resp, _) = call(&p, "DELETE", Some(SESSION), b"");
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    up.stop();
    let (resp, took) = call(&p, "POST", Some(SESSION), TOOL_CALL_42);
    assert_eq!(resp.status, 502, "{:?}", resp.raw_text());
    assert_eq!(json_of(&resp)["id"], 42);
    assert!(took < Duration::from_secs(3), "a forgotten session waited {took:?}");
}

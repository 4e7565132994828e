//! `--stdio`: the host spawns the proxy and speaks JSON-RPC on its stdin and
//! stdout, one message per line (`StdioProxy`). Each test asserts what the
//! host reads on stdout, every line of which must be JSON-RPC, and what the
//! upstream received.
//!
//! - `contract`: stdout carries JSON-RPC only, parse errors, usage errors,
//!   metrics beside `--stdio`, the end of the session (stdin's EOF, SIGTERM).
//! - `guarantees`: what the HTTP front-end guarantees, over stdio: credentials,
//!   stamping, fail closed, tool policy, audit records.
//! - `upstreams`: stand-ins for what a real server cannot be made to do (SSE
//!   forms, server-to-client requests, batches, concurrency, cancellation,
//!   404s, an unreachable upstream, foreign error ids, legacy SSE and its
//!   fallback).
//! - `faults`: a host that floods stdin, ids JSON-RPC does not allow, an
//!   upstream that stalls under each timeout, a legacy server that cannot
//!   start, a `ping` behind held calls.
//! - `backpressure`: a host that stops reading stdout while the upstream
//!   streams 50 MB.
//! - `real_hosts`: the Python and TypeScript SDKs' stdio clients against the
//!   real agentchattr, across SIGKILL restarts of its `run.py`.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::proxy_process::ProxyProcess;
use crate::support::setup::{AGENT, INITIALIZE, INITIALIZED, SESSION, TOKEN};
use crate::support::stdio_proxy::StdioProxy;
use crate::support::wire::{response, Next, Req, StubUpstream};

#[cfg(target_os = "linux")]
mod backpressure;
mod contract;
mod faults;
mod guarantees;
#[cfg(unix)]
mod real_hosts;
mod upstreams;

/// Bound on any one answer the tests wait for.
const ANSWER: Duration = Duration::from_secs(10);

/// The protocol version the stand-in's `initialize` answers with.
const VERSION: &str = "2025-11-25";

/// A test's own answers, tried before the stand-in's (see `mcp_upstream`).
type Special = dyn Fn(&Req, &Value, &mut TcpStream) -> Option<Next> + Send + Sync;

/// A streamable HTTP MCP stand-in: `special` answers first (Some: it wrote
/// the answer); otherwise `initialize` gets `SESSION` and `VERSION`,
/// notifications and the host's answers 202, `tools/list` three tools with a
/// `sender` (chat_send, chat_read, secret_tool), any other request an echo
/// `{"method", "arguments"}` as a text-free result, a batch one answer per
/// request, GET 405, DELETE 200.
fn mcp_upstream(
    special: impl Fn(&Req, &Value, &mut TcpStream) -> Option<Next> + Send + Sync + 'static,
) -> StubUpstream {
    let special: Box<Special> = Box::new(special);
    StubUpstream::start(move |req, s| {
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        if let Some(next) = special(req, &v, s) {
            return next;
        }
        let _ = s.write_all(&default_answer(req, &v));
        Next::KeepAlive
    })
}

/// The stand-in with nothing special.
fn plain_upstream() -> StubUpstream {
    mcp_upstream(|_, _, _| None)
}

fn json_response(status: &str, extra: &[(&str, &str)], body: &Value) -> Vec<u8> {
    let mut fields = vec![("Content-Type", "application/json")];
    fields.extend_from_slice(extra);
    response(status, &fields, body.to_string().as_bytes())
}

/// The answer to one request message (`None` for a notification or response).
fn answer_of(m: &Value) -> Option<Value> {
    let id = m.get("id")?;
    let method = m["method"].as_str()?;
    let result = match method {
        "initialize" => json!({
            "protocolVersion": VERSION,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "stand-in", "version": "1"}
        }),
        "tools/list" => json!({"tools": [
            tool("chat_send"),
            tool("chat_read"),
            tool("secret_tool"),
        ]}),
        _ => json!({
            "content": [],
            "method": method,
            "arguments": m["params"]["arguments"],
        }),
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn tool(name: &str) -> Value {
    json!({"name": name, "inputSchema": {"type": "object", "properties": {
        "sender": {"type": "string"}, "message": {"type": "string"}
    }}})
}

fn default_answer(req: &Req, v: &Value) -> Vec<u8> {
    match req.method.as_str() {
        "GET" => return response("405 Method Not Allowed", &[], b""),
        "DELETE" => return response("200 OK", &[], b""),
        _ => {}
    }
    let session: &[(&str, &str)] = match v["method"] == "initialize" {
        true => &[("Mcp-Session-Id", SESSION)],
        false => &[],
    };
    let answer = match v {
        Value::Array(batch) => {
            let answers: Vec<Value> = batch.iter().filter_map(answer_of).collect();
            (!answers.is_empty()).then_some(Value::Array(answers))
        }
        v => answer_of(v),
    };
    match answer {
        Some(a) => json_response("200 OK", session, &a),
        None => response("202 Accepted", &[], b""),
    }
}

/// The proxy with `--stdio`, the usual agent and token, and `extra`, in
/// front of `url`.
fn start(url: &str, extra: &[&str]) -> StdioProxy {
    ProxyProcess::builder(url).agent(AGENT).token(TOKEN).args(extra).start_stdio()
}

/// `initialize` (id 1) and `notifications/initialized`; the answer.
#[track_caller]
fn handshake(p: &mut StdioProxy) -> Value {
    p.send(INITIALIZE);
    let answer = p.answer_to(&json!(1), ANSWER);
    assert_eq!(answer["result"]["protocolVersion"], VERSION, "initialize: {answer}");
    p.send(INITIALIZED);
    answer
}

/// A `tools/call` of `tool` with `arguments`, id `id`.
fn tool_call(id: Value, tool: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}})
}

/// The JSON bodies the upstream received as POSTs, parsed.
fn posted(up: &StubUpstream) -> Vec<Value> {
    up.requests()
        .iter()
        .filter(|r| r.method == "POST")
        .map(|r| serde_json::from_slice(&r.body).unwrap_or(Value::Null))
        .collect()
}

/// The requests to `tool` the upstream received.
fn calls_of(up: &StubUpstream, tool: &str) -> Vec<Value> {
    posted(up).into_iter().filter(|v| v["method"] == "tools/call" && v["params"]["name"] == tool).collect()
}

/// A JSON-RPC error answer with `id`; its code.
#[track_caller]
fn error_code(answer: &Value, id: &Value) -> i64 {
    assert_eq!(&answer["id"], id, "{answer}");
    assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
    assert!(answer["error"]["message"].is_string(), "not an error: {answer}");
    answer["error"]["code"].as_i64().unwrap_or_else(|| panic!("error without a code: {answer}"))
}

/// The stand-in where a `tools/call` of `slow` is answered after its
/// `arguments.ms` milliseconds.
fn slow_upstream() -> StubUpstream {
    mcp_upstream(|_, v, s| {
        if v["method"] != "tools/call" || v["params"]["name"] != "slow" {
            return None;
        }
        let ms = v["params"]["arguments"]["ms"].as_u64().unwrap_or(0);
        std::thread::sleep(Duration::from_millis(ms));
        let answer = answer_of(v).unwrap_or(Value::Null);
        let _ = s.write_all(&json_response("200 OK", &[], &answer));
        Some(Next::KeepAlive)
    })
}

/// The DELETE the upstream received (waits up to `limit`), checked to name
/// the session.
#[track_caller]
fn deleted(up: &StubUpstream, limit: Duration) -> Req {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(d) = up.requests().into_iter().find(|r| r.method == "DELETE") {
            assert_eq!(d.head.all("mcp-session-id"), [SESSION], "{}", d.raw_text());
            return d;
        }
        assert!(t0.elapsed() < limit, "no DELETE upstream in {limit:?}: {:#?}", up.requests());
        std::thread::sleep(Duration::from_millis(10));
    }
}

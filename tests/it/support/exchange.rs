//! Helpers shared by the raw-wire suites (sessions, forwarding, framing,
//! streaming, upstream_failures, hostile, ...): one request on a new
//! connection, the usual JSON-RPC POST, a healthy-request check and the shape
//! of a proxy-made error.

use std::time::{Duration, Instant};

use crate::support::proxy_process::ProxyProcess;
use crate::support::wire::{request, response, RawClient, Resp, StubUpstream};

pub const PING: &[u8] = br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;
pub const OK_JSON: &[u8] = br#"{"jsonrpc":"2.0","id":7,"result":{}}"#;

/// The Host a well-behaved client sends to this proxy.
pub fn host(p: &ProxyProcess) -> String {
    format!("127.0.0.1:{}", p.port)
}

pub fn client(p: &ProxyProcess) -> RawClient {
    RawClient::new(p.connect())
}

/// One request on a new connection, one response (the method is read from
/// the request line, which may be followed by anything).
#[track_caller]
pub fn exchange(p: &ProxyProcess, bytes: &[u8]) -> Resp {
    let method = std::str::from_utf8(&bytes[..bytes.len().min(16)])
        .unwrap_or("")
        .split(' ')
        .next()
        .unwrap_or("")
        .to_string();
    let mut c = client(p);
    c.send(bytes);
    c.read_response(&method)
}

/// A JSON-RPC POST to `/mcp` with the usual client fields plus `extra`.
pub fn json_post(host: &str, extra: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut fields =
        vec![("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    fields.extend_from_slice(extra);
    request("POST", "/mcp", host, &fields, body)
}

pub fn ok_response() -> Vec<u8> {
    response("200 OK", &[("Content-Type", "application/json")], OK_JSON)
}

/// An upstream answering every request with 200 and `OK_JSON`.
pub fn ok_upstream() -> StubUpstream {
    StubUpstream::fixed(ok_response())
}

/// After a hostile exchange: a well-formed request on a new connection is
/// relayed and answered within 5 s.
#[track_caller]
pub fn assert_healthy(p: &ProxyProcess, up: &StubUpstream) {
    let before = up.request_count();
    let t0 = Instant::now();
    let resp = exchange(p, &json_post(&host(p), &[], PING));
    assert_eq!(resp.status, 200, "healthy request after a hostile one failed: {:?}", resp.raw_text());
    assert_eq!(resp.body, OK_JSON, "{:?}", resp.raw_text());
    assert_eq!(up.request_count(), before + 1);
    assert!(t0.elapsed() < Duration::from_secs(5), "healthy request took {:?}", t0.elapsed());
}

/// A proxy-generated error: `status`, `content-type: application/json`, a
/// JSON-RPC error body with an `id` member (JSON-RPC 2.0 §5: the request's
/// id, null when it cannot be read).
#[track_caller]
pub fn assert_jsonrpc_error(resp: &Resp, status: u16) {
    assert_eq!(resp.status, status, "response: {:?}", resp.raw_text());
    let ct = resp.one("content-type");
    assert!(ct.starts_with("application/json"), "content-type {ct:?} in {:?}", resp.raw_text());
    let v: serde_json::Value = serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {:?}", resp.raw_text()));
    assert_eq!(v["jsonrpc"], "2.0", "body {v}");
    assert!(v.get("id").is_some(), "proxy error body has no id member: {v}");
    assert!(v["error"]["code"].is_i64(), "error.code not an integer: {v}");
    assert!(v["error"]["message"].is_string(), "error.message not a string: {v}");
}

/// The head of a chunked JSON POST to `/mcp`; the chunks follow.
pub fn chunked_post_head(p: &ProxyProcess) -> Vec<u8> {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        host(p)
    )
    .into_bytes()
}

/// One chunk of a chunked body.
pub fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

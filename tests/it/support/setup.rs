//! The usual setup of the raw-wire behaviour suites (sessions, forwarding,
//! framing, streaming, upstream failures): the proxy binary in front of a
//! `StubUpstream` with one token and agent, the MCP messages they exchange,
//! and the checks they share.

use std::net::TcpListener;

use crate::support::exchange::{host, json_post};
use crate::support::proxy_process::ProxyProcess;
use crate::support::wire::{Head, Req, StubUpstream};

pub const TOKEN: &str = "tok-7f3a9c-SECRET-d41d8";
pub const AGENT: &str = "claude-prime";
pub const SESSION: &str = "a1B2-c3_D4.e5~f6!7$8";

pub const INITIALIZE: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"it","version":"1"}}}"#;
pub const INIT_RESULT: &[u8] = br#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"stub","version":"1"}}}"#;
pub const INITIALIZED: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
pub const TOOLS_LIST: &[u8] = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
pub const TOOLS_RESULT: &[u8] =
    br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"chat_send","inputSchema":{"type":"object"}}]}}"#;

// ---------------------------------------------------------------- helpers

#[track_caller]
pub fn start(up: &StubUpstream) -> ProxyProcess {
    start_with(up, &[])
}

#[track_caller]
pub fn start_with(up: &StubUpstream, extra: &[&str]) -> ProxyProcess {
    start_url(&up.url(), extra)
}

/// The proxy with the usual identity in front of `url` (an upstream that
/// is not a `StubUpstream`, or not there at all).
#[track_caller]
pub fn start_url(url: &str, extra: &[&str]) -> ProxyProcess {
    ProxyProcess::builder(url).agent(AGENT).token(TOKEN).args(extra).start()
}

/// A JSON-RPC POST to `/mcp` with the usual client fields plus `extra`.
pub fn post(p: &ProxyProcess, extra: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    json_post(&host(p), extra, body)
}

#[track_caller]
pub fn assert_lowercase_names(head: &Head, side: &str) {
    for (n, _) in &head.fields {
        assert_eq!(n, &n.to_ascii_lowercase(), "{side} field name {n:?} not lowercase in {:#?}", head.fields);
    }
}

/// The credential fields the upstream must see on every request.
#[track_caller]
pub fn assert_credentials(req: &Req) {
    assert_eq!(req.head.all("authorization"), vec![format!("Bearer {TOKEN}")], "{}", req.raw_text());
    assert_eq!(req.head.all("x-agent-token"), vec![TOKEN], "{}", req.raw_text());
}

/// A free loopback port with nothing listening on it.
pub fn dead_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

pub const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache, no-transform\r\nTransfer-Encoding: chunked\r\n\r\n";

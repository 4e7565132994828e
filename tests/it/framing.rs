//! The Core issue's integration tests: the real binary between a raw-byte
//! client and a scripted std::net upstream. See issue 2, PROTOCOL.md R1-R18,
//! R24, R29-R37.

use std::io::Write;
use std::net::{Shutdown, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::exchange::{
    assert_healthy, assert_jsonrpc_error, chunk, client, exchange, host, json_post, ok_upstream, OK_JSON,
    PING,
};
use crate::support::proxy_process::{token_file, ProxyProcess};
use crate::support::wire::{contains, request, response, Head, Next, RawClient, Req, Resp, StubUpstream};

const TOKEN: &str = "tok-7f3a9c-SECRET-d41d8";
const AGENT: &str = "claude-prime";
const SESSION: &str = "a1B2-c3_D4.e5~f6!7$8";

const INITIALIZE: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"it","version":"1"}}}"#;
const INIT_RESULT: &[u8] = br#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"stub","version":"1"}}}"#;
const INITIALIZED: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
const TOOLS_LIST: &[u8] = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
const TOOLS_RESULT: &[u8] =
    br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"chat_send","inputSchema":{"type":"object"}}]}}"#;

// ---------------------------------------------------------------- helpers

#[track_caller]
fn start(up: &StubUpstream) -> ProxyProcess {
    start_with(up, &[])
}

#[track_caller]
fn start_with(up: &StubUpstream, extra: &[&str]) -> ProxyProcess {
    let tf = token_file(TOKEN);
    let url = up.url();
    let mut args = vec!["--upstream", url.as_str(), "--agent", AGENT, "--token-file", tf.to_str().unwrap()];
    args.extend_from_slice(extra);
    ProxyProcess::start(&args, &[])
}

/// A JSON-RPC POST to `/mcp` with the usual client fields plus `extra`.
fn post(p: &ProxyProcess, extra: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    json_post(&host(p), extra, body)
}

#[track_caller]
fn assert_lowercase_names(head: &Head, side: &str) {
    for (n, _) in &head.fields {
        assert_eq!(n, &n.to_ascii_lowercase(), "{side} field name {n:?} not lowercase in {:#?}", head.fields);
    }
}

/// The credential fields the upstream must see on every request.
#[track_caller]
fn assert_credentials(req: &Req) {
    assert_eq!(req.head.all("authorization"), vec![format!("Bearer {TOKEN}")], "{}", req.raw_text());
    assert_eq!(req.head.all("x-agent-token"), vec![TOKEN], "{}", req.raw_text());
}

/// A free loopback port with nothing listening on it.
fn dead_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

// ------------------------------------------- agentchattr regression cases
// See: PROTOCOL.md §3.4, maxlamagna/agentchattr 60fdb98 tests/test_mcp_proxy.py

/// Initialize through a proxy whose upstream answers with `session_lines`.
fn initialize_with_upstream_session_lines(session_lines: &[(&str, &str)]) -> (Resp, Req) {
    let mut fields = vec![("Content-Type", "application/json")];
    fields.extend_from_slice(session_lines);
    let up = StubUpstream::fixed(response("200 OK", &fields, INIT_RESULT));
    let p = start(&up);
    let resp = exchange(&p, &post(&p, &[], INITIALIZE));
    (resp, up.only_request())
}

#[track_caller]
fn assert_one_session_line(resp: &Resp) {
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(
        resp.all("mcp-session-id"),
        vec![SESSION],
        "want exactly one case-insensitive session line with the upstream value: {:?}",
        resp.raw_text()
    );
    assert_eq!(resp.body, INIT_RESULT);
}

#[test]
fn initialize_response_has_one_session_header_when_upstream_sends_mixed_case() {
    let (resp, req) = initialize_with_upstream_session_lines(&[("Mcp-Session-Id", SESSION)]);
    assert_one_session_line(&resp);
    // R4: the initialize reaches the upstream without a session header.
    assert!(!req.head.has("mcp-session-id"), "proxy injected a session id: {}", req.raw_text());
    assert_eq!(req.body, INITIALIZE);
}

#[test]
fn initialize_response_has_one_session_header_when_upstream_sends_lowercase() {
    let (resp, _) = initialize_with_upstream_session_lines(&[("mcp-session-id", SESSION)]);
    assert_one_session_line(&resp);
}

#[test]
fn initialize_response_has_one_session_header_when_upstream_sends_uppercase() {
    let (resp, _) = initialize_with_upstream_session_lines(&[("MCP-SESSION-ID", SESSION)]);
    assert_one_session_line(&resp);
}

#[test]
fn initialize_response_has_one_session_header_when_upstream_repeats_it_in_different_case() {
    let (resp, _) =
        initialize_with_upstream_session_lines(&[("Mcp-Session-Id", SESSION), ("mcp-session-id", SESSION)]);
    assert_one_session_line(&resp);
}

#[test]
fn initialize_response_is_502_when_upstream_sends_two_different_session_ids() {
    let (resp, _) =
        initialize_with_upstream_session_lines(&[("Mcp-Session-Id", "aaa"), ("mcp-session-id", "bbb")]);
    assert_jsonrpc_error(&resp, 502);
    assert!(!resp.has("mcp-session-id"), "a conflicting session id leaked: {:?}", resp.raw_text());
}

#[test]
fn follow_up_post_reaches_upstream_with_exactly_one_session_header() {
    let up = ok_upstream();
    let p = start(&up);
    let resp =
        exchange(&p, &post(&p, &[("Mcp-Session-Id", SESSION), ("MCP-Protocol-Version", "2025-11-25")], PING));
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    let req = up.only_request();
    assert_eq!(req.head.all("mcp-session-id"), vec![SESSION], "{}", req.raw_text());
    assert_eq!(req.body, PING);
}

#[test]
fn delete_success_is_relayed_with_body_and_session_header() {
    let body = br#"{"deleted":true}"#;
    let up = StubUpstream::fixed(response(
        "200 OK",
        &[("Content-Type", "application/json"), ("Mcp-Session-Id", SESSION)],
        body,
    ));
    let p = start(&up);
    let resp = exchange(
        &p,
        &request(
            "DELETE",
            "/mcp",
            &host(&p),
            &[("Mcp-Session-Id", SESSION), ("Authorization", "Bearer OLD"), ("Accept", "*/*")],
            b"",
        ),
    );
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(resp.body, body);
    assert_eq!(resp.all("mcp-session-id"), vec![SESSION], "{:?}", resp.raw_text());
    assert!(resp.one("content-type").starts_with("application/json"));
    let req = up.only_request();
    assert_eq!(req.method, "DELETE");
    assert_eq!(req.head.all("mcp-session-id"), vec![SESSION]);
    assert_credentials(&req);
}

#[test]
fn delete_404_is_relayed_with_its_body() {
    let body =
        br#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}}"#;
    let up = StubUpstream::fixed(response("404 Not Found", &[("Content-Type", "application/json")], body));
    let p = start(&up);
    let resp = exchange(&p, &request("DELETE", "/mcp", &host(&p), &[("Mcp-Session-Id", SESSION)], b""));
    assert_eq!(resp.status, 404, "{:?}", resp.raw_text());
    assert_eq!(resp.body, body, "{:?}", resp.raw_text());
    assert!(resp.one("content-type").starts_with("application/json"));
    assert_eq!(up.only_request().method, "DELETE");
}

#[test]
fn initialize_initialized_tools_list_lifecycle_works_on_one_connection() {
    let up = StubUpstream::start(|req, s| {
        let body = String::from_utf8_lossy(&req.body);
        let out = if body.contains(r#""method":"initialize""#) {
            response(
                "200 OK",
                &[("Content-Type", "application/json"), ("Mcp-Session-Id", SESSION)],
                INIT_RESULT,
            )
        } else if body.contains("notifications/initialized") {
            b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n".to_vec()
        } else if body.contains("tools/list") {
            let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache, no-transform\r\nMcp-Session-Id: "
                .to_vec();
            out.extend_from_slice(SESSION.as_bytes());
            out.extend_from_slice(b"\r\nTransfer-Encoding: chunked\r\n\r\n");
            let mut event = b"event: message\r\ndata: ".to_vec();
            event.extend_from_slice(TOOLS_RESULT);
            event.extend_from_slice(b"\r\n\r\n");
            out.extend(chunk(&event));
            out.extend_from_slice(b"0\r\n\r\n");
            out
        } else {
            response("400 Bad Request", &[], b"unexpected")
        };
        let _ = s.write_all(&out);
        Next::KeepAlive
    });
    let p = start(&up);
    let mut c = client(&p);

    c.send(&post(&p, &[], INITIALIZE));
    let init = c.read_response("POST");
    assert_eq!(init.status, 200, "{:?}", init.raw_text());
    assert_eq!(init.all("mcp-session-id"), vec![SESSION]);
    assert_eq!(init.body, INIT_RESULT);

    let session = [("Mcp-Session-Id", SESSION), ("MCP-Protocol-Version", "2025-11-25")];
    c.send(&post(&p, &session, INITIALIZED));
    let accepted = c.read_response("POST");
    assert_eq!(accepted.status, 202, "{:?}", accepted.raw_text());
    assert!(accepted.body.is_empty());

    c.send(&post(&p, &session, TOOLS_LIST));
    let list = c.read_response("POST");
    assert_eq!(list.status, 200, "{:?}", list.raw_text());
    assert!(list.one("content-type").starts_with("text/event-stream"));
    assert_eq!(list.one("cache-control"), "no-cache, no-transform");
    assert_eq!(list.all("mcp-session-id"), vec![SESSION]);
    assert!(contains(&list.body, TOOLS_RESULT), "{:?}", list.raw_text());

    let reqs = up.wait_requests(3, Duration::from_secs(5));
    assert!(!reqs[0].head.has("mcp-session-id"));
    for r in &reqs[1..] {
        assert_eq!(r.head.all("mcp-session-id"), vec![SESSION], "{}", r.raw_text());
        assert_eq!(r.head.all("mcp-protocol-version"), vec!["2025-11-25"], "{}", r.raw_text());
    }
    for r in &reqs {
        assert_credentials(r);
    }
    assert_eq!(
        [&reqs[0].body[..], &reqs[1].body[..], &reqs[2].body[..]],
        [INITIALIZE, INITIALIZED, TOOLS_LIST]
    );
}

// ------------------------------------------------ request forwarding (R5, R10, R18, R24)

#[test]
fn client_credentials_are_replaced_by_exactly_one_token_pair() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    let creds = [("Authorization", "Bearer OLD"), ("Authorization", "Bearer OLD"), ("X-Agent-Token", "x")];
    c.send(&post(&p, &creds, PING));
    assert_eq!(c.read_response("POST").status, 200);
    c.send(&request(
        "GET",
        "/mcp",
        &host(&p),
        &[("Accept", "text/event-stream"), ("x-agent-token", "y")],
        b"",
    ));
    assert_eq!(c.read_response("GET").status, 200);
    c.send(&request("DELETE", "/mcp", &host(&p), &[("authorization", "Basic b2xkOm9sZA==")], b""));
    assert_eq!(c.read_response("DELETE").status, 200);
    for req in up.wait_requests(3, Duration::from_secs(5)) {
        assert_credentials(&req);
        assert!(!contains(&req.raw, b"OLD") && !contains(&req.raw, b"b2xkOm9sZA=="), "{}", req.raw_text());
    }
}

#[test]
fn token_from_environment_is_used_when_no_token_file_is_given() {
    let up = ok_upstream();
    let url = up.url();
    let p =
        ProxyProcess::start(&["--upstream", &url, "--agent", AGENT], &[("MCP_PROXY_TOKEN", "env-token-123")]);
    assert_eq!(exchange(&p, &post(&p, &[], PING)).status, 200);
    let req = up.only_request();
    assert_eq!(req.head.all("authorization"), vec!["Bearer env-token-123"]);
    assert_eq!(req.head.all("x-agent-token"), vec!["env-token-123"]);
}

#[test]
fn host_is_rewritten_to_the_upstream_authority() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    c.send(&post(&p, &[], PING));
    assert_eq!(c.read_response("POST").status, 200);
    c.send(&request("GET", "/mcp", &format!("localhost:{}", p.port), &[], b""));
    assert_eq!(c.read_response("GET").status, 200);
    for req in up.wait_requests(2, Duration::from_secs(5)) {
        assert_eq!(req.head.all("host"), vec![up.authority()], "{}", req.raw_text());
    }
}

#[test]
fn method_path_and_query_reach_upstream_byte_exact() {
    let up = ok_upstream();
    let p = start(&up);
    let targets = [
        ("POST", "/mcp"),
        ("POST", "/mcp/"),
        ("POST", "/messages/?session_id=0123abcdEF&x=%2F%20y+z"),
        ("GET", "/.well-known/oauth-authorization-server"),
        ("GET", "/a/b;c=d/%7Euser?q=%E2%9C%93&empty=&&flag"),
        ("PUT", "/mcp?x=1"),
        ("PATCH", "/mcp"),
        ("OPTIONS", "/mcp"),
        ("DELETE", "/mcp?session=1"),
    ];
    let mut c = client(&p);
    for (method, target) in targets {
        let body: &[u8] = if method == "POST" { PING } else { b"" };
        let fields: &[(&str, &str)] =
            if method == "POST" { &[("Content-Type", "application/json")] } else { &[] };
        c.send(&request(method, target, &host(&p), fields, body));
        let resp = c.read_response(method);
        assert_eq!(resp.status, 200, "{method} {target}: {:?}", resp.raw_text());
    }
    let reqs = up.wait_requests(targets.len(), Duration::from_secs(5));
    for (req, (method, target)) in reqs.iter().zip(targets) {
        assert_eq!(req.head.start, format!("{method} {target} HTTP/1.1"), "{}", req.raw_text());
    }
}

#[test]
fn protocol_version_header_is_not_duplicated_upstream() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    c.send(&post(&p, &[("MCP-Protocol-Version", "2025-11-25"), ("Mcp-Session-Id", SESSION)], PING));
    assert_eq!(c.read_response("POST").status, 200);
    // The same value twice (different case) collapses to one line, never "v, v".
    c.send(&post(
        &p,
        &[("MCP-Protocol-Version", "2025-11-25"), ("mcp-protocol-version", "2025-11-25")],
        PING,
    ));
    assert_eq!(c.read_response("POST").status, 200);
    for req in up.wait_requests(2, Duration::from_secs(5)) {
        assert_eq!(req.head.all("mcp-protocol-version"), vec!["2025-11-25"], "{}", req.raw_text());
    }
}

#[test]
fn end_to_end_request_fields_reach_upstream_once_and_unchanged() {
    let up = ok_upstream();
    let p = start(&up);
    let fields = [
        ("Last-Event-ID", "evt-42"),
        ("Mcp-Method", "ping"),
        ("Mcp-Param-Region", "=?base64?ZXUtd2VzdA==?="),
        ("User-Agent", "node"),
        ("X-Unknown-Thing", "Keep  This  Exactly"),
    ];
    assert_eq!(exchange(&p, &post(&p, &fields, PING)).status, 200);
    let req = up.only_request();
    for (name, value) in fields {
        assert_eq!(req.head.all(name), vec![value], "{name}: {}", req.raw_text());
    }
    assert_eq!(req.head.all("content-type"), vec!["application/json"]);
    assert_eq!(req.head.all("accept"), vec!["application/json, text/event-stream"]);
}

#[test]
fn repeated_list_field_lines_are_joined_and_identical_ones_collapsed() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = request(
        "GET",
        "/mcp",
        &host(&p),
        &[
            ("Accept", "application/json"),
            ("accept", "text/event-stream"),
            ("X-Same", "one"),
            ("X-SAME", "one"),
        ],
        b"",
    );
    assert_eq!(exchange(&p, &raw).status, 200);
    let req = up.only_request();
    assert_eq!(req.head.all("accept"), vec!["application/json, text/event-stream"], "{}", req.raw_text());
    assert_eq!(req.head.all("x-same"), vec!["one"], "{}", req.raw_text());
}

#[test]
fn conflicting_content_type_lines_from_client_get_400() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = request(
        "POST",
        "/mcp",
        &host(&p),
        &[("Content-Type", "application/json"), ("Content-Type", "text/plain")],
        PING,
    );
    let resp = exchange(&p, &raw);
    assert_eq!(resp.status, 400, "{:?}", resp.raw_text());
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn conflicting_session_id_lines_from_client_get_400() {
    let up = ok_upstream();
    let p = start(&up);
    let resp = exchange(&p, &post(&p, &[("Mcp-Session-Id", "aaa"), ("mcp-session-id", "bbb")], PING));
    assert_eq!(resp.status, 400, "{:?}", resp.raw_text());
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn field_names_are_written_lowercase_both_ways() {
    let up = StubUpstream::fixed(response(
        "200 OK",
        &[("Content-Type", "application/json"), ("X-Upstream-Thing", "2"), ("Cache-Control", "no-store")],
        OK_JSON,
    ));
    let p = start(&up);
    let resp = exchange(&p, &post(&p, &[("X-Client-Thing", "1"), ("User-Agent", "it")], PING));
    assert_eq!(resp.status, 200);
    assert_lowercase_names(&resp.head, "response");
    assert_eq!(resp.all("x-upstream-thing"), vec!["2"]);
    let req = up.only_request();
    assert_lowercase_names(&req.head, "upstream request");
    assert_eq!(req.head.all("x-client-thing"), vec!["1"]);
}

#[test]
fn hop_by_hop_request_fields_are_stripped_including_those_named_in_connection() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = request(
        "POST",
        "/mcp",
        &host(&p),
        &[
            ("Content-Type", "application/json"),
            ("Connection", "keep-alive, X-Private"),
            ("X-Private", "secret-hop"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Connection", "keep-alive"),
            ("TE", "trailers"),
            ("Trailer", "X-Checksum"),
            ("Upgrade", "h2c"),
            ("Proxy-Authorization", "Basic cHJveHk6cHc="),
            ("X-End-To-End", "kept"),
        ],
        PING,
    );
    assert_eq!(exchange(&p, &raw).status, 200);
    let req = up.only_request();
    for name in
        ["x-private", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "proxy-authorization"]
    {
        assert!(!req.head.has(name), "hop-by-hop {name:?} reached upstream: {}", req.raw_text());
    }
    for v in req.head.all("connection") {
        assert!(!v.to_ascii_lowercase().contains("x-private"), "{}", req.raw_text());
    }
    assert!(!contains(&req.raw, b"secret-hop"), "{}", req.raw_text());
    assert_eq!(req.head.all("x-end-to-end"), vec!["kept"]);
    assert_eq!(req.body, PING);
}

#[test]
fn hop_by_hop_response_fields_are_stripped_including_those_named_in_connection() {
    let up = StubUpstream::fixed(response(
        "200 OK",
        &[
            ("Content-Type", "application/json"),
            ("Connection", "keep-alive, X-Up-Private"),
            ("X-Up-Private", "secret-hop"),
            ("Keep-Alive", "timeout=5, max=100"),
            ("Proxy-Authenticate", "Basic realm=x"),
            ("Proxy-Connection", "keep-alive"),
            ("Upgrade", "h2c"),
            ("Trailer", "X-Checksum"),
            ("TE", "trailers"),
            ("WWW-Authenticate", "Bearer realm=mcp"),
            ("X-Accel-Buffering", "no"),
            ("Retry-After", "3"),
            ("Vary", "Accept"),
        ],
        OK_JSON,
    ));
    let p = start(&up);
    let resp = exchange(&p, &post(&p, &[], PING));
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    for name in
        ["x-up-private", "keep-alive", "proxy-authenticate", "proxy-connection", "upgrade", "trailer", "te"]
    {
        assert!(!resp.has(name), "hop-by-hop {name:?} reached the client: {:?}", resp.raw_text());
    }
    assert!(!contains(&resp.raw, b"secret-hop"), "{:?}", resp.raw_text());
    for (name, value) in [
        ("www-authenticate", "Bearer realm=mcp"),
        ("x-accel-buffering", "no"),
        ("retry-after", "3"),
        ("vary", "Accept"),
    ] {
        assert_eq!(resp.all(name), vec![value], "{:?}", resp.raw_text());
    }
    assert_eq!(resp.body, OK_JSON);
}

// ------------------------------------------------ connections (R34)

#[test]
fn three_sequential_requests_share_one_client_connection() {
    let up = StubUpstream::start(|req, s| {
        let _ = s.write_all(&response("200 OK", &[("Content-Type", "text/plain")], req.target.as_bytes()));
        Next::KeepAlive
    });
    let p = start(&up);
    let mut c = client(&p);
    for path in ["/one", "/two", "/three"] {
        c.send(&request("POST", path, &host(&p), &[("Content-Type", "application/json")], PING));
        let resp = c.read_response("POST");
        assert_eq!(resp.status, 200, "{path}: {:?}", resp.raw_text());
        assert_eq!(resp.text(), path);
    }
    assert_eq!(up.wait_requests(3, Duration::from_secs(5)).len(), 3);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let up = StubUpstream::start(|req, s| {
        if req.target == "/a" {
            std::thread::sleep(Duration::from_millis(300));
        }
        let _ = s.write_all(&response("200 OK", &[("Content-Type", "text/plain")], req.target.as_bytes()));
        Next::KeepAlive
    });
    let p = start(&up);
    let h = host(&p);
    let mut all = request("GET", "/a", &h, &[], b"");
    all.extend(request("POST", "/b", &h, &[("Content-Type", "application/json")], PING));
    all.extend(request("GET", "/c", &h, &[], b""));
    let mut c = client(&p);
    c.send(&all);
    for (method, path) in [("GET", "/a"), ("POST", "/b"), ("GET", "/c")] {
        let resp = c.read_response(method);
        assert_eq!(resp.status, 200, "{path}: {:?}", resp.raw_text());
        assert_eq!(resp.text(), path, "responses out of order");
    }
    let reqs = up.wait_requests(3, Duration::from_secs(5));
    let b = reqs.iter().find(|r| r.target == "/b").unwrap();
    assert_eq!(b.body, PING);
}

// ------------------------------------------------ response bodies (R14, R31)

#[test]
fn content_length_body_is_relayed_with_its_length() {
    let body: Vec<u8> = (0..256 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    let up = StubUpstream::fixed(response("200 OK", &[("Content-Type", "application/octet-stream")], &body));
    let p = start(&up);
    let mut c = client(&p);
    for _ in 0..2 {
        c.send(&request("GET", "/big", &host(&p), &[], b""));
        let resp = c.read_response("GET");
        assert_eq!(resp.status, 200);
        assert_eq!(resp.all("content-length"), vec![body.len().to_string()]);
        assert!(!resp.has("transfer-encoding"));
        assert!(resp.body == body, "body differs (len {} vs {})", resp.body.len(), body.len());
    }
}

#[test]
fn chunked_upstream_body_is_relayed_and_trailers_dropped() {
    let up = StubUpstream::fixed(
        &b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n\
5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Checksum: abc123\r\n\r\n"[..],
    );
    let p = start(&up);
    let mut c = client(&p);
    for _ in 0..2 {
        c.send(&request("GET", "/chunked", &host(&p), &[], b""));
        let resp = c.read_response("GET");
        assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
        assert_eq!(resp.text(), "hello world", "{:?}", resp.raw_text());
        assert!(resp.trailers.is_empty(), "trailers relayed: {:?}", resp.raw_text());
        assert!(!resp.has("trailer"), "{:?}", resp.raw_text());
        assert!(!resp.has("content-length"));
        assert!(!contains(&resp.raw, b"abc123"), "{:?}", resp.raw_text());
    }
}

#[test]
fn close_delimited_upstream_body_is_reframed_as_chunked() {
    let body: Vec<u8> = (0..100 * 1024).map(|i| b'A' + (i % 26) as u8).collect();
    let mut raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n".to_vec();
    raw.extend_from_slice(&body);
    let up = StubUpstream::fixed_then_close(raw);
    let p = start(&up);
    let mut c = client(&p);
    c.send(&request("GET", "/close", &host(&p), &[], b""));
    let resp = c.read_response("GET");
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.all("transfer-encoding"),
        vec!["chunked"],
        "head: {:?}",
        String::from_utf8_lossy(&resp.head_raw())
    );
    assert!(!resp.has("content-length"));
    assert!(resp.body == body, "body differs (len {} vs {})", resp.body.len(), body.len());
    assert_healthy_on_new_upstream_connection(&p, &up);
}

/// The close-delimited upstream answers every request the same way, each on a
/// new upstream connection; a second exchange must work too.
#[track_caller]
fn assert_healthy_on_new_upstream_connection(p: &ProxyProcess, up: &StubUpstream) {
    let mut c = client(p);
    c.send(&request("GET", "/again", &host(p), &[], b""));
    let resp = c.read_response("GET");
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(up.wait_requests(2, Duration::from_secs(5)).len(), 2);
}

impl Resp {
    fn head_raw(&self) -> Vec<u8> {
        let end = self.raw.windows(4).position(|w| w == b"\r\n\r\n").map_or(self.raw.len(), |i| i + 4);
        self.raw[..end].to_vec()
    }
}

#[test]
fn head_response_has_no_body_and_connection_stays_usable() {
    let up = StubUpstream::start(|req, s| {
        let out = if req.method == "HEAD" {
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 42\r\n\r\n".to_vec()
        } else {
            response("200 OK", &[("Content-Type", "application/json")], OK_JSON)
        };
        let _ = s.write_all(&out);
        Next::KeepAlive
    });
    let p = start(&up);
    let mut c = client(&p);
    c.send(&request("HEAD", "/mcp", &host(&p), &[], b""));
    let head = c.read_response("HEAD");
    assert_eq!(head.status, 200, "{:?}", head.raw_text());
    assert_eq!(head.all("content-length"), vec!["42"], "HEAD content-length must be relayed as-is");
    c.send(&post(&p, &[], PING));
    let next = c.read_response("POST");
    assert_eq!(next.status, 200, "after HEAD: {:?}", next.raw_text());
    assert_eq!(next.body, OK_JSON);
}

#[test]
fn no_content_and_not_modified_have_no_body_and_connection_stays_usable() {
    let up = StubUpstream::start(|req, s| {
        let out: Vec<u8> = match req.target.as_str() {
            "/204" => format!("HTTP/1.1 204 No Content\r\nMcp-Session-Id: {SESSION}\r\n\r\n").into_bytes(),
            "/304" => b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n\r\n".to_vec(),
            _ => response("200 OK", &[("Content-Type", "application/json")], OK_JSON),
        };
        let _ = s.write_all(&out);
        Next::KeepAlive
    });
    let p = start(&up);
    let mut c = client(&p);
    c.send(&request("DELETE", "/204", &host(&p), &[], b""));
    let r204 = c.read_response("DELETE");
    assert_eq!(r204.status, 204, "{:?}", r204.raw_text());
    assert_eq!(r204.all("mcp-session-id"), vec![SESSION]);
    assert!(!r204.has("transfer-encoding") && !r204.has("content-length"), "{:?}", r204.raw_text());
    c.send(&request("GET", "/304", &host(&p), &[("If-None-Match", "\"v1\"")], b""));
    let r304 = c.read_response("GET");
    assert_eq!(r304.status, 304, "{:?}", r304.raw_text());
    assert_eq!(r304.all("etag"), vec!["\"v1\""]);
    assert!(!r304.has("transfer-encoding"), "{:?}", r304.raw_text());
    c.send(&post(&p, &[], PING));
    let next = c.read_response("POST");
    assert_eq!(next.status, 200, "after 204/304: {:?}", next.raw_text());
    assert_eq!(next.body, OK_JSON);
}

#[test]
fn conflicting_content_lengths_from_upstream_give_502() {
    let up = StubUpstream::fixed(&b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"[..]);
    let p = start(&up);
    assert_jsonrpc_error(&exchange(&p, &post(&p, &[], PING)), 502);
}

// ------------------------------------------------ statuses and errors (R6-R9, R35, R36)

#[test]
fn upstream_statuses_are_relayed_with_headers_and_body() {
    let up = StubUpstream::start(|req, s| {
        let code = req.target.trim_start_matches("/s/");
        let out = match code {
            "202" => b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n".to_vec(),
            "405" => response(
                "405 Method Not Allowed",
                &[("Allow", "GET, POST, DELETE"), ("Content-Type", "text/plain")],
                b"Method Not Allowed",
            ),
            "404" => response(
                "404 Not Found",
                &[("Content-Type", "application/json")],
                br#"{"error":"not_found","code":404}"#,
            ),
            other => response(
                &format!("{other} Whatever"),
                &[("Content-Type", "application/json")],
                format!(r#"{{"jsonrpc":"2.0","error":{{"code":-32000,"message":"status {other}"}}}}"#)
                    .as_bytes(),
            ),
        };
        let _ = s.write_all(&out);
        Next::KeepAlive
    });
    let p = start(&up);
    for (method, code) in [
        ("POST", "202"),
        ("POST", "400"),
        ("GET", "404"),
        ("PUT", "405"),
        ("GET", "409"),
        ("POST", "413"),
        ("POST", "421"),
        ("POST", "500"),
        ("DELETE", "404"),
    ] {
        let target = format!("/s/{code}");
        let (fields, body): (&[(&str, &str)], &[u8]) =
            if method == "POST" { (&[("Content-Type", "application/json")], PING) } else { (&[], b"") };
        let resp = exchange(&p, &request(method, &target, &host(&p), fields, body));
        assert_eq!(resp.status.to_string(), code, "{method} {target}: {:?}", resp.raw_text());
        match code {
            "202" => assert!(resp.body.is_empty()),
            "405" => {
                assert_eq!(resp.all("allow"), vec!["GET, POST, DELETE"], "{:?}", resp.raw_text());
                assert_eq!(resp.text(), "Method Not Allowed");
            }
            "404" => assert_eq!(resp.text(), r#"{"error":"not_found","code":404}"#, "{:?}", resp.raw_text()),
            _ => assert_eq!(
                resp.text(),
                format!(r#"{{"jsonrpc":"2.0","error":{{"code":-32000,"message":"status {code}"}}}}"#)
            ),
        }
    }
}

#[test]
fn refused_upstream_gives_json_502_within_three_seconds() {
    let port = dead_port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let tf = token_file(TOKEN);
    let p = ProxyProcess::start(
        &["--upstream", &url, "--agent", AGENT, "--token-file", tf.to_str().unwrap()],
        &[],
    );
    let t0 = Instant::now();
    let resp = exchange(&p, &post(&p, &[], PING));
    let took = t0.elapsed();
    assert_jsonrpc_error(&resp, 502);
    assert!(took < Duration::from_secs(3), "502 took {took:?}");
    assert!(!contains(&resp.raw, TOKEN.as_bytes()), "token echoed: {:?}", resp.raw_text());
}

#[test]
fn refused_connect_is_retried_and_succeeds_when_upstream_comes_up() {
    let port = dead_port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let tf = token_file(TOKEN);
    let p = ProxyProcess::start(
        &["--upstream", &url, "--agent", AGENT, "--token-file", tf.to_str().unwrap()],
        &[],
    );
    let upstream: Arc<Mutex<Option<StubUpstream>>> = Arc::new(Mutex::new(None));
    let slot = upstream.clone();
    let mut c = client(&p);
    c.send(&post(&p, &[], PING));
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(250));
        let l = TcpListener::bind(("127.0.0.1", port)).expect("rebind the dead port");
        *slot.lock().unwrap() = Some(StubUpstream::on(l, |_, s| {
            let _ = s.write_all(&response("200 OK", &[("Content-Type", "application/json")], OK_JSON));
            Next::KeepAlive
        }));
    });
    let resp = c.read_response("POST");
    t.join().unwrap();
    assert_eq!(resp.status, 200, "refused connect not retried: {:?}", resp.raw_text());
    assert_eq!(resp.body, OK_JSON);
}

#[test]
fn silent_upstream_gives_json_504_after_response_timeout() {
    let up = StubUpstream::silent();
    let p = start_with(&up, &["--response-timeout", "0.5"]);
    let t0 = Instant::now();
    let resp = exchange(&p, &post(&p, &[], PING));
    let took = t0.elapsed();
    assert_jsonrpc_error(&resp, 504);
    assert!(took >= Duration::from_millis(400), "504 came too early: {took:?}");
    assert!(took < Duration::from_secs(3), "504 took {took:?}");
}

#[test]
fn location_pointing_at_upstream_is_rewritten_to_the_client_host() {
    let up = StubUpstream::start(|req, s| {
        let location = if req.target == "/external" {
            "https://example.com/elsewhere".to_string()
        } else {
            format!("http://{}/mcp", req.head.one("host"))
        };
        let _ = s.write_all(&response("307 Temporary Redirect", &[("Location", &location)], b""));
        Next::KeepAlive
    });
    let p = start(&up);
    for client_host in [host(&p), format!("localhost:{}", p.port)] {
        let resp = exchange(
            &p,
            &request("POST", "/mcp/", &client_host, &[("Content-Type", "application/json")], PING),
        );
        assert_eq!(resp.status, 307, "{:?}", resp.raw_text());
        assert_eq!(resp.all("location"), vec![format!("http://{client_host}/mcp")], "{:?}", resp.raw_text());
    }
    let resp = exchange(&p, &request("GET", "/external", &host(&p), &[], b""));
    assert_eq!(resp.all("location"), vec!["https://example.com/elsewhere"], "{:?}", resp.raw_text());
}

// ------------------------------------------------ request bodies (R29, R32)

#[test]
fn expect_100_continue_is_answered_by_the_proxy_and_not_forwarded() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        host(&p),
        PING.len()
    );
    c.send(head.as_bytes());
    let interim = c.read_response("POST");
    assert_eq!(interim.status, 100, "want 100 Continue before sending the body: {:?}", interim.raw_text());
    c.send(PING);
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    let req = up.only_request();
    assert!(!req.head.has("expect"), "Expect forwarded: {}", req.raw_text());
    assert_eq!(req.body, PING);
}

#[test]
fn chunked_request_body_is_dechunked_and_sent_with_content_length() {
    let up = ok_upstream();
    let p = start(&up);
    let mut raw = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        host(&p)
    )
    .into_bytes();
    raw.extend(chunk(&PING[..10]));
    raw.extend_from_slice(format!("{:X};name=value\r\n", PING.len() - 10 - 3).as_bytes());
    raw.extend_from_slice(&PING[10..PING.len() - 3]);
    raw.extend_from_slice(b"\r\n");
    raw.extend(chunk(&PING[PING.len() - 3..]));
    raw.extend_from_slice(b"0\r\n\r\n");
    let resp = exchange(&p, &raw);
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    let req = up.only_request();
    assert!(!req.head.has("transfer-encoding"), "{}", req.raw_text());
    assert_eq!(req.head.all("content-length"), vec![PING.len().to_string()], "{}", req.raw_text());
    assert_eq!(req.body, PING, "{}", req.raw_text());
}

// ------------------------------------------------ streaming (R11, R12, R16)

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache, no-transform\r\nTransfer-Encoding: chunked\r\n\r\n";

#[test]
fn sse_first_event_reaches_client_before_upstream_sends_the_second() {
    let up = StubUpstream::start(|_, s| {
        let mut first = SSE_HEAD.to_vec();
        first.extend(chunk(b"event: message\r\ndata: first-event\r\n\r\n"));
        let _ = s.write_all(&first);
        let _ = s.flush();
        std::thread::sleep(Duration::from_secs(1));
        let mut rest = chunk(b"event: message\r\ndata: second-event\r\n\r\n");
        rest.extend_from_slice(b"0\r\n\r\n");
        let _ = s.write_all(&rest);
        Next::KeepAlive
    });
    let p = start(&up);
    let mut c = client(&p);
    let t0 = Instant::now();
    c.send(&post(&p, &[], PING));
    let head = c.read_head();
    assert_eq!(head.status, 200, "{:?}", head.raw_text());
    assert!(head.one("content-type").starts_with("text/event-stream"));
    let (seen, got) = c.read_until(b"first-event", Duration::from_millis(900));
    let seen = seen.unwrap_or_else(|| {
        panic!("first event not relayed within 900 ms; got {:?}", String::from_utf8_lossy(&got))
    });
    assert!(seen - t0 < Duration::from_millis(700), "first event took {:?}", seen - t0);
    assert!(!contains(&got, b"second-event"), "second event already there: the stream was buffered");
    let (second, got) = c.read_until(b"second-event", Duration::from_secs(3));
    assert!(second.is_some(), "second event never arrived: {:?}", String::from_utf8_lossy(&got));
}

#[test]
fn sse_response_head_reaches_client_before_any_event() {
    let up = StubUpstream::start(|_, s| {
        let _ = s.write_all(SSE_HEAD);
        std::thread::sleep(Duration::from_millis(1500));
        let mut rest = chunk(b": ping\r\n\r\n");
        rest.extend_from_slice(b"0\r\n\r\n");
        let _ = s.write_all(&rest);
        Next::KeepAlive
    });
    let p = start(&up);
    let mut c = client(&p);
    let t0 = Instant::now();
    c.send(&request(
        "GET",
        "/mcp",
        &host(&p),
        &[("Accept", "text/event-stream"), ("Mcp-Session-Id", SESSION)],
        b"",
    ));
    let head = c.read_head();
    let took = t0.elapsed();
    assert_eq!(head.status, 200, "{:?}", head.raw_text());
    assert!(took < Duration::from_millis(700), "SSE head held back for {took:?}");
}

#[test]
fn sse_close_delimited_stream_is_streamed_and_reframed_as_chunked() {
    let up = StubUpstream::start(|_, s| {
        let _ =
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: first-event\n\n");
        std::thread::sleep(Duration::from_secs(1));
        let _ = s.write_all(b"data: second-event\n\n");
        Next::Close
    });
    let p = start(&up);
    let mut c = client(&p);
    let t0 = Instant::now();
    c.send(&request("GET", "/sse", &host(&p), &[("Accept", "text/event-stream")], b""));
    let head = c.read_head();
    assert_eq!(head.all("transfer-encoding"), vec!["chunked"], "{:?}", head.raw_text());
    let (seen, got) = c.read_until(b"first-event", Duration::from_millis(900));
    let seen = seen.unwrap_or_else(|| panic!("first event not relayed: {:?}", String::from_utf8_lossy(&got)));
    assert!(seen - t0 < Duration::from_millis(700));
    let (end, got) = c.read_until(b"0\r\n\r\n", Duration::from_secs(3));
    assert!(end.is_some(), "no last chunk after upstream closed: {:?}", String::from_utf8_lossy(&got));
    assert!(contains(&got, b"second-event"));
}

#[test]
fn client_disconnect_mid_stream_closes_upstream_within_one_second() {
    let closed_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let slot = closed_at.clone();
    let up = StubUpstream::start(move |_, s| {
        if s.write_all(SSE_HEAD).is_err() {
            return Next::Close;
        }
        let start = Instant::now();
        let mut n = 0;
        while start.elapsed() < Duration::from_secs(10) {
            let event = chunk(format!("event: message\r\ndata: tick-{n}\r\n\r\n").as_bytes());
            if s.write_all(&event).is_err() {
                *slot.lock().unwrap() = Some(Instant::now());
                return Next::Close;
            }
            n += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        Next::Close
    });
    let p = start(&up);
    let stream = p.connect();
    let mut c = RawClient::new(stream.try_clone().unwrap());
    c.send(&request("GET", "/mcp", &host(&p), &[("Accept", "text/event-stream")], b""));
    assert_eq!(c.read_head().status, 200);
    let (seen, got) = c.read_until(b"tick-1", Duration::from_secs(2));
    assert!(seen.is_some(), "stream did not flow: {:?}", String::from_utf8_lossy(&got));
    let _ = stream.shutdown(Shutdown::Both);
    drop(c);
    drop(stream);
    let dropped = Instant::now();
    while dropped.elapsed() < Duration::from_secs(3) && closed_at.lock().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let at = closed_at.lock().unwrap().expect("upstream connection still open 3 s after the client left");
    assert!(at - dropped < Duration::from_secs(1), "upstream closed {:?} after the client", at - dropped);
}

// ------------------------------------------------ malformed requests (R29, R33)

/// Send `raw`, expect `status` and a closed connection, nothing upstream,
/// then a healthy request.
#[track_caller]
fn assert_rejected(raw: &[u8], status: u16) {
    let up = ok_upstream();
    let p = start(&up);
    // `Host: 127.0.0.1:1` stands for the proxy's own authority, so that only
    // the defect under test can cause the rejection (not the Host guard).
    let own = format!("Host: {}\r\n", host(&p));
    let raw = String::from_utf8_lossy(raw).replace("Host: 127.0.0.1:1\r\n", &own).into_bytes();
    let raw = &raw[..];
    let mut c = client(&p);
    c.send(raw);
    let resp = c.read_response("GET");
    assert_eq!(
        resp.status,
        status,
        "request {:?} got {:?}",
        String::from_utf8_lossy(&raw[..raw.len().min(300)]),
        resp.raw_text()
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(up.request_count(), 0, "a rejected request reached upstream: {:#?}", up.requests());
    if status == 400 {
        assert!(c.closed_within(Duration::from_secs(2)), "connection not closed after a framing 400");
    }
    assert_healthy(&p, &up);
}

fn raw_req(head_fields: &str, body: &str) -> Vec<u8> {
    format!("POST /mcp HTTP/1.1\r\n{head_fields}\r\n{body}").into_bytes()
}

#[test]
fn content_length_with_transfer_encoding_gets_400() {
    assert_rejected(
        &raw_req("Host: 127.0.0.1:1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"),
        400,
    );
}

#[test]
fn two_different_content_lengths_get_400() {
    assert_rejected(
        &raw_req("Host: 127.0.0.1:1\r\nContent-Length: 5\r\nContent-Length: 6\r\n", "hello!"),
        400,
    );
}

#[test]
fn transfer_encoding_not_ending_in_chunked_gets_400() {
    assert_rejected(&raw_req("Host: 127.0.0.1:1\r\nTransfer-Encoding: gzip\r\n", "abc"), 400);
}

#[test]
fn transfer_encoding_chunked_then_gzip_gets_400() {
    assert_rejected(&raw_req("Host: 127.0.0.1:1\r\nTransfer-Encoding: chunked, gzip\r\n", "0\r\n\r\n"), 400);
}

#[test]
fn obs_fold_gets_400() {
    assert_rejected(
        &raw_req("Host: 127.0.0.1:1\r\nX-Folded: first\r\n  second\r\nContent-Length: 2\r\n", "{}"),
        400,
    );
}

#[test]
fn missing_host_gets_400() {
    assert_rejected(&raw_req("Content-Type: application/json\r\nContent-Length: 2\r\n", "{}"), 400);
}

#[test]
fn two_different_hosts_get_400() {
    assert_rejected(&raw_req("Host: 127.0.0.1:1\r\nHost: 127.0.0.1:2\r\nContent-Length: 2\r\n", "{}"), 400);
}

#[test]
fn two_identical_hosts_get_400() {
    // RFC 9112 §3.2: more than one Host field line is a 400, even when equal.
    assert_rejected(&raw_req("Host: 127.0.0.1:1\r\nHost: 127.0.0.1:1\r\nContent-Length: 2\r\n", "{}"), 400);
}

#[test]
fn invalid_content_length_gets_400() {
    assert_rejected(&raw_req("Host: 127.0.0.1:1\r\nContent-Length: +5\r\n", "hello"), 400);
}

#[test]
fn head_of_70_kib_gets_431() {
    let big = "a".repeat(70 * 1024);
    assert_rejected(
        format!("GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:1\r\nX-Big: {big}\r\n\r\n").as_bytes(),
        431,
    );
}

#[test]
fn head_with_150_fields_gets_431() {
    let fields: String = (0..150).map(|i| format!("X-Field-{i}: v{i}\r\n")).collect();
    assert_rejected(format!("GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:1\r\n{fields}\r\n").as_bytes(), 431);
}

#[test]
fn head_of_60_kib_is_relayed() {
    let up = ok_upstream();
    let p = start(&up);
    let big = "b".repeat(60 * 1024);
    let resp = exchange(&p, &request("GET", "/mcp", &host(&p), &[("X-Big", &big)], b""));
    assert_eq!(resp.status, 200, "{:?}", &resp.raw_text());
    assert_eq!(up.only_request().head.all("x-big"), vec![big.as_str()]);
}

#[test]
fn head_with_100_fields_is_relayed() {
    let up = ok_upstream();
    let p = start(&up);
    let names: Vec<String> = (0..99).map(|i| format!("X-Field-{i}")).collect();
    let fields: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
    // Host + 99 fields = 100 field lines.
    let resp = exchange(&p, &request("GET", "/mcp", &host(&p), &fields, b""));
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(up.only_request().head.all("x-field-98"), vec!["v"]);
}

/// A hostile request on a connection must not poison a pipelined follower:
/// after a 400 the proxy closes instead of parsing the smuggled bytes.
#[test]
fn smuggled_request_after_cl_te_conflict_never_reaches_upstream() {
    let up = ok_upstream();
    let p = start(&up);
    let h = host(&p);
    let smuggled = format!("GET /smuggled HTTP/1.1\r\nHost: {h}\r\n\r\n");
    let raw = format!(
        "POST /mcp HTTP/1.1\r\nHost: {h}\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}",
        5 + smuggled.len()
    );
    let mut c = client(&p);
    c.send(raw.as_bytes());
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 400, "{:?}", resp.raw_text());
    std::thread::sleep(Duration::from_millis(200));
    assert!(up.requests().iter().all(|r| r.target != "/smuggled"), "{:#?}", up.requests());
    assert_healthy(&p, &up);
}

// ------------------------------------------------ more upstream behaviour (R17, R31-R33, R35)

#[test]
fn sixteen_concurrent_posts_are_not_blocked_by_an_open_get_stream() {
    let up = StubUpstream::start(|req, s| {
        if req.method == "GET" {
            let _ = s.write_all(SSE_HEAD);
            std::thread::sleep(Duration::from_secs(4));
            let _ = s.write_all(b"0\r\n\r\n");
        } else {
            std::thread::sleep(Duration::from_millis(300));
            let _ = s.write_all(&response("200 OK", &[("Content-Type", "application/json")], OK_JSON));
        }
        Next::KeepAlive
    });
    let p = start(&up);
    let mut stream = client(&p);
    stream.send(&request("GET", "/mcp", &host(&p), &[("Accept", "text/event-stream")], b""));
    assert_eq!(stream.read_head().status, 200);
    let t0 = Instant::now();
    let workers: Vec<_> = (0..16)
        .map(|_| {
            let mut c = client(&p);
            let raw = post(&p, &[], PING);
            std::thread::spawn(move || {
                c.send(&raw);
                c.read_response("POST").status
            })
        })
        .collect();
    for w in workers {
        assert_eq!(w.join().unwrap(), 200);
    }
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(2500), "16 concurrent 300 ms POSTs took {took:?}: serialised?");
}

#[test]
fn interim_responses_from_upstream_are_not_relayed_as_final() {
    let up = StubUpstream::fixed({
        let mut out = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n".to_vec();
        out.extend(response("200 OK", &[("Content-Type", "application/json")], OK_JSON));
        out
    });
    let p = start(&up);
    let mut c = client(&p);
    c.send(&post(&p, &[], PING));
    let mut resp = c.read_response("POST");
    let mut interim = 0;
    while (100..200).contains(&resp.status) {
        interim += 1;
        assert!(interim <= 2, "too many interim responses");
        resp = c.read_response("POST");
    }
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(resp.body, OK_JSON);
    c.send(&post(&p, &[], PING));
    assert_eq!(c.read_response("POST").status, 200, "connection unusable after interim responses");
}

#[test]
fn garbage_upstream_response_gives_502() {
    let up = StubUpstream::fixed_then_close(&b"this is not http\r\n\r\n"[..]);
    let p = start(&up);
    assert_jsonrpc_error(&exchange(&p, &post(&p, &[], PING)), 502);
}

#[test]
fn upstream_closing_without_response_gives_502_and_post_is_not_replayed() {
    let up = StubUpstream::start(|_, _| Next::Close);
    let p = start(&up);
    let resp = exchange(&p, &post(&p, &[], PING));
    assert_jsonrpc_error(&resp, 502);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(up.request_count(), 1, "a POST whose bytes were sent was replayed: {:#?}", up.requests());
}

#[test]
fn truncated_upstream_body_closes_the_client_connection() {
    let up = StubUpstream::fixed_then_close(
        &b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\nonly ten.."[..],
    );
    let p = start(&up);
    let mut c = client(&p);
    c.send(&request("GET", "/mcp", &host(&p), &[], b""));
    let head = c.read_head();
    assert_eq!(head.status, 200);
    assert!(c.closed_within(Duration::from_secs(2)), "client left hanging after a truncated upstream body");
    assert!(c.unread().len() < 100, "more body than the upstream sent");
}

#[test]
fn http10_client_gets_body_without_chunked_framing() {
    let up = StubUpstream::fixed_then_close(
        &b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nold client body"[..],
    );
    let p = start(&up);
    let mut c = client(&p);
    c.send(format!("GET /mcp HTTP/1.0\r\nHost: {}\r\n\r\n", host(&p)).as_bytes());
    let resp = c.read_response("GET");
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert!(!resp.has("transfer-encoding"), "chunked sent to an HTTP/1.0 client: {:?}", resp.raw_text());
    assert_eq!(resp.text(), "old client body", "{:?}", resp.raw_text());
}

#[test]
fn one_mib_request_body_is_relayed_intact() {
    let up = ok_upstream();
    let p = start(&up);
    let filler = "x".repeat(1024 * 1024);
    let body =
        format!(r#"{{"jsonrpc":"2.0","id":9,"method":"resources/read","params":{{"uri":"{filler}"}}}}"#);
    let resp = exchange(&p, &post(&p, &[], body.as_bytes()));
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    let req = up.only_request();
    assert_eq!(req.head.all("content-length"), vec![body.len().to_string()]);
    assert!(req.body == body.as_bytes(), "body changed (len {} vs {})", req.body.len(), body.len());
}

#[test]
fn request_body_over_8_mib_gets_413_without_reaching_upstream() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"jsonrpc\":",
        host(&p),
        9 * 1024 * 1024
    );
    c.send(head.as_bytes());
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 413, "{:?}", resp.raw_text());
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn silent_open_stream_is_closed_after_idle_timeout() {
    let up = StubUpstream::start(|_, s| {
        let mut out = SSE_HEAD.to_vec();
        out.extend(chunk(b"data: hello\n\n"));
        let _ = s.write_all(&out);
        std::thread::sleep(Duration::from_secs(6));
        Next::Close
    });
    let p = start_with(&up, &["--idle-timeout", "0.5"]);
    let mut c = client(&p);
    c.send(&request("GET", "/mcp", &host(&p), &[("Accept", "text/event-stream")], b""));
    assert_eq!(c.read_head().status, 200);
    let t0 = Instant::now();
    assert!(
        c.closed_within(Duration::from_secs(3)),
        "silent stream still open 3 s after a 0.5 s idle timeout"
    );
    assert!(t0.elapsed() >= Duration::from_millis(300), "closed too early: {:?}", t0.elapsed());
}

// ------------------------------------------------ edge cases found while hunting

#[test]
fn whitespace_before_colon_gets_400() {
    assert_rejected(&raw_req("Host: 127.0.0.1:1\r\nContent-Length : 2\r\n", "{}"), 400);
}

#[test]
fn nul_in_field_value_gets_400() {
    assert_rejected(&raw_req("Host: 127.0.0.1:1\r\nX-Bad: a\0b\r\nContent-Length: 2\r\n", "{}"), 400);
}

#[test]
fn chunk_size_overflow_in_request_gets_400() {
    assert_rejected(
        &raw_req(
            "Host: 127.0.0.1:1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n",
            "10000000000000000000002\r\n{}\r\n0\r\n\r\n",
        ),
        400,
    );
}

#[test]
fn pipelined_malformed_request_after_a_good_one_gets_its_own_400() {
    let up = ok_upstream();
    let p = start(&up);
    let mut all = post(&p, &[], PING);
    all.extend_from_slice(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{{}}",
            host(&p)
        )
        .as_bytes(),
    );
    let mut c = client(&p);
    c.send(&all);
    let first = c.read_response("POST");
    assert_eq!(first.status, 200, "{:?}", first.raw_text());
    let second = c.read_response("POST");
    assert_eq!(second.status, 400, "{:?}", second.raw_text());
    assert_eq!(up.request_count(), 1);
    assert_healthy(&p, &up);
}

#[test]
fn upstream_response_with_content_length_and_chunked_is_never_relayed_with_both() {
    let up = StubUpstream::fixed_then_close(
        &b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"[..],
    );
    let p = start(&up);
    let resp = exchange(&p, &request("GET", "/mcp", &host(&p), &[], b""));
    // Either 502 (invalid upstream framing) or the chunked body; never both fields
    // (the raw client panics on that) and never the 3-byte reading.
    if resp.status == 200 {
        assert_eq!(resp.text(), "hello", "{:?}", resp.raw_text());
    } else {
        assert_jsonrpc_error(&resp, 502);
    }
}

#[test]
fn upstream_chunk_size_overflow_does_not_wedge_the_proxy() {
    let up = StubUpstream::start(|req, s| {
        let out = if req.target == "/bad" {
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\nxx\r\n0\r\n\r\n".to_vec()
        } else {
            response("200 OK", &[("Content-Type", "application/json")], OK_JSON)
        };
        let _ = s.write_all(&out);
        if req.target == "/bad" {
            Next::Close
        } else {
            Next::KeepAlive
        }
    });
    let p = start(&up);
    let mut c = client(&p);
    c.send(&request("GET", "/bad", &host(&p), &[], b""));
    // Whatever arrives (a 502, or a head and then a close), it must end.
    let head = c.read_head();
    if head.status == 200 {
        assert!(
            c.closed_within(Duration::from_secs(2)),
            "connection not closed after an invalid upstream chunk size"
        );
        assert!(
            !contains(c.unread(), b"0\r\n\r\n"),
            "invalid upstream body relayed as a complete one: {:?}",
            String::from_utf8_lossy(c.unread())
        );
    } else {
        assert_eq!(head.status, 502);
    }
    assert_healthy(&p, &up);
}

// A client EOF mid-exchange is an abort (R16: the upstream side closes at
// once), as in nginx's 499: a half-closing client (`printf ... | nc -N`) is
// indistinguishable from one that left. Documented in the README.
#[test]
fn client_half_close_mid_exchange_aborts_it_and_the_proxy_stays_healthy() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    c.send(&post(&p, &[], PING));
    c.stream.shutdown(Shutdown::Write).unwrap();
    assert!(c.closed_within(Duration::from_secs(2)), "proxy kept a half-closed exchange open");
    assert_healthy(&p, &up);
}

#[test]
fn upstream_closing_idle_keep_alive_connections_does_not_fail_the_next_request() {
    // The upstream answers with a plain Content-Length response and then closes
    // (as uvicorn does after its keep-alive timeout); a pooled connection that
    // the upstream has closed must not be used for the next request.
    let up = StubUpstream::start(|_, s| {
        let _ = s.write_all(&response("200 OK", &[("Content-Type", "application/json")], OK_JSON));
        Next::Close
    });
    let p = start(&up);
    for i in 0..4 {
        let resp = exchange(&p, &post(&p, &[], PING));
        assert_eq!(resp.status, 200, "request {i}: {:?}", resp.raw_text());
        std::thread::sleep(Duration::from_millis(150));
    }
    assert_eq!(up.request_count(), 4);
}

#[test]
fn upstream_connection_close_response_is_not_reused() {
    let up = StubUpstream::start(|_, s| {
        let _ = s.write_all(&response(
            "200 OK",
            &[("Content-Type", "application/json"), ("Connection", "close")],
            OK_JSON,
        ));
        // Keep the socket open but never read it again: a proxy that reuses it hangs.
        std::thread::sleep(Duration::from_secs(8));
        Next::Close
    });
    let p = start_with(&up, &["--response-timeout", "3"]);
    let mut c = client(&p);
    for i in 0..3 {
        c.send(&post(&p, &[], PING));
        let resp = c.read_response("POST");
        assert_eq!(resp.status, 200, "request {i}: {:?}", resp.raw_text());
    }
    assert_eq!(up.connections(), 3, "a connection the upstream asked to close was reused");
}

#[test]
fn a_client_that_stops_reading_does_not_block_others() {
    let big: Vec<u8> = vec![b'z'; 8 * 1024 * 1024];
    let up = StubUpstream::start(move |req, s| {
        let out = if req.target == "/big" {
            response("200 OK", &[("Content-Type", "application/octet-stream")], &big)
        } else {
            response("200 OK", &[("Content-Type", "application/json")], OK_JSON)
        };
        let _ = s.write_all(&out);
        Next::KeepAlive
    });
    let p = start(&up);
    let mut stuck = client(&p);
    stuck.send(&request("GET", "/big", &host(&p), &[], b""));
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    for _ in 0..3 {
        let resp = exchange(&p, &post(&p, &[], PING));
        assert_eq!(resp.status, 200);
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "other clients slowed to {:?}", t0.elapsed());
    // The stuck client can still read its whole body afterwards.
    let resp = stuck.read_response("GET");
    assert_eq!(resp.body.len(), 8 * 1024 * 1024);
}

/// Write `bytes` one at a time with a short pause, so every parser sees
/// every split point.
fn trickle(s: &mut std::net::TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    for b in bytes {
        s.write_all(std::slice::from_ref(b))?;
        s.flush()?;
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok(())
}

#[test]
fn request_arriving_one_byte_at_a_time_is_relayed() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    let raw = post(&p, &[("Mcp-Session-Id", SESSION)], PING);
    trickle(&mut c.stream, &raw).unwrap();
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    let req = up.only_request();
    assert_eq!(req.body, PING);
    assert_eq!(req.head.all("mcp-session-id"), vec![SESSION]);
}

#[test]
fn chunked_request_arriving_one_byte_at_a_time_is_dechunked() {
    let up = ok_upstream();
    let p = start(&up);
    let mut raw = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        host(&p)
    )
    .into_bytes();
    raw.extend(chunk(&PING[..7]));
    raw.extend(chunk(&PING[7..]));
    raw.extend_from_slice(b"0\r\n\r\n");
    let mut c = client(&p);
    trickle(&mut c.stream, &raw).unwrap();
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(up.only_request().body, PING);
}

#[test]
fn upstream_response_arriving_one_byte_at_a_time_is_relayed() {
    let up = StubUpstream::start(|req, s| {
        let out: Vec<u8> = if req.target == "/chunked" {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: {SESSION}\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            .into_bytes();
            out.extend(chunk(b"data: one\n\n"));
            out.extend(chunk(b"data: two\n\n"));
            out.extend_from_slice(b"0\r\nX-T: 1\r\n\r\n");
            out
        } else {
            response("200 OK", &[("Content-Type", "application/json"), ("MCP-Session-Id", SESSION)], OK_JSON)
        };
        let _ = trickle(s, &out);
        Next::KeepAlive
    });
    let p = start(&up);
    let mut c = client(&p);
    c.send(&post(&p, &[], PING));
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(resp.body, OK_JSON);
    assert_eq!(resp.all("mcp-session-id"), vec![SESSION]);
    c.send(&request("GET", "/chunked", &host(&p), &[], b""));
    let resp = c.read_response("GET");
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(resp.text(), "data: one\n\ndata: two\n\n");
    assert!(resp.trailers.is_empty(), "{:?}", resp.raw_text());
    assert_eq!(resp.all("mcp-session-id"), vec![SESSION]);
    c.send(&post(&p, &[], PING));
    assert_eq!(c.read_response("POST").status, 200);
}

#[test]
fn oversized_upstream_response_head_gives_502() {
    let big = "h".repeat(70 * 1024);
    let up = StubUpstream::fixed_then_close(response("200 OK", &[("X-Huge", &big)], OK_JSON));
    let p = start(&up);
    assert_jsonrpc_error(&exchange(&p, &post(&p, &[], PING)), 502);
}

#[test]
fn conflicting_content_types_from_upstream_give_502() {
    let up = StubUpstream::fixed(response(
        "200 OK",
        &[("Content-Type", "application/json"), ("content-type", "text/event-stream")],
        OK_JSON,
    ));
    let p = start(&up);
    assert_jsonrpc_error(&exchange(&p, &post(&p, &[], PING)), 502);
}

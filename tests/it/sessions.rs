//! MCP sessions and HTTP/1.1 connection lifecycle through the proxy: exactly
//! one `Mcp-Session-Id` line whatever case or repetition the upstream uses
//! (the agentchattr cases), the initialize / initialized / tools/list / DELETE
//! lifecycle, client keep-alive and pipelining, and upstream connection reuse.

use std::io::Write;
use std::net::Shutdown;
use std::time::Duration;

use crate::support::exchange::{
    assert_healthy, assert_jsonrpc_error, chunk, client, exchange, host, ok_upstream, OK_JSON, PING,
};
use crate::support::setup::{
    assert_credentials, post, start, start_with, INITIALIZE, INITIALIZED, INIT_RESULT, SESSION, TOOLS_LIST,
    TOOLS_RESULT,
};
use crate::support::wire::{contains, request, response, Next, Req, Resp, StubUpstream};

// The agentchattr regression cases (maxlamagna/agentchattr 60fdb98
// tests/test_mcp_proxy.py): whatever case or repetition the upstream uses
// for `Mcp-Session-Id`, the client sees exactly one line.

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
    // MCP 2025-11-25 Streamable HTTP, session management: the server assigns
    // the session id in its initialize response, so the initialize reaches
    // the upstream without a session header.
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

// A client EOF mid-exchange is an abort (the upstream side closes at
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
    // The aborted POST may or may not have reached the upstream before the
    // proxy saw the FIN; let the stub finish recording it (count stable for
    // 300 ms) so the healthy request below is counted alone.
    let mut seen = up.request_count();
    let settle = std::time::Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = up.request_count();
        if now == seen || settle.elapsed() > Duration::from_secs(3) {
            break;
        }
        seen = now;
    }
    assert!(seen <= 1, "the aborted request reached the upstream {seen} times");
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

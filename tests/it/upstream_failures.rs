//! A failing upstream gets a JSON-RPC error answer and never wedges the proxy:
//! refused connections (502, retried connect), silence (504), garbage,
//! interim-only, truncated, oversized or conflicting responses (502), and an
//! open stream that stays silent past `--idle-timeout`.

use std::io::Write;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::exchange::{
    assert_healthy, assert_jsonrpc_error, chunk, client, exchange, host, OK_JSON, PING,
};
use crate::support::setup::{dead_port, post, start, start_url, start_with, SSE_HEAD, TOKEN};
use crate::support::wire::{contains, request, response, Next, StubUpstream};

#[test]
fn refused_upstream_gives_json_502_within_three_seconds() {
    let port = dead_port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let p = start_url(&url, &[]);
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
    let p = start_url(&url, &[]);
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

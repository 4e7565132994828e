//! Upstream faults: invalid heads and chunk sizes, cuts, extra bytes, interim floods, death mid-stream.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{assert_alive, start, start_url, SSE_HEAD};
use crate::support::exchange::{
    assert_healthy, assert_jsonrpc_error, chunk, client, exchange, host, json_post as post, ok_response,
    OK_JSON, PING,
};
use crate::support::wire::{contains, request, response, Next, StubUpstream};

/// An upstream that answers `/fault` with `fault` and records whether the
/// proxy then closed that upstream connection; everything else gets 200.
pub(super) fn faulty_upstream(fault: Vec<u8>) -> (StubUpstream, Arc<Mutex<Vec<bool>>>) {
    let dropped = Arc::new(Mutex::new(Vec::new()));
    let d = dropped.clone();
    let up = StubUpstream::start(move |req, s| {
        if req.target != "/fault" {
            let _ = s.write_all(&ok_response());
            return Next::KeepAlive;
        }
        let _ = s.write_all(&fault);
        // Did the proxy drop this connection (EOF or reset within 3 s)?
        let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
        let mut b = [0u8; 1024];
        let closed = loop {
            match s.read(&mut b) {
                Ok(0) => break true,
                Ok(_) => break false, // another request on a poisoned connection
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => break e.kind() == ErrorKind::ConnectionReset,
            }
        };
        d.lock().unwrap().push(closed);
        Next::Close
    });
    (up, dropped)
}

#[track_caller]
fn assert_upstream_dropped(dropped: &Arc<Mutex<Vec<bool>>>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(4);
    while dropped.lock().unwrap().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(*dropped.lock().unwrap(), vec![true], "upstream connection not dropped after {what}");
}

/// Each fault answered before any head byte reached the client: 502, the
/// upstream connection dropped, the proxy healthy after.
#[test]
fn invalid_upstream_response_heads_give_502_and_drop_the_connection() {
    let many_fields: String = (0..150).map(|i| format!("X-U{i}: v\r\n")).collect();
    let faults: Vec<(&str, Vec<u8>)> = vec![
        ("two-digit status", b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\n{}".to_vec()),
        ("status 600", b"HTTP/1.1 600 Nope\r\nContent-Length: 2\r\n\r\n{}".to_vec()),
        ("status 099", b"HTTP/1.1 099 Low\r\nContent-Length: 2\r\n\r\n{}".to_vec()),
        ("letters in status", b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}".to_vec()),
        ("HTTP/2 status line", b"HTTP/2 200 OK\r\nContent-Length: 2\r\n\r\n{}".to_vec()),
        ("ICY status line", b"ICY 200 OK\r\nContent-Length: 2\r\n\r\n{}".to_vec()),
        ("NUL in status line", b"HTTP/1.1 200 O\0K\r\nContent-Length: 2\r\n\r\n{}".to_vec()),
        ("negative content-length", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{}".to_vec()),
        ("content-length 1x", b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n{}".to_vec()),
        ("content-length +2", b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}".to_vec()),
        (
            "content-length overflow",
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n{}".to_vec(),
        ),
        ("content-length list 2, 3", b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\n{}x".to_vec()),
        (
            "two content-lengths",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x".to_vec(),
        ),
        (
            "two different locations",
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /a\r\nLocation: /b\r\nContent-Length: 0\r\n\r\n"
                .to_vec(),
        ),
        (
            "two different session ids",
            b"HTTP/1.1 200 OK\r\nMcp-Session-Id: a\r\nMCP-Session-Id: b\r\nContent-Length: 2\r\n\r\n{}"
                .to_vec(),
        ),
        (
            "obs-fold in response",
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\n  folded\r\nContent-Length: 2\r\n\r\n{}".to_vec(),
        ),
        ("space before colon", b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\n{}".to_vec()),
        (
            "CR in a value",
            b"HTTP/1.1 200 OK\r\nX-A: 1\rSet-Cookie: x=1\r\nContent-Length: 2\r\n\r\n{}".to_vec(),
        ),
        ("150 fields", format!("HTTP/1.1 200 OK\r\n{many_fields}Content-Length: 2\r\n\r\n{{}}").into_bytes()),
    ];
    for (what, fault) in faults {
        let (up, dropped) = faulty_upstream(fault);
        let p = start(&up);
        let resp = exchange(&p, &request("GET", "/fault", &host(&p), &[], b""));
        assert_eq!(resp.status, 502, "{what}: {:?}", resp.raw_text());
        assert_jsonrpc_error(&resp, 502);
        assert_upstream_dropped(&dropped, what);
        assert_healthy(&p, &up);
    }
}

/// A chunked body whose framing breaks after the head went out: the client
/// connection closes without a terminating chunk (or a 502 if the proxy had
/// not relayed the head yet); the upstream connection is dropped.
#[test]
fn invalid_upstream_chunk_sizes_are_never_relayed_as_a_complete_body() {
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let bodies: Vec<(&str, &[u8])> = vec![
        // `Z` marks bytes past the framing error: never relayed.
        ("non-hex size", b"5\r\nhello\r\nzz\r\nZZ\r\n0\r\n\r\n"),
        ("negative size", b"5\r\nhello\r\n-1\r\nZZ\r\n0\r\n\r\n"),
        ("size overflow", b"5\r\nhello\r\n1ffffffffffffffffff\r\nZZ\r\n0\r\n\r\n"),
        ("empty size line", b"5\r\nhello\r\n\r\nZZ\r\n0\r\n\r\n"),
        ("data longer than size", b"5\r\nhello\r\n2\r\nxxZZ\r\n0\r\n\r\n"),
        ("0x prefix", b"5\r\nhello\r\n0x2\r\nZZ\r\n0\r\n\r\n"),
        ("space inside size", b"5\r\nhello\r\n1 1\r\nZZ\r\n0\r\n\r\n"),
    ];
    for (what, body) in bodies {
        let mut fault = head.clone();
        fault.extend_from_slice(body);
        let (up, dropped) = faulty_upstream(fault);
        let p = start(&up);
        let mut c = client(&p);
        c.send(&request("GET", "/fault", &host(&p), &[], b""));
        let resp_head = c.read_head();
        if resp_head.status == 200 {
            assert!(
                c.closed_within(Duration::from_secs(3)),
                "{what}: client left open (body presented as complete?) after {:?}; proxy stderr:\n{}",
                String::from_utf8_lossy(c.unread()),
                p.stderr_text()
            );
            assert!(
                !contains(c.unread(), b"0\r\n\r\n"),
                "{what}: invalid upstream body relayed as complete: {:?}",
                String::from_utf8_lossy(c.unread())
            );
            assert!(
                !contains(c.unread(), b"Z"),
                "{what}: bytes past the framing error relayed: {:?}",
                String::from_utf8_lossy(c.unread())
            );
        } else {
            assert_eq!(resp_head.status, 502, "{what}: {:?}", resp_head.raw_text());
        }
        assert_upstream_dropped(&dropped, what);
        assert_healthy(&p, &up);
    }
}

#[test]
fn upstream_closing_mid_body_closes_the_client_without_completing_it() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("content-length", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\":\"2.0\",".to_vec()),
        ("chunked, between chunks", {
            let mut v = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            v.extend(chunk(b"data: one\n\n"));
            v
        }),
        ("chunked, inside a chunk", {
            let mut v = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            v.extend_from_slice(b"100\r\npartial");
            v
        }),
        ("chunked, inside the trailer", {
            let mut v = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            v.extend(chunk(b"whole"));
            v.extend_from_slice(b"0\r\nX-Trailer: cut");
            v
        }),
    ];
    for (what, partial) in cases {
        let up = StubUpstream::start(move |req, s| {
            if req.target == "/cut" {
                let _ = s.write_all(&partial);
                std::thread::sleep(Duration::from_millis(100));
                Next::Close
            } else {
                let _ = s.write_all(&ok_response());
                Next::KeepAlive
            }
        });
        let p = start(&up);
        let mut c = client(&p);
        c.send(&request("GET", "/cut", &host(&p), &[], b""));
        let head = c.read_head();
        assert_eq!(head.status, 200, "{what}: {:?}", head.raw_text());
        assert!(c.closed_within(Duration::from_secs(3)), "{what}: client left hanging after upstream closed");
        let got = c.unread().to_vec();
        if head.has("transfer-encoding") {
            assert!(
                crate::support::wire::decode_chunked(&got).is_none(),
                "{what}: truncated body presented as complete: {:?}",
                String::from_utf8_lossy(&got)
            );
        } else if let Some(len) = head.all("content-length").first() {
            assert!(got.len() < len.parse::<usize>().unwrap(), "{what}: {:?}", String::from_utf8_lossy(&got));
        } else {
            panic!("{what}: response without framing for a truncated body: {:?}", head.raw_text());
        }
        assert_healthy(&p, &up);
    }
}

#[test]
fn extra_bytes_after_an_upstream_response_never_reach_the_next_request() {
    // The upstream sends its response plus a second, unsolicited one. A proxy
    // that pools the connection with those bytes pending would hand
    // "SMUGGLED" to the next request.
    let mut fault = ok_response();
    fault.extend_from_slice(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\nSMUGGLED",
    );
    let up = StubUpstream::start(move |req, s| {
        if req.target == "/extra" {
            let _ = s.write_all(&fault);
        } else {
            let _ = s.write_all(&response("200 OK", &[("Content-Type", "application/json")], b"\"honest\""));
        }
        Next::KeepAlive
    });
    let p = start(&up);
    let mut c = client(&p);
    c.send(&request("GET", "/extra", &host(&p), &[], b""));
    let first = c.read_response("GET");
    assert_eq!(first.body, OK_JSON, "{:?}", first.raw_text());
    for i in 0..3 {
        c.send(&request("GET", "/next", &host(&p), &[], b""));
        let next = c.read_response("GET");
        assert_eq!(next.status, 200, "request {i}: {:?}", next.raw_text());
        assert_eq!(
            next.text(),
            "\"honest\"",
            "request {i} got another response's body: {:?}",
            next.raw_text()
        );
    }
}

#[test]
fn body_sent_by_upstream_after_a_head_response_never_reaches_the_next_request() {
    // A HEAD response has no body whatever its Content-Length (RFC 9112
    // §6.3); bytes the upstream sends anyway must not become the next
    // response.
    let up = StubUpstream::start(|req, s| {
        if req.method == "HEAD" {
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 44\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED",
            );
        } else {
            let _ = s.write_all(&response("200 OK", &[("Content-Type", "application/json")], b"\"honest\""));
        }
        Next::KeepAlive
    });
    let p = start(&up);
    let mut c = client(&p);
    c.send(&request("HEAD", "/mcp", &host(&p), &[], b""));
    assert_eq!(c.read_response("HEAD").status, 200);
    for i in 0..3 {
        c.send(&request("GET", "/next", &host(&p), &[], b""));
        let next = c.read_response("GET");
        assert_eq!(
            next.text(),
            "\"honest\"",
            "request {i} got another response's body: {:?}",
            next.raw_text()
        );
    }
}

#[test]
fn flood_of_interim_responses_from_upstream_does_not_wedge_the_proxy() {
    let up = StubUpstream::start(|req, s| {
        if req.target == "/flood" {
            let mut out = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(20_000);
            out.extend(ok_response());
            let _ = s.write_all(&out);
        } else {
            let _ = s.write_all(&ok_response());
        }
        Next::KeepAlive
    });
    let mut p = start(&up);
    let t0 = Instant::now();
    let mut c = client(&p);
    c.send(&request("GET", "/flood", &host(&p), &[], b""));
    let mut resp = c.read_response("GET");
    let mut interim = 0;
    while (100..200).contains(&resp.status) {
        interim += 1;
        resp = c.read_response("GET");
    }
    if resp.status == 200 {
        assert_eq!(resp.body, OK_JSON, "{:?}", resp.raw_text());
    } else {
        assert_jsonrpc_error(&resp, 502);
    }
    assert!(interim <= 1, "{interim} interim responses relayed to the client");
    assert!(t0.elapsed() < Duration::from_secs(3), "20,000 interim responses took {:?}", t0.elapsed());
    assert_alive(&mut p);
    assert_healthy(&p, &up);
}

/// A stoppable upstream "process": serves SSE on `listener` until `stop`,
/// then closes every connection and the listener.
fn dying_sse_upstream(listener: TcpListener, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let mut conns: Vec<TcpStream> = Vec::new();
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            if let Ok((s, _)) = listener.accept() {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let mut s = s;
                let mut buf = Vec::new();
                let mut b = [0u8; 4096];
                while !contains(&buf, b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => buf.extend_from_slice(&b[..k]),
                    }
                }
                let _ = s.write_all(SSE_HEAD);
                conns.push(s);
            }
            for s in &mut conns {
                let _ = s.write_all(&chunk(format!("data: tick-{n}\n\n").as_bytes()));
            }
            n += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        for s in &conns {
            let _ = s.shutdown(Shutdown::Both);
        }
        drop(conns);
        drop(listener);
    })
}

#[test]
fn upstream_dying_mid_stream_and_coming_back_serves_new_requests() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let first = dying_sse_upstream(listener, stop.clone());
    let p = start_url(&format!("http://127.0.0.1:{port}/mcp"), &[], &[]);
    let mut c = client(&p);
    c.send(&request("GET", "/mcp", &host(&p), &[("Accept", "text/event-stream")], b""));
    assert_eq!(c.read_head().status, 200);
    let (seen, got) = c.read_until(b"tick-2", Duration::from_secs(3));
    assert!(seen.is_some(), "stream did not flow: {:?}", String::from_utf8_lossy(&got));
    stop.store(true, Ordering::SeqCst);
    first.join().unwrap();
    assert!(c.closed_within(Duration::from_secs(3)), "client stream left open after the upstream died");
    assert!(
        !contains(c.unread(), b"\r\n0\r\n\r\n"),
        "a stream cut by the upstream's death was presented as complete"
    );
    // Upstream down: a JSON 502, not a hang.
    let resp = exchange(&p, &post(&host(&p), &[], PING));
    assert_jsonrpc_error(&resp, 502);
    // It comes back on the same port (std sets SO_REUSEADDR on Unix).
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("rebind the upstream port");
    let up = StubUpstream::on(listener, |_, s| {
        let _ = s.write_all(&ok_response());
        Next::KeepAlive
    });
    assert_healthy(&p, &up);
    assert_healthy(&p, &up);
}

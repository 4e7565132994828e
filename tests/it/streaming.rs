//! Open responses stream: SSE events reach the client as the upstream sends
//! them, a close-delimited stream is re-framed as chunked, a client leaving
//! mid-stream frees the upstream connection, and an open stream or a slow
//! reader never blocks other clients.

use std::io::Write;
use std::net::Shutdown;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::exchange::{chunk, client, exchange, host, OK_JSON, PING};
use crate::support::setup::{post, start, SESSION, SSE_HEAD};
use crate::support::wire::{contains, request, response, Next, RawClient, StubUpstream};

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

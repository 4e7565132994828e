//! Pipelined garbage after a valid request, and a client that stops reading a fast SSE stream.

#[cfg(target_os = "linux")]
use std::io::{ErrorKind, Write};
#[cfg(target_os = "linux")]
use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(target_os = "linux")]
use std::sync::Arc;
use std::time::Duration;
#[cfg(target_os = "linux")]
use std::time::Instant;

use super::start;
#[cfg(target_os = "linux")]
use super::{assert_alive, SSE_HEAD};
use crate::support::exchange::{
    assert_healthy, assert_jsonrpc_error, client, host, json_post as post, ok_upstream, OK_JSON, PING,
};
#[cfg(target_os = "linux")]
use crate::support::exchange::{chunk, ok_response};
#[cfg(target_os = "linux")]
use crate::support::procfs::rss_kib;
#[cfg(target_os = "linux")]
use crate::support::wire::{request, Next, StubUpstream};

#[test]
fn pipelined_garbage_after_a_valid_request_gets_400_and_the_connection_closes() {
    let up = ok_upstream();
    let p = start(&up);
    let mut all = post(&host(&p), &[], PING);
    all.extend_from_slice(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage \xff\xfe\r\n\r\n");
    let mut c = client(&p);
    c.send(&all);
    let first = c.read_response("POST");
    assert_eq!(first.status, 200, "{:?}", first.raw_text());
    assert_eq!(first.body, OK_JSON);
    let second = c.read_response("GET");
    assert_jsonrpc_error(&second, 400);
    assert!(c.closed_within(Duration::from_secs(3)), "connection open after garbage");
    assert!(c.unread().is_empty(), "bytes after the 400: {:?}", String::from_utf8_lossy(c.unread()));
    assert_eq!(up.request_count(), 1);
    assert_healthy(&p, &up);
}

#[cfg(target_os = "linux")]
#[test]
fn client_that_stops_reading_a_fast_sse_stream_keeps_proxy_memory_bounded() {
    let pushed = Arc::new(AtomicUsize::new(0));
    let pu = pushed.clone();
    let up = StubUpstream::start(move |req, s| {
        if req.target != "/firehose" {
            let _ = s.write_all(&ok_response());
            return Next::KeepAlive;
        }
        let _ = s.write_all(SSE_HEAD);
        let event = chunk(format!("event: message\ndata: {}\n\n", "x".repeat(16 * 1024)).as_bytes());
        let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            match s.write(&event) {
                Ok(n) => {
                    pu.fetch_add(n, Ordering::SeqCst);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        Next::Close
    });
    let mut p = start(&up);
    assert_healthy(&p, &up);
    let before = rss_kib(p.pid());
    let mut c = client(&p);
    c.send(&request("GET", "/firehose", &host(&p), &[("Accept", "text/event-stream")], b""));
    // Read nothing at all (not even the head) for 5 s, sampling the RSS.
    let t0 = Instant::now();
    let mut peak = before;
    while t0.elapsed() < Duration::from_millis(5200) {
        peak = peak.max(rss_kib(p.pid()));
        std::thread::sleep(Duration::from_millis(100));
    }
    let growth = peak.saturating_sub(before);
    let pushed = pushed.load(Ordering::SeqCst);
    println!(
        "slow SSE reader: proxy VmRSS before {before} KiB, peak {peak} KiB, growth {growth} KiB; \
         upstream pushed {} KiB in 5 s",
        pushed / 1024
    );
    assert!(pushed > 1024 * 1024, "upstream pushed only {pushed} bytes: the test measured nothing");
    assert!(growth < 16 * 1024, "proxy RSS grew {growth} KiB behind a client that reads nothing");
    // The stuck client is not corrupted: what it reads is a valid stream.
    let head = c.read_head();
    assert_eq!(head.status, 200, "{:?}", head.raw_text());
    drop(c);
    assert_alive(&mut p);
    assert_healthy(&p, &up);
}

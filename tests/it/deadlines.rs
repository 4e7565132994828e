//! Slow clients are cut off: a request's head and body must arrive within
//! `--request-timeout` of its first byte (a byte does not extend it), an idle
//! keep-alive connection closes after `--keepalive-timeout`, and only open
//! responses get the long `--idle-timeout`. Well-behaved clients keep being
//! served meanwhile.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::exchange::{client, exchange, host, json_post, ok_upstream, OK_JSON, PING};
use crate::support::proxy_process::ProxyProcess;
use crate::support::wire::{request, Next, RawClient, StubUpstream};

const TOKEN: &str = "tok-DEADLINES-1";
const REQUEST_TIMEOUT: u64 = 2;

/// The proxy answers 408 with a JSON-RPC error and closes, within the
/// request deadline plus one second of `first_byte`.
#[track_caller]
fn assert_cut_off_with_408(c: &mut RawClient, first_byte: Instant, what: &str) {
    let limit = Duration::from_secs(REQUEST_TIMEOUT + 1);
    let closed = c.closed_within(limit.saturating_sub(first_byte.elapsed()) + Duration::from_millis(50));
    let elapsed = first_byte.elapsed();
    let got = String::from_utf8_lossy(c.unread()).into_owned();
    assert!(closed, "{what}: still open after {elapsed:?}; got {got:?}");
    assert!(elapsed <= limit + Duration::from_millis(300), "{what}: closed only after {elapsed:?}");
    assert!(got.starts_with("HTTP/1.1 408 "), "{what}: got {got:?}");
    assert!(got.contains("application/json") && got.contains("\"code\":-32600"), "{what}: got {got:?}");
}

#[test]
fn slow_clients_are_cut_off_at_the_request_deadline_while_others_are_served() {
    let up = ok_upstream();
    let p = ProxyProcess::builder(up.url())
        .agent("a")
        .token(TOKEN)
        .arg("--request-timeout", REQUEST_TIMEOUT.to_string())
        .start();
    let h = host(&p);

    // 50 well-behaved clients keep making requests the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..50)
        .map(|_| {
            let (stop, served, addr, h) = (stop.clone(), served.clone(), p.addr(), h.clone());
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let s = TcpStream::connect(addr).expect("connect");
                    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut c = RawClient::new(s);
                    c.send(&json_post(&h, &[], PING));
                    let resp = c.read_response("POST");
                    if resp.status == 200 && resp.body == OK_JSON {
                        served.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failures.push(resp.raw_text());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                failures
            })
        })
        .collect();

    // Half a head, then nothing.
    let mut half = client(&p);
    let t_half = Instant::now();
    half.send(format!("POST /mcp HTTP/1.1\r\nHost: {h}\r\nContent-Ty").as_bytes());

    // A whole head, ten bytes of a 100-byte body, then nothing.
    let mut stalled = client(&p);
    let t_stalled = Instant::now();
    let mut raw =
        request("POST", "/mcp", &h, &[("Content-Type", "application/json"), ("Content-Length", "100")], b"");
    raw.extend_from_slice(b"{\"jsonrpc\"");
    stalled.send(&raw);

    // A head dripped one byte every 200 ms (it would take 15 s).
    let head = json_post(&h, &[], PING);
    let drip = TcpStream::connect(p.addr()).expect("connect");
    drip.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut writer = drip.try_clone().unwrap();
    let t_drip = Instant::now();
    let dripper = std::thread::spawn(move || {
        for b in head.iter().take(75) {
            if writer.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let mut drip = RawClient::new(drip);

    assert_cut_off_with_408(&mut half, t_half, "half a head");
    assert_cut_off_with_408(&mut stalled, t_stalled, "stalled body");
    assert_cut_off_with_408(&mut drip, t_drip, "dripped head");
    let _ = dripper.join();

    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let failures = w.join().expect("worker");
        assert!(failures.is_empty(), "a well-behaved client was not served: {failures:?}");
    }
    assert!(served.load(Ordering::Relaxed) >= 50, "only {} requests served", served.load(Ordering::Relaxed));
    assert_eq!(up.request_count(), served.load(Ordering::Relaxed), "a slow request reached the upstream");
}

#[test]
fn four_mib_body_at_full_speed_is_not_cut_off() {
    let up = ok_upstream();
    let p = ProxyProcess::builder(up.url()).agent("a").token(TOKEN).arg("--request-timeout", "1").start();
    let mut body = br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":""#.to_vec();
    body.extend(std::iter::repeat(b'x').take(4 * 1024 * 1024));
    body.extend_from_slice(b"\"}}");
    let resp = exchange(&p, &json_post(&host(&p), &[], &body));
    assert_eq!(resp.status, 200, "{:?}", String::from_utf8_lossy(&resp.raw[..resp.raw.len().min(300)]));
    assert_eq!(up.only_request().body, body);
}

#[test]
fn idle_keep_alive_connection_closes_after_keepalive_timeout_without_an_answer() {
    let up = ok_upstream();
    let p = ProxyProcess::builder(up.url())
        .agent("a")
        .token(TOKEN)
        .arg("--keepalive-timeout", "2")
        .arg("--request-timeout", "1")
        .start();
    let mut c = client(&p);
    c.send(&json_post(&host(&p), &[], PING));
    assert_eq!(c.read_response("POST").status, 200);
    let t0 = Instant::now();
    // Idle longer than the request timeout: not cut by it (no request is
    // under way), but by the keep-alive timeout.
    assert!(c.closed_within(Duration::from_secs(5)), "idle connection still open");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(1800) && waited < Duration::from_secs(4),
        "closed after {waited:?}"
    );
    assert!(c.unread().is_empty(), "an idle close sent bytes: {:?}", String::from_utf8_lossy(c.unread()));
    // A fresh connection that never sends a byte is idle too.
    let mut silent = client(&p);
    let t0 = Instant::now();
    assert!(silent.closed_within(Duration::from_secs(5)));
    assert!(t0.elapsed() >= Duration::from_millis(1800), "closed after {:?}", t0.elapsed());
}

#[test]
fn a_request_moves_the_keepalive_deadline_later() {
    // The loop keeps a connection's earlier deadline when a request moves it
    // later (`event_loop/timers.rs`): when that earlier one comes up, the
    // connection must stay open until its own.
    let up = ok_upstream();
    let p = ProxyProcess::builder(up.url())
        .agent("a")
        .token(TOKEN)
        .arg("--keepalive-timeout", "2")
        .arg("--request-timeout", "1")
        .start();
    let mut c = client(&p);
    c.send(&json_post(&host(&p), &[], PING));
    assert_eq!(c.read_response("POST").status, 200);
    std::thread::sleep(Duration::from_millis(1200));
    c.send(&json_post(&host(&p), &[], PING));
    assert_eq!(c.read_response("POST").status, 200);
    let t1 = Instant::now();
    // The first request's deadline passes about 0.8 s from now.
    assert!(c.closed_within(Duration::from_secs(5)), "idle connection still open");
    let waited = t1.elapsed();
    assert!(
        waited >= Duration::from_millis(1800) && waited < Duration::from_secs(4),
        "closed {waited:?} after the second request, not 2 s"
    );
}

#[test]
fn quiet_open_stream_outlives_the_request_and_keepalive_timeouts() {
    // The upstream opens an SSE stream, stays quiet for 3 s, then sends an event.
    let up = StubUpstream::start(|_, s| {
        let _ = s.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        std::thread::sleep(Duration::from_secs(3));
        let event = b"event: message\ndata: {}\n\n";
        let _ = s.write_all(format!("{:x}\r\n", event.len()).as_bytes());
        let _ = s.write_all(event);
        let _ = s.write_all(b"\r\n0\r\n\r\n");
        Next::KeepAlive
    });
    let p = ProxyProcess::builder(up.url())
        .agent("a")
        .token(TOKEN)
        .arg("--request-timeout", "1")
        .arg("--keepalive-timeout", "1")
        .start();
    let mut c = client(&p);
    c.send(&request("GET", "/mcp", &host(&p), &[("Accept", "text/event-stream")], b""));
    let (seen, got) = c.read_until(b"data: {}", Duration::from_secs(6));
    assert!(seen.is_some(), "the quiet stream was cut: {:?}", String::from_utf8_lossy(&got));
}

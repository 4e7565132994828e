//! The adversarial suite: hostile clients (slowloris, floods, oversized or
//! smuggling requests), hostile upstreams (faults, floods, garbage), DNS
//! rebinding (Host and Origin checked), the exposed listener's client token,
//! limits, and secrets never leaking to logs or answers, against the real
//! binary. Every hostile exchange is followed by a healthy request on a new
//! connection that must succeed (sozu `h1_security_tests`).
//! The malformed-request table in `framing.rs` (CL+TE, two CLs, TE
//! `chunked, gzip`, obs-fold, space before colon, NUL, Host) is not
//! repeated here.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::exchange::{
    assert_healthy, assert_jsonrpc_error, chunk, chunked_post_head, client, exchange, host,
    json_post as post, ok_response, ok_upstream, OK_JSON, PING,
};
#[cfg(target_os = "linux")]
use crate::support::procfs::{fd_count, proc_stat, rss_kib};
use crate::support::proxy_process::{scratch_dir, token_file, ProxyProcess, BIN};
#[cfg(target_os = "linux")]
use crate::support::wire::RawClient;
use crate::support::wire::{contains, request, response, Next, Resp, StubUpstream};

const TOKEN: &str = "tok-HOSTILE-5e1f0c9a-SECRET";
const CLIENT_SECRET: &str = "client-secret-9b7d3e21-CLIENTSIDE";
const AGENT: &str = "claude-prime";

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache, no-transform\r\nTransfer-Encoding: chunked\r\n\r\n";

// ---------------------------------------------------------------- helpers

#[track_caller]
fn start_with(up: &StubUpstream, extra: &[&str], envs: &[(&str, &str)]) -> ProxyProcess {
    start_url(&up.url(), extra, envs)
}

/// This suite's identity (its own secret token) in front of `url`.
#[track_caller]
fn start_url(url: &str, extra: &[&str], envs: &[(&str, &str)]) -> ProxyProcess {
    let tf = token_file(TOKEN);
    let mut args = vec!["--upstream", url, "--agent", AGENT, "--token-file", tf.to_str().unwrap()];
    args.extend_from_slice(extra);
    ProxyProcess::start(&args, envs)
}

#[track_caller]
fn start(up: &StubUpstream) -> ProxyProcess {
    start_with(up, &[], &[])
}

/// Write all of `bytes`, ignoring a peer that stops reading or closes: a
/// hostile client keeps going whatever the proxy does.
fn write_ignoring_errors(s: &mut TcpStream, bytes: &[u8]) -> usize {
    let mut done = 0;
    while done < bytes.len() {
        match s.write(&bytes[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    done
}

/// Send `raw`, expect a JSON error with `status`, nothing upstream, a closed
/// connection (for 4xx that end the connection), then a healthy request.
#[track_caller]
fn assert_refused(p: &ProxyProcess, up: &StubUpstream, raw: &[u8], status: u16, must_close: bool) -> Resp {
    let (reqs, conns) = (up.request_count(), up.connections());
    let mut c = client(p);
    write_ignoring_errors(&mut c.stream, raw);
    let resp = c.read_response("GET");
    let shown = String::from_utf8_lossy(&raw[..raw.len().min(200)]).into_owned();
    assert_jsonrpc_error(&resp, status);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(up.request_count(), reqs, "refused request {shown:?} reached upstream: {:#?}", up.requests());
    assert_eq!(up.connections(), conns, "refused request {shown:?} made the proxy connect upstream");
    if must_close {
        assert!(
            c.closed_within(Duration::from_secs(3)),
            "connection still open after {status} for {shown:?}"
        );
    }
    assert_healthy(p, up);
    resp
}

// The descriptor-limit helpers are Linux-only (prlimit), and so are the
// tests built on them and on the /proc readers.

#[track_caller]
fn assert_alive(p: &mut ProxyProcess) {
    assert!(p.is_running(), "proxy died; stderr:\n{}", p.stderr_text());
}

/// Raise this process's soft RLIMIT_NOFILE to its hard limit (children
/// inherit it); returns the new soft limit.
#[cfg(target_os = "linux")]
fn raise_fd_limit() -> libc::rlim_t {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain getrlimit/setrlimit on a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit { rlim_cur: rl.rlim_max, rlim_max: rl.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                rl.rlim_cur = rl.rlim_max;
            }
        }
    }
    rl.rlim_cur
}

/// Set another process's soft RLIMIT_NOFILE (hard limit unchanged).
#[cfg(target_os = "linux")]
fn set_fd_soft_limit(pid: u32, soft: libc::rlim_t) {
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit on a child of ours with valid structs.
    unsafe {
        assert_eq!(libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old), 0);
        let new = libc::rlimit { rlim_cur: soft, rlim_max: old.rlim_max };
        assert_eq!(
            libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()),
            0,
            "prlimit: {}",
            std::io::Error::last_os_error()
        );
    }
}

// ------------------------------------------------ limits

#[test]
fn head_of_128_kib_gets_431_and_nothing_reaches_upstream() {
    let up = ok_upstream();
    let p = start(&up);
    let big = "a".repeat(128 * 1024);
    let raw = format!("GET /mcp HTTP/1.1\r\nHost: {}\r\nX-Big: {big}\r\n\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 431, true);
}

#[test]
fn head_that_never_ends_gets_431_once_past_64_kib() {
    // No blank line ever: the proxy must answer at the limit, not wait.
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    let t0 = Instant::now();
    c.send(format!("GET /mcp HTTP/1.1\r\nHost: {}\r\n", host(&p)).as_bytes());
    let line = format!("X-Filler: {}\r\n", "f".repeat(1000));
    let mut sent = 0;
    while sent < 80 * 1024 {
        if write_ignoring_errors(&mut c.stream, line.as_bytes()) < line.len() {
            break;
        }
        sent += line.len();
    }
    let resp = c.read_response("GET");
    assert_jsonrpc_error(&resp, 431);
    assert!(t0.elapsed() < Duration::from_secs(3), "431 took {:?}", t0.elapsed());
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn head_with_200_fields_gets_431_and_nothing_reaches_upstream() {
    let up = ok_upstream();
    let p = start(&up);
    let fields: String = (0..200).map(|i| format!("X-F{i}: v\r\n")).collect();
    let raw = format!("GET /mcp HTTP/1.1\r\nHost: {}\r\n{fields}\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 431, true);
}

#[test]
fn body_of_16_mib_gets_413_while_the_client_is_still_sending_it() {
    let up = ok_upstream();
    let p = start(&up);
    let total = 16 * 1024 * 1024;
    let mut c = client(&p);
    c.send(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {total}\r\n\r\n",
            host(&p)
        )
        .as_bytes(),
    );
    // The client keeps sending at ~5 MiB/s (16 MiB would take >3 s).
    let written = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut w = c.stream.try_clone().unwrap();
    let (wr, st) = (written.clone(), stop.clone());
    let writer = std::thread::spawn(move || {
        let piece = vec![b' '; 256 * 1024];
        while wr.load(Ordering::SeqCst) < total && !st.load(Ordering::SeqCst) {
            let n = write_ignoring_errors(&mut w, &piece);
            wr.fetch_add(n, Ordering::SeqCst);
            if n < piece.len() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let t0 = Instant::now();
    let resp = c.read_response("POST");
    let at = written.load(Ordering::SeqCst);
    let took = t0.elapsed();
    stop.store(true, Ordering::SeqCst);
    assert_jsonrpc_error(&resp, 413);
    assert!(took < Duration::from_secs(2), "413 took {took:?}");
    assert!(at < total / 2, "413 came only after {at} of {total} body bytes were sent");
    assert!(c.closed_within(Duration::from_secs(5)), "connection kept open after 413 for an unread body");
    writer.join().unwrap();
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn body_of_16_mib_with_expect_100_continue_gets_413_and_no_100() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        host(&p),
        16 * 1024 * 1024
    );
    let mut c = client(&p);
    c.send(raw.as_bytes());
    let resp = c.read_response("POST");
    assert_jsonrpc_error(&resp, 413);
    assert!(c.closed_within(Duration::from_secs(3)), "connection kept open after 413 for an unsent body");
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn chunked_body_growing_past_8_mib_gets_413() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    c.send(&chunked_post_head(&p));
    let mut w = c.stream.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let piece = chunk(&vec![b' '; 1024 * 1024]);
        let mut sent = 0;
        for _ in 0..12 {
            if write_ignoring_errors(&mut w, &piece) < piece.len() {
                break;
            }
            sent += 1;
        }
        sent
    });
    let resp = c.read_response("POST");
    assert_jsonrpc_error(&resp, 413);
    assert!(c.closed_within(Duration::from_secs(5)), "connection kept open after 413");
    let sent = writer.join().unwrap();
    assert!(sent >= 8, "413 before 8 MiB of chunks were sent ({sent} MiB)");
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn chunk_extension_of_10_kib_gets_400() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2;x={}\r\n{{}}\r\n0\r\n\r\n",
        host(&p),
        "e".repeat(10 * 1024)
    );
    let mut c = client(&p);
    write_ignoring_errors(&mut c.stream, raw.as_bytes());
    let resp = c.read_response("POST");
    assert!(resp.status == 400 || resp.status == 413, "{:?}", resp.raw_text());
    assert_jsonrpc_error(&resp, resp.status);
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

/// RFC 9112 §7.1: `chunk-size = 1*HEXDIG`, then only `BWS ";"` may start
/// an extension. A tracker that reads `0x5` as a last chunk with extension
/// `x5` ends the body early and reads the rest as trailers.
#[test]
fn chunk_size_with_junk_after_the_digits_gets_400() {
    let up = ok_upstream();
    let p = start(&up);
    // text/plain: not a JSON body the stamper would refuse for its own reasons.
    for size_line in ["0x5", "5 5", "5zz", "5\""] {
        let raw = format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n{size_line}\r\nhello\r\n0\r\n\r\n",
            host(&p)
        );
        assert_refused(&p, &up, raw.as_bytes(), 400, true);
    }
}

#[test]
fn cr_inside_a_field_value_gets_400() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!("GET /mcp HTTP/1.1\r\nHost: {}\r\nX-Bad: a\rb\r\n\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 400, true);
}

#[test]
fn cr_smuggling_a_second_field_gets_400() {
    // `X-A: 1\rAuthorization: ...`: a parser that splits on a bare CR would
    // see a second field.
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!("GET /mcp HTTP/1.1\r\nHost: {}\r\nX-A: 1\rMcp-Session-Id: forged\r\n\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 400, true);
}

#[test]
fn nul_in_the_request_target_gets_400() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!("GET /mcp\0x HTTP/1.1\r\nHost: {}\r\n\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 400, true);
}

#[test]
fn invalid_character_in_field_name_gets_400() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!("GET /mcp HTTP/1.1\r\nHost: {}\r\nX(Bad): v\r\n\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 400, true);
}

#[test]
fn absolute_form_and_authority_form_targets_get_400() {
    let up = ok_upstream();
    let p = start(&up);
    let h = host(&p);
    for raw in [
        format!("GET http://evil.com/mcp HTTP/1.1\r\nHost: {h}\r\n\r\n"),
        format!("GET http://{h}/mcp HTTP/1.1\r\nHost: {h}\r\n\r\n"),
        format!("CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: {h}\r\n\r\n"),
    ] {
        assert_refused(&p, &up, raw.as_bytes(), 400, false);
    }
}

// ------------------------------------------------ slowloris and many connections

#[test]
fn slowloris_heads_do_not_stop_other_clients_being_served() {
    let up = ok_upstream();
    let p = start(&up);
    let h = host(&p);
    let slow_head = post(&h, &[], b"");
    let slow: Vec<TcpStream> = (0..20).map(|_| p.connect()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let loris = std::thread::spawn(move || {
        let mut slow = slow;
        let mut i = 0;
        while !st.load(Ordering::SeqCst) && i < slow_head.len() - 1 {
            for s in &mut slow {
                let _ = s.write_all(&slow_head[i..i + 1]);
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(500));
        }
        slow
    });
    std::thread::sleep(Duration::from_millis(600));
    let t0 = Instant::now();
    let mut c = client(&p);
    for i in 0..50 {
        if i % 10 == 0 {
            c = client(&p);
        }
        c.send(&post(&h, &[], PING));
        let resp = c.read_response("POST");
        assert_eq!(resp.status, 200, "request {i} among slowloris heads: {:?}", resp.raw_text());
    }
    let took = t0.elapsed();
    stop.store(true, Ordering::SeqCst);
    let mut slow = loris.join().unwrap();
    assert!(took < Duration::from_secs(5), "50 requests took {took:?} among 20 slow heads");
    // The slow heads are still incomplete: nothing answered, nothing relayed.
    assert_eq!(up.request_count(), 50);
    for s in &mut slow {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("a slow incomplete head got {other:?} before HEAD_TIMEOUT"),
        }
    }
    drop(slow);
    assert_healthy(&p, &up);
}

#[cfg(target_os = "linux")]
#[test]
fn two_thousand_idle_connections_opened_at_once_do_not_stop_a_healthy_request() {
    let limit = raise_fd_limit();
    assert!(limit >= 2200, "RLIMIT_NOFILE hard limit {limit} is too low for 2,000 connections");
    let up = ok_upstream();
    let mut p = start(&up);
    let t0 = Instant::now();
    // Eight openers in parallel: on this kernel an occasional SYN is
    // retransmitted after 1 s even against a plain accept loop, so
    // sequential connects would spend seconds waiting on those alone.
    let addr = p.addr();
    let openers: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                (0..250)
                    .map(|i| {
                        TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                            .unwrap_or_else(|e| panic!("connection {i} of opener {t}: {e}"))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let idle: Vec<TcpStream> = openers.into_iter().flat_map(|o| o.join().unwrap()).collect();
    assert_eq!(idle.len(), 2000);
    let opened = t0.elapsed();
    // Let the proxy accept them all (it holds one descriptor per connection).
    let deadline = Instant::now() + Duration::from_secs(10);
    while fd_count(p.pid()) < 2000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(fd_count(p.pid()) >= 2000, "proxy holds only {} descriptors", fd_count(p.pid()));
    let t1 = Instant::now();
    assert_healthy(&p, &up);
    let healthy = t1.elapsed();
    assert!(healthy < Duration::from_secs(1), "healthy request took {healthy:?} among 2000 idle connections");
    let (_, cpu0) = proc_stat(p.pid());
    std::thread::sleep(Duration::from_secs(1));
    let (_, cpu1) = proc_stat(p.pid());
    assert!(cpu1 - cpu0 < 0.3, "proxy used {:.2} s CPU in 1 s with 2000 idle connections", cpu1 - cpu0);
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fd_count(p.pid()) > 100 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(fd_count(p.pid()) <= 100, "proxy still holds {} descriptors", fd_count(p.pid()));
    assert_alive(&mut p);
    assert_healthy(&p, &up);
    println!(
        "2000 idle connections: opened in {opened:?}, healthy request in {healthy:?}, idle CPU {:.2} s/s",
        cpu1 - cpu0
    );
}

#[cfg(target_os = "linux")]
#[test]
fn proxy_at_its_descriptor_limit_neither_crashes_nor_spins_and_recovers() {
    let up = ok_upstream();
    let mut p = start(&up);
    set_fd_soft_limit(p.pid(), 64);
    assert_healthy(&p, &up);
    // The listen backlog is 128 (mio, as std): once the proxy stops
    // accepting, further connects time out, which is expected; keep trying
    // until 200 attempts or three consecutive timeouts.
    let mut conns: Vec<TcpStream> = Vec::new();
    let mut timeouts = 0;
    for _ in 0..200 {
        match TcpStream::connect_timeout(&p.addr(), Duration::from_millis(300)) {
            Ok(s) => {
                conns.push(s);
                timeouts = 0;
            }
            Err(_) => {
                timeouts += 1;
                if timeouts == 3 {
                    break;
                }
            }
        }
    }
    assert!(conns.len() > 100, "only {} connections opened", conns.len());
    std::thread::sleep(Duration::from_millis(500));
    // One of the accepted connections asks for something while the proxy has
    // no descriptor left for an upstream: a JSON error or a relay, no crash.
    let (_, cpu0) = proc_stat(p.pid());
    std::thread::sleep(Duration::from_secs(2));
    let (_, cpu1) = proc_stat(p.pid());
    assert_alive(&mut p);
    assert!(
        cpu1 - cpu0 < 0.5,
        "proxy used {:.2} s CPU in 2 s at its descriptor limit (spinning?); stderr tail:\n{}",
        cpu1 - cpu0,
        tail(&p.stderr_text(), 20)
    );
    let mut first = RawClient::new(conns[0].try_clone().unwrap());
    first.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    first.send(&post(&host(&p), &[], PING));
    let resp = first.read_response("POST");
    if resp.status != 200 {
        assert_jsonrpc_error(&resp, 502);
    }
    let stderr = p.stderr_text();
    assert!(
        stderr.contains("accept failed") || stderr.contains("connections open"),
        "the descriptor limit was never hit; stderr tail:\n{}",
        tail(&stderr, 20)
    );
    drop(first);
    drop(conns);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fd_count(p.pid()) > 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_alive(&mut p);
    assert_healthy(&p, &up);
    assert_healthy(&p, &up);
}

#[cfg(target_os = "linux")]
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ------------------------------------------------ pipelining and slow readers

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

// ------------------------------------------------ DNS rebinding (MCP 2025-11-25 transports: servers validate Origin)

#[test]
fn rebinding_hosts_get_403_before_any_upstream_contact() {
    let up = ok_upstream();
    let p = start(&up);
    let port = p.port;
    let other = if port == 65535 { port - 1 } else { port + 1 };
    for h in [
        format!("evil.com:{port}"),
        format!("127.0.0.1:{other}"),
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        format!("localhost.evil:{port}"),
        format!("localhost.:{port}"),
        format!("127.0.0.1.nip.io:{port}"),
        format!("127.0.0.1:0{port}"),
        format!("127.0.0.2:{port}"),
        format!("[::1]:{other}"),
        format!("user@127.0.0.1:{port}"),
        format!("127.0.0.1:{port}/x"),
        format!("127.0.0.1:{port}:{port}"),
    ] {
        let raw = request("GET", "/mcp", &h, &[], b"");
        let resp = assert_refused(&p, &up, &raw, 403, false);
        assert!(!contains(&resp.raw, TOKEN.as_bytes()));
    }
}

#[test]
fn loopback_hosts_with_the_proxy_port_are_relayed() {
    let up = ok_upstream();
    let p = start(&up);
    let port = p.port;
    for h in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
    ] {
        let resp = exchange(&p, &request("GET", "/mcp", &h, &[], b""));
        assert_eq!(resp.status, 200, "Host {h}: {:?}", resp.raw_text());
    }
    assert_eq!(up.request_count(), 4);
}

#[test]
fn rebinding_origins_get_403_before_any_upstream_contact() {
    let up = ok_upstream();
    let p = start_with(&up, &["--allow-origin", "https://app.example"], &[]);
    for origin in [
        "http://evil.com",
        "null",
        "http://localhost:3000/path",
        "http://localhost:3000/",
        "http://user@localhost",
        "http://user:pw@localhost:3000",
        "file://",
        "ftp://localhost",
        "http://localhost.evil.com",
        "http://127.0.0.1.nip.io",
        "http://localhost:3000?x",
        "http://localhost#x",
        "https://app.example.evil",
        "https://app.example:8443",
        "http://app.example",
        "",
        "http://localhost, http://evil.com",
    ] {
        let raw = request("GET", "/mcp", &host(&p), &[("Origin", origin)], b"");
        assert_refused(&p, &up, &raw, 403, false);
    }
}

#[test]
fn loopback_and_listed_origins_are_relayed_and_not_forwarded() {
    let up = ok_upstream();
    let p = start_with(&up, &["--allow-origin", "https://app.example"], &[]);
    let origins = ["http://localhost:5173", "https://[::1]", "http://127.0.0.1:8080", "https://app.example"];
    for origin in origins {
        let resp = exchange(&p, &post(&host(&p), &[("Origin", origin)], PING));
        assert_eq!(resp.status, 200, "Origin {origin}: {:?}", resp.raw_text());
    }
    for req in up.wait_requests(origins.len(), Duration::from_secs(5)) {
        assert!(!req.head.has("origin"), "Origin forwarded upstream: {}", req.raw_text());
    }
}

#[test]
fn listed_origin_is_refused_without_allow_origin() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = request("GET", "/mcp", &host(&p), &[("Origin", "https://app.example")], b"");
    assert_refused(&p, &up, &raw, 403, false);
}

#[test]
fn two_origin_lines_are_refused() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = request(
        "GET",
        "/mcp",
        &host(&p),
        &[("Origin", "http://localhost:5173"), ("Origin", "http://evil.com")],
        b"",
    );
    let (reqs, conns) = (up.request_count(), up.connections());
    let resp = exchange(&p, &raw);
    assert!(resp.status == 400 || resp.status == 403, "{:?}", resp.raw_text());
    assert_jsonrpc_error(&resp, resp.status);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!((up.request_count(), up.connections()), (reqs, conns));
    assert_healthy(&p, &up);
}

// ------------------------------------------------ exposed listener (client token required off loopback)

#[test]
fn listening_on_all_interfaces_without_client_token_exits_2() {
    let up = ok_upstream();
    let tf = token_file(TOKEN);
    let mut child = Command::new(BIN)
        .args(["--upstream", &up.url(), "--agent", AGENT, "--token-file", tf.to_str().unwrap()])
        .args(["--listen", "0.0.0.0:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            panic!("proxy still running 5 s after --listen 0.0.0.0:0 without --client-token-file");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(2), "stdout {out:?} stderr {err:?}");
    assert!(!out.contains("MCP proxy: port"), "it listened anyway: {out:?}");
    assert!(err.contains("client-token"), "stderr does not say why: {err:?}");
    assert_eq!(up.connections(), 0);
}

fn client_token_file() -> std::path::PathBuf {
    let path = scratch_dir("client-token").join("secret");
    std::fs::write(&path, format!("{CLIENT_SECRET}\n")).unwrap();
    path
}

#[test]
fn exposed_listener_requires_the_client_secret_and_replaces_it_upstream() {
    let up = ok_upstream();
    let ct = client_token_file();
    let p = start_with(&up, &["--listen", "0.0.0.0:0", "--client-token-file", ct.to_str().unwrap()], &[]);
    let h = host(&p);
    let wrong_same_len: String = CLIENT_SECRET.chars().rev().collect();
    let near = format!("{CLIENT_SECRET}x");
    let cases: Vec<Vec<(&str, String)>> = vec![
        vec![],
        vec![("Authorization", "Bearer".to_string())],
        vec![("Authorization", "Bearer ".to_string())],
        vec![("Authorization", format!("Bearer {wrong_same_len}"))],
        vec![("Authorization", format!("Bearer {near}"))],
        vec![("Authorization", format!("Bearer {}", &CLIENT_SECRET[..CLIENT_SECRET.len() - 1]))],
        vec![("Authorization", format!("Basic {CLIENT_SECRET}"))],
        vec![("Authorization", CLIENT_SECRET.to_string())],
        vec![("X-Agent-Token", CLIENT_SECRET.to_string())],
        vec![("Authorization", format!("Bearer\t{CLIENT_SECRET}"))],
        vec![("Proxy-Authorization", format!("Bearer {CLIENT_SECRET}"))],
    ];
    let good = [("Authorization", format!("Bearer {CLIENT_SECRET}"))];
    let healthy = |p: &ProxyProcess| {
        let fields: Vec<(&str, &str)> = good.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let before = up.request_count();
        let resp = exchange(p, &post(&h, &fields, PING));
        assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
        assert_eq!(up.request_count(), before + 1);
    };
    for fields in &cases {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let (reqs, conns) = (up.request_count(), up.connections());
        let resp = exchange(&p, &post(&h, &fields, PING));
        assert_jsonrpc_error(&resp, 401);
        assert!(!contains(&resp.raw, CLIENT_SECRET.as_bytes()), "secret echoed: {:?}", resp.raw_text());
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!((up.request_count(), up.connections()), (reqs, conns), "{fields:?} reached upstream");
        healthy(&p);
    }
    // Right secret, other Host and lowercase scheme: relayed (the secret, not
    // the Host, is the guard here).
    let resp = exchange(
        &p,
        &post("mcp.example:1234", &[("Authorization", &format!("bearer  {CLIENT_SECRET}"))], PING),
    );
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    // Right secret but a foreign Origin: still 403.
    let resp = exchange(
        &p,
        &post(
            &h,
            &[("Authorization", &format!("Bearer {CLIENT_SECRET}")), ("Origin", "http://evil.com")],
            PING,
        ),
    );
    assert_jsonrpc_error(&resp, 403);
    healthy(&p);
    for req in up.requests() {
        assert_eq!(req.head.all("authorization"), vec![format!("Bearer {TOKEN}")], "{}", req.raw_text());
        assert_eq!(req.head.all("x-agent-token"), vec![TOKEN], "{}", req.raw_text());
        assert!(!contains(&req.raw, CLIENT_SECRET.as_bytes()), "client secret forwarded: {}", req.raw_text());
    }
}

// ------------------------------------------------ upstream faults

/// An upstream that answers `/fault` with `fault` and records whether the
/// proxy then closed that upstream connection; everything else gets 200.
fn faulty_upstream(fault: Vec<u8>) -> (StubUpstream, Arc<Mutex<Vec<bool>>>) {
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

// ------------------------------------------------ secrets

fn join<'a>(a: &[(&'a str, &'a str)], b: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut f = a.to_vec();
    f.extend_from_slice(b);
    f
}

/// The hostile sequence at RUST_LOG=trace, against a loopback proxy and an
/// exposed one with a client secret: neither the agent token nor the client
/// secret appears in stderr or in any response the client receives.
#[test]
fn token_and_client_secret_never_appear_in_trace_logs_or_error_bodies() {
    let (up, _) =
        faulty_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x".to_vec());
    let ct = client_token_file();
    let trace = [("RUST_LOG", "trace")];
    let mut plain = start_with(&up, &["--response-timeout", "1"], &trace);
    let mut exposed = start_with(
        &up,
        &["--listen", "0.0.0.0:0", "--client-token-file", ct.to_str().unwrap(), "--response-timeout", "1"],
        &trace,
    );
    let big = "a".repeat(70 * 1024);
    let many: Vec<String> = (0..150).map(|i| format!("X-F{i}")).collect();
    let many_fields: Vec<(&str, &str)> = many.iter().map(|n| (n.as_str(), "v")).collect();
    let mut seen: Vec<u8> = Vec::new();
    for (p, auth) in [(&plain, None), (&exposed, Some(format!("Bearer {CLIENT_SECRET}")))] {
        let h = host(p);
        let mut base: Vec<(&str, &str)> = Vec::new();
        if let Some(a) = &auth {
            base.push(("Authorization", a.as_str()));
        }
        let hostile: Vec<Vec<u8>> = vec![
            post(&h, &join(&base, &[]), PING),
            request("GET", "/fault", &h, &join(&base, &[]), b""),
            request("GET", "/mcp", &format!("evil.com:{}", p.port), &join(&base, &[]), b""),
            request("GET", "/mcp", &h, &join(&base, &[("Origin", "http://evil.com")]), b""),
            request("GET", "/mcp", &h, &join(&base, &[("X-Big", &big)]), b""),
            request("GET", "/mcp", &h, &join(&base, &many_fields), b""),
            request("POST", "/mcp", &h, &join(&base, &[("Content-Length", "99999999")]), b""),
            request("POST", "/mcp", &h, &join(&base, &[("Content-Length", "2"), ("Transfer-Encoding", "chunked")]), b"{}"),
            request("GET", "http://evil.com/", &h, &join(&base, &[]), b""),
            post(&h, &join(&base, &[("Content-Type", "application/json")]), br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a","sender":"b"}}}"#),
            post(&h, &join(&base, &[]), b"{not json"),
            post(&h, &[("Authorization", &format!("Bearer {}", &CLIENT_SECRET[..10]))], PING),
            b"\x16\x03\x01garbage\r\n\r\n".to_vec(),
        ];
        for raw in hostile {
            let method = if raw.starts_with(b"POST") { "POST" } else { "GET" };
            let mut c = client(p);
            write_ignoring_errors(&mut c.stream, &raw);
            seen.extend(c.read_response(method).raw);
        }
    }
    for p in [&mut plain, &mut exposed] {
        p.stop();
    }
    std::thread::sleep(Duration::from_millis(500));
    for (name, p) in [("loopback", &plain), ("exposed", &exposed)] {
        let stderr = p.stderr_text();
        assert!(stderr.contains("TRACE") || stderr.contains("DEBUG"), "{name}: nothing logged at trace");
        for (what, secret) in [("token", TOKEN), ("client secret", CLIENT_SECRET)] {
            assert!(!stderr.contains(secret), "{name}: {what} in stderr:\n{stderr}");
            // Fragments too: a log line may cut a value.
            assert!(!stderr.contains(&secret[..12]), "{name}: part of the {what} in stderr:\n{stderr}");
        }
        // Linux shows argv in /proc; elsewhere the read fails and checks nothing.
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.pid())).unwrap_or_default();
        assert!(!contains(&cmdline, TOKEN.as_bytes()), "token in argv");
    }
    assert!(!contains(&seen, TOKEN.as_bytes()), "token in a response: {:?}", String::from_utf8_lossy(&seen));
    assert!(!contains(&seen, CLIENT_SECRET.as_bytes()), "client secret in a response");
    for status in [b"403".as_slice(), b"401", b"431", b"413", b"400", b"502"] {
        assert!(contains(&seen, status), "the sequence never produced {}", String::from_utf8_lossy(status));
    }
}

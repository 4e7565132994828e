//! A host that stops reading stdout: the proxy stops reading the upstream,
//! its memory stays bounded, and once the host reads again every message
//! arrives, in order, whole. Linux only: VmRSS from `/proc`.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{handshake, mcp_upstream, start, tool_call, ANSWER};
use crate::support::exchange::chunk;
use crate::support::procfs::rss_kib;
use crate::support::setup::SSE_HEAD;
use crate::support::wire::Next;

/// What the upstream streams: 50 MiB of events of about 1 KiB each.
const EVENTS: usize = 50 * 1024;
/// Each event's padding, so that an event is about 1 KiB.
const PAD: usize = 960;
/// How long the host does not read.
const STALL: Duration = Duration::from_secs(10);
/// The bound asserted on the proxy's resident memory while it holds the
/// stream back (the stdout queue is 256 KiB, each pipe 64 KiB; the debug
/// build idles at a few MiB).
const RSS_BOUND_KIB: u64 = 64 * 1024;

/// Event `seq`'s padding: a window on the alphabet repeated, so that each
/// event's differs from its neighbours'.
fn pad(alphabet: &str, seq: usize) -> &str {
    &alphabet[seq % 26..seq % 26 + PAD]
}

fn note(seq: usize, pad: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":{{"seq":{seq},"pad":"{pad}"}}}}}}"#
    )
}

#[test]
fn a_host_that_stops_reading_holds_back_50_mib_in_bounded_memory_and_loses_nothing() {
    let alphabet = "abcdefghijklmnopqrstuvwxyz".repeat(PAD / 26 + 2);
    let theirs = alphabet.clone();
    let written = Arc::new(AtomicUsize::new(0));
    let counter = written.clone();
    let up = mcp_upstream(move |_, v, s| {
        if v["params"]["name"] != "flood" {
            return None;
        }
        if s.write_all(SSE_HEAD).is_err() {
            return Some(Next::Close);
        }
        let mut batch = Vec::new();
        for seq in 0..EVENTS {
            batch.extend_from_slice(
                format!("event: message\ndata: {}\n\n", note(seq, pad(&theirs, seq))).as_bytes(),
            );
            if batch.len() >= 64 * 1024 || seq + 1 == EVENTS {
                let piece = chunk(&batch);
                if s.write_all(&piece).is_err() {
                    return Some(Next::Close);
                }
                counter.fetch_add(batch.len(), Ordering::Relaxed);
                batch.clear();
            }
        }
        let answer = json!({"jsonrpc":"2.0","id":v["id"],"result":{"content":[],"events":EVENTS}});
        let mut tail = chunk(format!("event: message\ndata: {answer}\n\n").as_bytes());
        tail.extend_from_slice(b"0\r\n\r\n");
        let _ = s.write_all(&tail);
        Some(Next::KeepAlive)
    });
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let idle_kib = rss_kib(p.pid());
    p.pause_reading();
    p.send_json(&tool_call(json!("flood"), "flood", json!({})));
    let t0 = Instant::now();
    let mut max_kib = 0;
    while t0.elapsed() < STALL {
        std::thread::sleep(Duration::from_millis(250));
        max_kib = max_kib.max(rss_kib(p.pid()));
    }
    let held_at = written.load(Ordering::Relaxed);
    let (lines_at_stall, bytes_at_stall) = p.stdout_read();
    eprintln!(
        "stdio back-pressure: VmRSS idle {idle_kib} KiB, at most {max_kib} KiB while stalled {STALL:?}; \
         the upstream had written {} KiB; the host had read {lines_at_stall} lines, {} KiB",
        held_at / 1024,
        bytes_at_stall / 1024
    );
    assert!(max_kib < RSS_BOUND_KIB, "VmRSS reached {max_kib} KiB (bound {RSS_BOUND_KIB} KiB) while stalled");
    assert!(
        held_at < 25 * 1024 * 1024,
        "the upstream was not held back: {held_at} bytes written while stalled"
    );
    p.resume_reading();
    let t1 = Instant::now();
    for seq in 0..EVENTS {
        let v = p.next(ANSWER);
        let data = &v["params"]["data"];
        if v["method"] != "notifications/message" || data["seq"] != seq || data["pad"] != pad(&alphabet, seq)
        {
            let text = v.to_string();
            panic!("event {seq} of {EVENTS}: got {}", &text[..text.len().min(300)]);
        }
    }
    let answer = p.next(ANSWER);
    assert_eq!(answer["id"], "flood", "{answer}");
    assert_eq!(answer["result"]["events"], EVENTS);
    eprintln!(
        "stdio back-pressure: the rest ({} KiB of events in all) arrived in {:.1} s",
        written.load(Ordering::Relaxed) / 1024,
        t1.elapsed().as_secs_f64()
    );
    p.end_session(Duration::from_secs(5));
}

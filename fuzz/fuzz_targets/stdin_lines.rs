//! Defends the stdio front-end's stdin reader (`stdio::Bridge::input`, which
//! cuts what the host writes into lines and each line into requests): fed
//! any bytes (lines of JSON, batches, odd ids, no newline at the end), whole
//! or cut at offsets chosen by `data[0]`, with an upstream that can never be
//! reached so each request is answered by the front-end itself, it never
//! panics, writes the same stdout either way, and writes exactly one answer
//! per request: one per line that is not JSON-RPC, one per request of a
//! line, whatever its id (an id JSON-RPC refuses gets Invalid Request, id
//! null, and is never sent), none for a notification.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::conn::client_sock::Pipe;
use mcp_identity_proxy::mcp::rpc::{self, Id, Role};
use mcp_identity_proxy::stdio::out::Stdout;
use mcp_identity_proxy::stdio::{Bridge, Core};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An upstream that cannot be reached: no connection ever opens.
struct Unreachable;

impl Core for Unreachable {
    fn open(&mut self) -> Option<u64> {
        None
    }
    fn pipe(&mut self, _id: u64) -> Option<&mut Pipe> {
        None
    }
    fn wake(&mut self, _id: u64) {}
    fn closed(&mut self, _id: u64) -> Option<Pipe> {
        None
    }
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().map_err(|_| std::io::ErrorKind::Other)?.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What stdout holds once `pieces` were read and stdin ended.
fn run(pieces: &[&[u8]]) -> Vec<u8> {
    let sink = Sink::default();
    let out = Stdout::start(sink.clone(), || {}).expect("writer thread");
    let mut bridge = Bridge::new("/mcp", 0, None, Duration::from_secs(1), out);
    let mut core = Unreachable;
    let now = Instant::now();
    let mut turns = 0;
    let mut turn = |bridge: &mut Bridge| {
        turns += 1;
        assert!(turns < 1_000_000, "the front-end never took its input");
        bridge.turn(&mut core, now);
    };
    for piece in pieces {
        // Read only when it has room, as the event loop does.
        while !bridge.wants_input() {
            turn(&mut bridge);
        }
        bridge.input(
            |buf| {
                buf.extend_from_slice(piece);
                false
            },
            now,
        );
    }
    while !bridge.wants_input() {
        turn(&mut bridge);
    }
    bridge.input(|_| true, now);
    while !bridge.finished(now) {
        turn(&mut bridge);
        std::thread::yield_now();
    }
    bridge.into_stdout().join();
    let bytes = sink.0.lock().map(|b| b.clone()).unwrap_or_default();
    bytes
}

/// The answers the front-end owes `input`: one per line that is not
/// JSON-RPC, one per request, and which of them are refused ids.
fn owed(input: &[u8]) -> (usize, usize) {
    let (mut all, mut refused) = (0, 0);
    for line in input.split(|&b| b == b'\n') {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        match rpc::parse(line) {
            Err(_) => all += 1,
            Ok(b) if b.is_batch() && b.messages().is_empty() => all += 1,
            Ok(b) if !b.is_batch() && b.messages().iter().any(|m| m.role() == Role::Invalid) => all += 1,
            Ok(b) => {
                for m in b.messages().iter().filter(|m| m.role() == Role::Request) {
                    all += 1;
                    refused += usize::from(m.id() == Id::Refused);
                }
            }
        }
    }
    (all, refused)
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, input)) = data.split_first() else {
        return;
    };
    // JSON's whitespace differs from `trim_ascii`'s (form feed): such
    // inputs only check that nothing panics and splits agree.
    let countable = !input.contains(&0x0c) && !input.contains(&0x0b);
    let whole = run(&[input]);
    let a = usize::from(k) * 7919 % (input.len() + 1);
    let b = (a + usize::from(k) * 31 + 1).min(input.len());
    assert_eq!(run(&[&input[..a], &input[a..b], &input[b..]]), whole, "cut at {a} and {b}");
    let mut answers = 0;
    let mut invalid_null = 0;
    for line in whole.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_slice(line).expect("every line is JSON");
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        assert!(v["error"]["code"].is_i64(), "every answer here is an error: {v}");
        answers += 1;
        invalid_null += usize::from(v["id"].is_null() && v["error"]["code"] == -32600);
    }
    if countable {
        let (all, refused) = owed(input);
        assert_eq!(answers, all, "one answer per request: {:?}", String::from_utf8_lossy(&whole));
        assert!(invalid_null >= refused, "each refused id gets Invalid Request with id null");
    }
});

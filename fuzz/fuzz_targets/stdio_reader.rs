//! Defends the stdio front-end's response reader (`stdio::reader::Reader`,
//! which turns what the exchange wrote into the lines a host reads): fed any
//! bytes after a response head (JSON or event stream, any framing), whole or
//! cut at an offset chosen by `data[0]`, it never panics, gives the same
//! events either way, and no message it gives holds a line break, so one
//! message is always exactly one line (whether it is JSON at all is the
//! front-end's check, after).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::stdio::out::Stdout;
use mcp_identity_proxy::stdio::reader::{Event, Reader};
use std::cell::RefCell;

thread_local! {
    static OUT: RefCell<Option<Stdout>> = const { RefCell::new(None) };
}

const HEADS: [&[u8]; 4] = [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n",
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n\r\n",
];

fn run(parts: &[&[u8]], out: &mut Stdout) -> Vec<Event> {
    let mut reader = Reader::default();
    let mut pending = Vec::new();
    let mut events = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        pending.extend_from_slice(p);
        let last = i + 1 == parts.len();
        loop {
            let mut emit = out.emit(1);
            let (n, e) = if last { reader.closed(&pending, &mut emit) } else { reader.pump(&pending, &mut emit) };
            pending.drain(..n);
            match e {
                Some(e) => events.push(e),
                None if last && !reader.is_done() && n == 0 => {
                    // A streamed message waits for stdout: let it drain.
                    out.flush();
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                None => break,
            }
            if reader.is_done() && matches!(events.last(), Some(Event::End { .. } | Event::Broken(_))) {
                break;
            }
        }
    }
    events
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    OUT.with(|cell| {
        let mut slot = cell.borrow_mut();
        let out = slot.get_or_insert_with(|| Stdout::start(std::io::sink(), || {}).expect("writer thread"));
        let mut response = HEADS[usize::from(k) % HEADS.len()].to_vec();
        response.extend_from_slice(rest);
        let whole = run(&[&response], out);
        let cut = usize::from(k) * 7919 % (response.len() + 1);
        let (a, b) = response.split_at(cut);
        assert_eq!(run(&[a, b], out), whole, "cut at {cut}");
        for e in &whole {
            if let Event::Message(m) = e {
                assert!(!m.iter().any(|&b| b == b'\n' || b == b'\r'), "a line break in a message: {m:?}");
            }
        }
    });
});

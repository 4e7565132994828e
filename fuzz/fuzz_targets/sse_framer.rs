//! Defends the one SSE event framer (`sse::Framer`, which the answer reader,
//! the stdio front-end and the whole-body reader all read event streams
//! with): fed any stream whole, or cut at an offset chosen by `data[0]`, or
//! one byte at a time, it dispatches the same events, and they are the ones
//! a naive reading of WHATWG HTML §9.2.6 (the whole stream split into lines
//! first) gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::mcp::sse::{EventSink, Framer};

#[derive(Default)]
struct Events {
    data: Vec<u8>,
    kind: Vec<u8>,
    got: Vec<(Vec<u8>, Vec<u8>)>,
}

impl EventSink for Events {
    fn data(&mut self, bytes: &[u8]) {
        self.data.extend_from_slice(bytes);
    }
    fn event_type(&mut self, value: &[u8]) {
        self.kind = value.to_vec();
    }
    fn dispatch(&mut self, had_data: bool) {
        if had_data {
            self.got.push((std::mem::take(&mut self.kind), std::mem::take(&mut self.data)));
        }
        self.data.clear();
        self.kind.clear();
    }
}

fn run(parts: &[&[u8]]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut framer = Framer::default();
    let mut events = Events::default();
    for p in parts {
        let mut rest = *p;
        while !rest.is_empty() {
            let (n, _) = framer.feed(rest, &mut events);
            assert!(n > 0 && n <= rest.len(), "feed consumed {n} of {}", rest.len());
            rest = &rest[n..];
        }
    }
    events.got
}

/// The spec read naively: lines first (CRLF, LF or CR), then fields.
fn naive(stream: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let stream = stream.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(stream);
    let mut lines = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < stream.len() {
        match stream[i] {
            b'\r' => {
                lines.push(&stream[start..i]);
                i += if stream.get(i + 1) == Some(&b'\n') { 2 } else { 1 };
                start = i;
            }
            b'\n' => {
                lines.push(&stream[start..i]);
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    let (mut out, mut data, mut kind, mut has) = (Vec::new(), Vec::new(), Vec::new(), false);
    for line in lines {
        if line.is_empty() {
            if has {
                out.push((std::mem::take(&mut kind), std::mem::take(&mut data)));
            }
            data.clear();
            kind.clear();
            has = false;
            continue;
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(c) => {
                let v = &line[c + 1..];
                (&line[..c], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => {
                if has {
                    data.push(b'\n');
                }
                data.extend_from_slice(value);
                has = true;
            }
            // The framer keeps an `event` value up to 65 bytes: longer ones
            // compare unequal to every type that matters.
            b"event" => kind = value[..value.len().min(65)].to_vec(),
            _ => {}
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, stream)) = data.split_first() else {
        return;
    };
    let whole = run(&[stream]);
    let cut = usize::from(k) * 7919 % (stream.len() + 1);
    let (a, b) = stream.split_at(cut);
    assert_eq!(run(&[a, b]), whole, "cut at {cut}");
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(run(&bytes), whole, "byte by byte");
    assert_eq!(whole, naive(stream));
});

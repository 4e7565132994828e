//! Defends the invariant the project exists for: whatever field lines come
//! in, the written head never holds two lines whose names are equal ignoring
//! case, and httparse reads back exactly the list that was written.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::http::headers::{name, HeaderList};

fuzz_target!(|data: &[u8]| {
    let mut list = HeaderList::new();
    // One field line per input line: `name:value`; a leading `!` uses `set`
    // (the proxy's own writes) instead of `merge_line` (received lines). A
    // leading `#` then a byte sets the known name that byte picks to the
    // rest of the line (`set_name`); `-` then a byte removes it.
    for line in data.split(|b| *b == b'\n') {
        if let [op @ (b'#' | b'-'), pick, value @ ..] = line {
            let known = name::ALL[usize::from(*pick) % name::ALL.len()];
            if *op == b'#' {
                let _ = list.set_name(known, value);
            } else {
                list.remove_name(known);
            }
            continue;
        }
        let (set, line) = match line.split_first() {
            Some((b'!', rest)) => (true, rest),
            _ => (false, line),
        };
        let Some(colon) = line.iter().position(|b| *b == b':') else { continue };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let _ = if set { list.set(name, value) } else { list.merge_line(name, value) };
    }
    let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
    list.write_to(&mut head);
    head.extend_from_slice(b"\r\n");

    let mut raw = [httparse::EMPTY_HEADER; 128];
    let mut resp = httparse::Response::new(&mut raw);
    let parsed = resp.parse(&head).expect("the writer's output parses");
    assert_eq!(parsed, httparse::Status::Complete(head.len()));
    let names: Vec<&str> = resp.headers.iter().map(|h| h.name).collect();
    for (i, a) in names.iter().enumerate() {
        for b in &names[i + 1..] {
            assert!(!a.eq_ignore_ascii_case(b), "duplicate field {a}");
        }
    }
    assert_eq!(resp.headers.len(), list.len());
    for (h, p) in list.iter().zip(resp.headers.iter()) {
        assert_eq!(h.name(), p.name.as_bytes());
        assert_eq!(h.value(), p.value);
    }
});

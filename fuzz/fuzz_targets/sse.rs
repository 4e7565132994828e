//! Defends the legacy SSE `endpoint` rewrite (an absolute URL naming the
//! upstream becomes the proxy's origin) against read splits and
//! against touching bytes it must not: the output is the same whether the
//! stream arrives whole or split at offsets chosen by `data[0]`, and it is
//! the input with some upstream authorities replaced by the proxy's, nothing
//! else. Also checks `rewrite_location` (a `Location` naming the upstream
//! is rewritten to the client's Host) the same way. With `data[0]`'s top bit
//! the upstream is https: `https://<upstream>` becomes `http://<proxy>`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::mcp::sse::{rewrite_location_from, EndpointRewriter};

const UP: &[u8] = b"127.0.0.1:8200";
/// Unlike anything in a real stream, so that the output can be mapped back.
const PROXY: &[u8] = b"\x00proxy:1\x00";

fn run(https: bool, parts: &[&[u8]]) -> Vec<u8> {
    let mut r = EndpointRewriter::for_upstream(https, UP, PROXY);
    let mut out = Vec::new();
    for p in parts {
        r.feed(p, &mut out);
    }
    r.finish(&mut out);
    out
}

fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut rest = hay;
    while let Some(i) = memmem(rest, from) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(to);
        rest = &rest[i + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

fn memmem(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, input)) = data.split_first() else {
        return;
    };
    let https = k & 0x80 != 0;
    let run = |parts: &[&[u8]]| run(https, parts);
    let whole = run(&[input]);

    let a = usize::from(k) % (input.len() + 1);
    assert_eq!(run(&[&input[..a], &input[a..]]), whole, "split at {a}");
    let b = a + usize::from(k.rotate_left(4)) % (input.len() - a + 1);
    assert_eq!(run(&[&input[..a], &[], &input[a..b], &input[b..]]), whole, "split at {a}, {b}");
    let step = usize::from(k % 7) + 1;
    let chunks: Vec<&[u8]> = input.chunks(step).collect();
    assert_eq!(run(&chunks), whole, "chunks of {step}");

    if memmem(input, UP).is_none() {
        assert_eq!(whole, input);
    }
    let scheme: &[u8] = if https { b"https://" } else { b"http://" };
    if memmem(input, PROXY).is_none() {
        if https {
            // The scheme's case is not kept (it becomes http://).
            let back = replace_all(&whole, &[&b"http://"[..], PROXY].concat(), &[scheme, UP].concat());
            assert_eq!(back.to_ascii_lowercase(), input.to_ascii_lowercase());
        } else {
            assert_eq!(replace_all(&whole, PROXY, UP), input);
        }
    }

    if let Some(loc) = rewrite_location_from(https, input, UP, PROXY) {
        let rest = &input[scheme.len() + UP.len()..];
        assert_eq!(&loc[..], &[&b"http://"[..], PROXY, rest].concat()[..]);
    }
});

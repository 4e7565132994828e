//! Defends the request head parser: no panic on any bytes; a complete head
//! is reported at the same length whatever follows it, is incomplete one
//! byte earlier, and its fields hold no duplicate names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::http::head::parse_request;

fuzz_target!(|data: &[u8]| {
    let Ok(Some(head)) = parse_request(data) else { return };
    assert!(head.len <= data.len());
    let again = parse_request(&data[..head.len]).expect("same head parses alone").expect("complete");
    assert_eq!(again.len, head.len);
    assert_eq!(again.headers, head.headers);
    assert_eq!(again.framing, head.framing);
    assert!(matches!(parse_request(&data[..head.len - 1]), Ok(None) | Err(_)));
    let names: Vec<&[u8]> = head.headers.iter().map(|h| h.name()).collect();
    for (i, a) in names.iter().enumerate() {
        assert!(!names[i + 1..].iter().any(|b| a.eq_ignore_ascii_case(b)));
    }
});

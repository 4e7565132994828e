//! Defends the request head parser: no panic on any bytes; a complete head
//! is reported at the same length whatever follows it, is incomplete one
//! byte earlier, its fields hold no duplicate names, and they are the
//! fields httparse's lines give merged one by one (most lines are taken
//! where they lie in the head, not merged on their own).
#![no_main]

#[path = "common/one_by_one.rs"]
mod one_by_one;

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::http::head::parse_request;
use one_by_one::one_by_one;

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
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut fields);
    let Ok(httparse::Status::Complete(_)) = req.parse(data) else {
        panic!("httparse refuses a head we took")
    };
    assert_eq!(one_by_one(req.headers, &[b"content-length", b"expect"]), head.headers);
});

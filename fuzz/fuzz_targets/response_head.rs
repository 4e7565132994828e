//! Defends the response head parser: no panic on any bytes; a complete head
//! parses the same alone, is incomplete one byte earlier, a bodiless
//! status never gets a body, and its fields are the fields httparse's lines
//! give merged one by one.
#![no_main]

#[path = "common/one_by_one.rs"]
mod one_by_one;

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::http::framing::Framing;
use mcp_identity_proxy::http::head::parse_response;
use one_by_one::one_by_one;

fuzz_target!(|data: &[u8]| {
    let Some((&flag, data)) = data.split_first() else { return };
    let head_request = flag & 1 == 1;
    let Ok(Some(head)) = parse_response(data, head_request) else { return };
    assert!(head.len <= data.len());
    let again = parse_response(&data[..head.len], head_request).expect("parses alone").expect("complete");
    assert_eq!((again.len, again.status, again.framing), (head.len, head.status, head.framing));
    assert!(matches!(parse_response(&data[..head.len - 1], head_request), Ok(None) | Err(_)));
    if head_request || head.status < 200 || head.status == 204 || head.status == 304 {
        assert_eq!(head.framing, Framing::None);
    }
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut resp = httparse::Response::new(&mut fields);
    let Ok(httparse::Status::Complete(_)) = resp.parse(data) else {
        panic!("httparse refuses a head we took")
    };
    assert_eq!(one_by_one(resp.headers, &[b"content-length"]), head.headers);
});

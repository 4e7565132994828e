//! Defends the response head parser: no panic on any bytes; a complete head
//! parses the same alone, is incomplete one byte earlier, a bodiless
//! status never gets a body, and its fields are the fields httparse's lines
//! give merged one by one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::http::framing::Framing;
use mcp_identity_proxy::http::head::parse_response;
use mcp_identity_proxy::http::headers::HeaderList;

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
    let Ok(httparse::Status::Complete(_)) = resp.parse(data) else { panic!("httparse refuses a head we took") };
    let mut one_by_one = HeaderList::new();
    for h in resp.headers.iter() {
        one_by_one.merge_line(h.name.as_bytes(), h.value).expect("a line we took merges");
    }
    one_by_one.strip_hop_by_hop();
    one_by_one.remove(b"content-length");
    assert_eq!(one_by_one, head.headers);
});

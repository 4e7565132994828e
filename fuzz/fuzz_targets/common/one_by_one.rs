//! The fields of a head as merging httparse's lines one by one gives them,
//! with the hop-by-hop lines and the named framing lines stripped: what
//! the head parsers, which take most lines where they lie, must agree with.

use mcp_identity_proxy::http::headers::HeaderList;

pub fn one_by_one(lines: &[httparse::Header<'_>], framing: &[&[u8]]) -> HeaderList {
    let mut list = HeaderList::new();
    for h in lines {
        list.merge_line(h.name.as_bytes(), h.value).expect("a line the parser took merges");
    }
    list.strip_hop_by_hop();
    for name in framing {
        list.remove(name);
    }
    list
}

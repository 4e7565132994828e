//! Defends the legacy SSE stream rewriter under a tool policy
//! (`mcp::legacy::LegacyStream`): whatever the stream and wherever reads
//! split it, and whenever the proxy's own event is owed, the output is the
//! endpoint-rewritten stream byte for byte with that event inserted once,
//! whole, between two of the stream's events (never inside one), or not at
//! all when the stream never reaches a boundary after it was owed. The
//! session the endpoint event names is learned as `endpoint_session` reads
//! it from the whole stream. Split offsets and the moment the event is owed
//! come from `data[0..2]`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::mcp::legacy::{endpoint_session, LegacyStream, Owed};
use mcp_identity_proxy::mcp::sse::write_message_event;
use mcp_identity_proxy::mcp::sse::EndpointRewriter;
use mcp_identity_proxy::mcp::stamp::StampMap;
use mcp_identity_proxy::mcp::tools::{ListOptions, Policy, ToolFlags};

const UP: &[u8] = b"127.0.0.1:8200";
const PROXY: &[u8] = b"127.0.0.1:4000";
/// The proxy's event: its text appears nowhere in a fuzzed stream unless
/// the fuzzer writes it, which the search below accounts for.
const OURS: &[u8] =
    br#"{"jsonrpc":"2.0","id":"\u0000fuzz","error":{"code":-32602,"message":"Unknown tool"}}"#;

/// The endpoint rewrite alone, over the whole stream.
fn reference(stream: &[u8]) -> Vec<u8> {
    let mut r = EndpointRewriter::new(UP, PROXY);
    let mut out = Vec::new();
    r.feed(stream, &mut out);
    r.finish(&mut out);
    out
}

/// `prefix` ends between two events: after a blank line (or it is empty, or
/// only the stream's BOM).
fn at_boundary(prefix: &[u8]) -> bool {
    // A leading BOM is not part of the stream's first line (WHATWG HTML §9.2.6).
    let prefix = prefix.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(prefix);
    if prefix.is_empty() {
        return true;
    }
    let cut = match prefix {
        [.., b'\r', b'\n'] => 2,
        [.., b'\r' | b'\n'] => 1,
        _ => return false,
    };
    let before = &prefix[..prefix.len() - cut];
    before.is_empty() || matches!(before.last(), Some(b'\r' | b'\n'))
}

fuzz_target!(|data: &[u8]| {
    let (Some(&a), Some(&b)) = (data.first(), data.get(1)) else { return };
    let stream = &data[2..];
    let flags = ToolFlags {
        allow: None,
        deny: vec!["x".into()],
        show_identity_params: false,
        identity_params: vec![],
    };
    let policy = Policy::from_flags(&flags);
    let map = StampMap::agentchattr();
    let options = ListOptions { learn_room: 0, insert_cache_scope: false };
    let mut event = Vec::new();
    write_message_event(OURS, &mut event);

    // Reads split every `step` bytes; the event is owed after read `owe_at`.
    let step = usize::from(a % 17) + 1;
    let owe_at = usize::from(b % 8);
    let mut s = LegacyStream::new(EndpointRewriter::new(UP, PROXY));
    let mut out = Vec::new();
    let mut session = None;
    let mut owed = false;
    for (i, piece) in stream.chunks(step).chain(std::iter::once(&[][..])).enumerate() {
        if i == owe_at && !owed {
            s.owe(Owed { lists: vec![], events: event.clone() }, &policy, &map, options, true);
            s.idle(&mut out);
            owed = true;
        }
        s.feed(piece, &mut out);
        session = session.or_else(|| s.take_new_session());
    }
    if !owed {
        s.owe(Owed { lists: vec![], events: event.clone() }, &policy, &map, options, true);
        s.idle(&mut out);
    }
    s.finish(&mut out);
    session = session.or_else(|| s.take_new_session());

    let want = reference(stream);
    assert_eq!(session, endpoint_session(&want), "the session learned");
    // Our event, where the output and the reference first differ.
    let differ = out.iter().zip(&want).position(|(x, y)| x != y).unwrap_or(want.len().min(out.len()));
    if out.len() == want.len() {
        assert_eq!(out, want, "not inserted, and nothing else changed");
        return;
    }
    assert_eq!(out.len(), want.len() + event.len(), "inserted once, whole");
    // The insertion point may be earlier than the first difference when the
    // event's first bytes equal the stream's there: find the offset at which
    // the event sits and the rest is the stream.
    let at = (0..=differ)
        .rev()
        .find(|&p| {
            out[p..].starts_with(&event) && out[..p] == want[..p] && out[p + event.len()..] == want[p..]
        })
        .expect("the output is the stream with the event inserted");
    let _ = at_boundary(&want[..at]) || panic!("the event is inside one of the stream's events at {at}");
});

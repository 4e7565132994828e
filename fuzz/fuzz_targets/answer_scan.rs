//! Defends the streaming answer reader (`VersionScan`, which session recovery and the audit log read answers with): fed any JSON body in two pieces cut anywhere (or whole, its word-at-a-time path), it accepts exactly the bodies whose first value serde_json accepts (beside Python's NaN and Infinity, which the proxy's grammar takes), and where serde_json reads the whole body it reports the `initialize` version serde_json reads (`answer_twin.rs`); the outcome of a batch's answers read in one pass is each answer's own.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::mcp::initialize::{for_each_message_event, Format};
use mcp_identity_proxy::mcp::rpc::IdKey;
use mcp_identity_proxy::mcp::version_scan::{Scan, VersionScan, Why};

#[path = "../../src/mcp/answer_twin.rs"]
mod twin;
use twin::Expected;

const REQUEST_IDS: [&[u8]; 4] = [b"1", b"7", br#""1""#, br#""init""#];

fuzz_target!(|data: &[u8]| {
    let Some((&k, body)) = data.split_first() else {
        return;
    };
    let id = REQUEST_IDS[usize::from(k) % REQUEST_IDS.len()];
    let cut = if body.is_empty() { 0 } else { usize::from(k) * 7919 % (body.len() + 1) };
    let (a, b) = body.split_at(cut);
    let Some(mut scan) = VersionScan::new(Format::Json, id) else {
        panic!("a fixed id is usable");
    };
    scan.feed(a);
    scan.feed(b);
    let state = scan.finish().clone();
    let accepted = matches!(state, Scan::Version(_) | Scan::Missing(Why::NoVersion | Why::NoAnswer));
    let first = serde_json::Deserializer::from_slice(body).into_iter::<serde_json::Value>().next();
    // A number past a double's range is serde_json's limit, not RFC 8259's
    // grammar (§9 leaves limits to implementations): not compared.
    let out_of_range = matches!(&first, Some(Err(e)) if e.to_string().contains("number out of range"));
    // Python's NaN and Infinity are values to the proxy (as to `json.rs`),
    // not to serde_json: not compared.
    let python = body.windows(3).any(|w| w == b"NaN") || body.windows(8).any(|w| w == b"Infinity");
    if !out_of_range && !python {
        assert_eq!(accepted, matches!(first, Some(Ok(_))), "{state:?}");
    }
    if serde_json::from_slice::<serde_json::Value>(body).is_ok() {
        let want = twin::protocol_version(body, Format::Json, id);
        let same = match (&state, &want) {
            (Scan::Version(g), Expected::Version(w)) => g == w,
            (Scan::Missing(Why::NoVersion), Expected::NoVersion) => true,
            (Scan::Missing(Why::NoAnswer), Expected::NotFound) => true,
            _ => false,
        };
        assert!(same, "scan {state:?}, serde_json {want:?}");
    }
    // The whole-slice path (the body in one read) and the byte path (in
    // two, the first non-empty) say the same, for one request and for a
    // batch's four.
    let split_at = cut.max(1).min(body.len());
    for (ids, sole) in [(&[id][..], true), (&REQUEST_IDS[..], false)] {
        let (Some(mut whole), Some(mut split)) =
            (VersionScan::for_ids(Format::Json, ids, sole), VersionScan::for_ids(Format::Json, ids, sole))
        else {
            panic!("fixed ids are usable");
        };
        whole.feed(body);
        let (a, b) = body.split_at(split_at);
        split.feed(a);
        split.feed(b);
        assert_eq!(whole.finish(), split.finish(), "sole {sole}");
        for i in 0..ids.len() {
            assert_eq!(whole.outcome_of(i), split.outcome_of(i), "sole {sole}, id {i}");
        }
    }
    // Any bytes as an event stream: no panic, and the same whatever the cut.
    let mut whole = VersionScan::new(Format::EventStream, id).unwrap_or_else(|| panic!("a fixed id"));
    whole.feed(body);
    let mut split = VersionScan::new(Format::EventStream, id).unwrap_or_else(|| panic!("a fixed id"));
    split.feed(a);
    split.feed(b);
    assert_eq!(whole.finish(), split.finish());
    assert_eq!(whole.outcome(), split.outcome());
});

//! Defends the JSON-RPC body readers and the proxy's error body: no panic on any body; the stamp scan's envelope reads as `rpc::parse` does (its message objects, and a body of one message whole); the error body written for any input is JSON serde_json reads, with one error per request (and per batch element that is not a message) carrying the id serde_json reads there, in order, and none for notifications and responses; the answer reader's `initialize` protocolVersion agrees with serde_json on JSON bodies and is the same when the body arrives as an SSE stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::mcp::initialize::{for_each_message_event, Format};
use mcp_identity_proxy::mcp::json;
use mcp_identity_proxy::mcp::rpc::{self, IdKey, SERVER_ERROR};
use mcp_identity_proxy::mcp::stamp::{self, StampMap};
use mcp_identity_proxy::mcp::version_scan::{Scan, VersionScan, Why};
use serde_json::Value;

#[path = "../../src/mcp/answer_twin.rs"]
mod twin;
use twin::Expected;

const MESSAGE: &str = "upstream unavailable";
/// The `initialize` request ids tried: MCP ids are strings or integers.
const REQUEST_IDS: [&[u8]; 4] = [b"1", b"7", br#""1""#, br#""init""#];

/// The ids serde_json reads for the errors owed to `input`, in order.
fn expected_ids(input: &Value) -> Vec<Value> {
    let owed = |m: &Value| match m.as_object() {
        None => Some(Value::Null),
        Some(o) if o.contains_key("method") => o.get("id").map(|id| match id {
            Value::String(_) | Value::Number(_) => id.clone(),
            _ => Value::Null,
        }),
        Some(_) => None,
    };
    match input {
        Value::Array(items) if items.is_empty() => vec![Value::Null],
        Value::Array(items) => items.iter().filter_map(owed).collect(),
        other => owed(other).into_iter().collect(),
    }
}

/// Whether an error's id is the one owed. Numbers at 1e300 and beyond are
/// answered with null (JSON readers disagree on them); near that bound the
/// two sides' rounding may differ, so either is accepted there.
fn id_matches(got: &Value, want: &Value) -> bool {
    match want.as_f64() {
        Some(f) if f.abs() >= 1e301 => got.is_null(),
        Some(f) if f.abs() >= 1e299 => got.is_null() || got == want,
        _ => got == want,
    }
}

/// `body` as the data of a `message` event, after an event that is not the
/// answer; line endings and the spacing after `data:` chosen by `k`.
fn as_sse(body: &[u8], id: &[u8], k: u8) -> Vec<u8> {
    let eol: &[u8] = if k & 0x10 != 0 { b"\r\n" } else { b"\n" };
    let mut out = Vec::new();
    if k & 0x20 != 0 {
        out.extend_from_slice(b"\xEF\xBB\xBF: comment");
        out.extend_from_slice(eol);
        out.extend_from_slice(b"event: message");
        out.extend_from_slice(eol);
        out.extend_from_slice(b"data: {\"method\":\"ping\",\"id\":");
        out.extend_from_slice(id);
        out.extend_from_slice(b"}");
        out.extend_from_slice(eol);
        out.extend_from_slice(eol);
    }
    if k & 0x40 != 0 {
        out.extend_from_slice(b"event: message");
        out.extend_from_slice(eol);
    }
    for line in body.split(|&c| c == b'\n') {
        let tight = k & 0x80 != 0 && line.first() != Some(&b' ');
        out.extend_from_slice(if tight { b"data:" } else { b"data: " });
        out.extend_from_slice(line);
        out.extend_from_slice(eol);
    }
    out.extend_from_slice(eol);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, body)) = data.split_first() else {
        return;
    };
    let parsed = rpc::parse(body);
    // The stamp scan's envelope reads as the second parse it replaces: its
    // message objects, and the whole body (a batch with its elements that
    // are not objects).
    if let Ok(plan) = stamp::plan(body, "fuzz", &StampMap::agentchattr()) {
        let p = parsed.as_ref().expect("a body the stamp scan accepts parses");
        let from_envelope: Vec<rpc::Message> = plan.messages(body).expect("scanned").collect();
        let objects: Vec<rpc::Message> =
            p.messages().iter().copied().filter(|m| m.role() != rpc::Role::Invalid).collect();
        assert_eq!(from_envelope, objects);
        assert_eq!(plan.is_batch(), p.is_batch());
        assert_eq!(plan.rpc_body(body).as_ref(), Some(p));
    }
    let serde: Option<Value> = serde_json::from_slice(body).ok();
    // Compared with serde_json only where both read the body (they differ
    // on NaN, lone surrogates and the nesting limit).
    let both = serde.as_ref().filter(|_| parsed.is_ok());

    // The error body.
    let mut out = Vec::new();
    let n = rpc::write_error(&mut out, parsed.as_ref().ok(), SERVER_ERROR, MESSAGE);
    assert_eq!(n > 0, parsed.as_ref().map_or(true, |p| p.expects_answer()));
    if n == 0 {
        assert!(out.is_empty());
    } else {
        assert!(json::parse_value(&out).is_ok(), "the strict scanner reads it");
        let v: Value = serde_json::from_slice(&out).expect("serde_json reads every error body");
        let errors: Vec<&Value> = match &v {
            Value::Array(items) => {
                assert!(parsed.as_ref().is_ok_and(|p| p.is_batch()));
                items.iter().collect()
            }
            other => vec![other],
        };
        assert_eq!(errors.len(), n);
        for e in &errors {
            assert_eq!(e["jsonrpc"], "2.0");
            assert_eq!(e["error"]["code"], SERVER_ERROR);
            assert_eq!(e["error"]["message"], MESSAGE);
        }
        if parsed.is_err() {
            assert!(errors[0]["id"].is_null());
        }
        if let Some(input) = both {
            let want = expected_ids(input);
            assert_eq!(errors.len(), want.len(), "one error per request");
            for (e, w) in errors.iter().zip(&want) {
                assert!(id_matches(&e["id"], w), "id {} for {w}", e["id"]);
            }
        }
    }
    if let (Ok(p), Some(input)) = (&parsed, both) {
        for m in p.messages() {
            if let Some(name) = m.method() {
                assert!(m.is_method(&name));
            }
        }
        let methods: Vec<Option<&str>> = match input {
            Value::Array(items) => items.iter().map(|m| m.get("method").and_then(Value::as_str)).collect(),
            other => vec![other.get("method").and_then(Value::as_str)],
        };
        let got: Vec<_> = p.messages().iter().map(|m| m.method()).collect();
        assert_eq!(got.iter().map(|m| m.as_deref()).collect::<Vec<_>>(), methods);
    }

    // The initialize answer, read by the answer reader: as serde_json reads
    // it (`answer_twin.rs`), and the same when the body arrives as an SSE
    // event's data (LF-joined lines are the body itself, unless it holds a
    // CR, a line end in SSE).
    let id = REQUEST_IDS[usize::from(k) % REQUEST_IDS.len()];
    let read = |format: Format, bytes: &[u8]| -> Expected {
        let Some(mut s) = VersionScan::new(format, id) else {
            panic!("a fixed id is usable");
        };
        s.feed(bytes);
        match s.finish() {
            Scan::Version(v) => Expected::Version(v.clone()),
            Scan::Missing(Why::NoVersion) => Expected::NoVersion,
            _ => Expected::NotFound,
        }
    };
    if both.is_some() {
        let from_json = read(Format::Json, body);
        assert_eq!(from_json, twin::protocol_version(body, Format::Json, id));
        if !body.contains(&b'\r') {
            assert_eq!(read(Format::EventStream, &as_sse(body, id, k)), from_json);
        }
    }
    // Any bytes as a stream: no panic.
    let _ = read(Format::EventStream, body);
});

//! The `initialize` answer's `protocolVersion` read with serde_json: the
//! oracle that `version_scan.rs`'s tests and the `answer_scan` and
//! `rpc_body` fuzz targets hold the answer reader to. Test and fuzz builds
//! only (the fuzz targets include this file; its parent names `Format`,
//! `for_each_message_event` and `IdKey`).

use super::{for_each_message_event, Format, IdKey};
use serde_json::Value;

/// What serde_json reads of the answer to the request whose id is `id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Its `result.protocolVersion`, a string.
    Version(String),
    /// The answer is there without a string `result.protocolVersion`.
    NoVersion,
    /// No answer to that id that serde_json can read.
    NotFound,
}

/// In one JSON-RPC body: the first response message (no `method`) whose id
/// matches `id` (its JSON text) as clients match ids (`IdKey`).
pub fn in_value(input: &Value, id: &[u8]) -> Expected {
    let messages: Vec<&Value> = match input {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    let key = |v: &Value| serde_json::to_vec(v).ok().and_then(|t| IdKey::of(&t));
    let want = IdKey::of(id);
    for m in messages.iter().filter_map(|m| m.as_object()) {
        let answers = want.is_some() && m.get("id").is_some_and(|mid| key(mid) == want);
        if m.contains_key("method") || !answers {
            continue;
        }
        return match m.get("result").and_then(|r| r.get("protocolVersion")).and_then(Value::as_str) {
            Some(v) => Expected::Version(v.to_owned()),
            None => Expected::NoVersion,
        };
    }
    Expected::NotFound
}

/// The answer in a whole body: one JSON value, or each `message` event of an
/// event stream in turn, read by serde_json (what it cannot read holds no
/// answer).
pub fn protocol_version(body: &[u8], format: Format, id: &[u8]) -> Expected {
    let read =
        |text: &[u8]| serde_json::from_slice::<Value>(text).map_or(Expected::NotFound, |v| in_value(&v, id));
    match format {
        Format::Json => read(body),
        Format::EventStream => {
            let mut found = Expected::NotFound;
            for_each_message_event(body, |data| {
                found = read(data);
                found == Expected::NotFound
            });
            found
        }
    }
}

//! The `protocolVersion` a server chose in its answer to `initialize`, read
//! from the response body whether it is JSON or an SSE stream (MCP
//! streamable HTTP lets the server answer a POST either way). Pure: bytes in,
//! value out; no I/O, no clock. Not incremental: it reads a whole body.
//! The relay reads answers with `version_scan`, incrementally and whatever
//! their size; this whole-body reader is what that one is tested against
//! (and fuzzed: `fuzz/fuzz_targets/rpc_body.rs`), with `Format` and the SSE
//! event splitter they share. It must not be used to change a body: it
//! only reads.

use crate::mcp::json::{self, Kind, ScanError, Value};
use crate::mcp::rpc;

/// How the answer's body is framed, from its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `application/json`: one JSON-RPC message (or a batch).
    Json,
    /// `text/event-stream`: SSE events, each `message` event one message.
    EventStream,
}

impl Format {
    /// The format of a `Content-Type` value (media type compared ASCII
    /// case-insensitively, parameters ignored: RFC 9110 §8.3.1); `None`
    /// for any other type.
    pub fn from_content_type(value: &[u8]) -> Option<Format> {
        let media = value.split(|&c| c == b';').next().unwrap_or_default().trim_ascii();
        if media.eq_ignore_ascii_case(b"application/json") {
            Some(Format::Json)
        } else if media.eq_ignore_ascii_case(b"text/event-stream") {
            Some(Format::EventStream)
        } else {
            None
        }
    }
}

/// What the bytes say about the answer to the `initialize` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The answer's `result.protocolVersion`, decoded.
    Version(String),
    /// The answer is there but carries no string `result.protocolVersion`
    /// (a JSON-RPC error, or a malformed result).
    NoVersion,
    /// No answer to that id in these bytes (yet: an SSE stream may send it
    /// later; or the body is not readable).
    NotFound,
}

/// Reads the answer to the request whose id is `request_id` (its JSON text
/// as sent, e.g. [`rpc::Id::json`] of the `initialize` request) from
/// `body`. The answer is the first response message with that id (MCP
/// Lifecycle: the server answers `initialize` with an `InitializeResult`;
/// on an SSE stream it may send requests and notifications first).
/// Must not panic on any input; a request id that is not a string or
/// number finds nothing.
pub fn protocol_version(body: &[u8], format: Format, request_id: &[u8]) -> Answer {
    if rpc::IdKey::of(request_id).is_none() {
        return Answer::NotFound;
    }
    match format {
        Format::Json => in_message(body, request_id),
        Format::EventStream => {
            let mut found = Answer::NotFound;
            for_each_message_event(body, |data| {
                found = in_message(data, request_id);
                found == Answer::NotFound
            });
            found
        }
    }
}

/// Looks for the answer in one JSON-RPC body (a message or a batch).
fn in_message(body: &[u8], request_id: &[u8]) -> Answer {
    let mut found = Answer::NotFound;
    let _ = walk_messages(body, |m| {
        if found != Answer::NotFound {
            return Ok(());
        }
        let (mut mid, mut result, mut method) = (None, None, false);
        // Last of equal keys counts, as in `rpc`.
        json::for_each_member(body, m, |k, v| {
            if k.is(body, "id") {
                mid = Some(v);
            } else if k.is(body, "result") {
                result = Some(v);
            } else if k.is(body, "method") {
                method = true;
            }
            Ok::<(), ScanError>(())
        })?;
        // A message with a method is the server's request or notification
        // (JSON-RPC 2.0 §5: only a Response answers an id).
        // Ids match as clients match them (`rpc::IdKey`).
        let answers = mid.is_some_and(|v| {
            let key = rpc::IdKey::of(v.bytes(body));
            key.is_some() && key == rpc::IdKey::of(request_id)
        });
        if method || !answers {
            return Ok(());
        }
        found = match result.map(|r| version_of(body, &r)) {
            Some(Some(v)) => Answer::Version(v),
            _ => Answer::NoVersion,
        };
        Ok(())
    });
    found
}

/// Calls `f` with each object message of a validated body, in order.
fn walk_messages(body: &[u8], mut f: impl FnMut(&Value) -> Result<(), ScanError>) -> Result<(), ScanError> {
    let top = json::parse_value(body)?;
    match top.kind {
        Kind::Object { .. } => f(&top),
        Kind::Array => json::for_each_element(body, &top, |v| match v.kind {
            Kind::Object { .. } => f(&v),
            _ => Ok(()),
        }),
        _ => Ok(()),
    }
}

/// `result.protocolVersion` when it is a string (the last of equal keys).
fn version_of(body: &[u8], result: &Value) -> Option<String> {
    if !matches!(result.kind, Kind::Object { .. }) {
        return None;
    }
    let mut version = None;
    json::for_each_member(body, result, |k, v| {
        if k.is(body, "protocolVersion") {
            version = Some(v);
        }
        Ok::<(), ScanError>(())
    })
    .ok()?;
    version?.decode_str(body)
}

/// Calls `f(data)` for each dispatched event of type `message` in `stream`,
/// until `f` returns false. Follows WHATWG HTML §9.2.6 "Interpreting an
/// event stream": lines end with CRLF, LF or CR; one leading BOM is
/// ignored; `:` starts a comment; one space after the field's colon is
/// dropped; `data` lines are joined with LF; a blank line dispatches an
/// event that has data, typed `message` unless an `event` field names
/// another; an event cut by the end of the bytes is not dispatched.
pub(crate) fn for_each_message_event(stream: &[u8], mut f: impl FnMut(&[u8]) -> bool) {
    let mut framer = super::sse::Framer::default();
    let mut sink = MessageData::default();
    let mut rest = stream;
    loop {
        let (n, dispatched) = framer.feed(rest, &mut sink);
        rest = rest.get(n..).unwrap_or_default();
        if !dispatched {
            return;
        }
        if std::mem::take(&mut sink.ready) && !f(&sink.data) {
            return;
        }
        sink.data.clear();
        sink.message = true;
    }
}

/// The data of the event being read, and whether it is a `message` event.
struct MessageData {
    data: Vec<u8>,
    message: bool,
    /// Dispatched with data, typed `message`.
    ready: bool,
}

impl Default for MessageData {
    fn default() -> Self {
        MessageData { data: Vec::new(), message: true, ready: false }
    }
}

impl super::sse::EventSink for MessageData {
    fn data(&mut self, bytes: &[u8]) {
        self.data.extend_from_slice(bytes);
    }

    fn event_type(&mut self, value: &[u8]) {
        self.message = value.is_empty() || value == b"message";
    }

    fn dispatch(&mut self, had_data: bool) {
        self.ready = had_data && self.message;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: &str = "2025-06-18";

    fn version(v: &str) -> Answer {
        Answer::Version(v.to_owned())
    }

    /// (format, body, request id, expected).
    fn cases() -> Vec<(Format, &'static str, &'static str, Answer)> {
        use Format::{EventStream as Sse, Json};
        vec![
            (Json, r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{}}}"#, "1", version(V)),
            (Json, r#"{"result":{"protocolVersion":"2025-06-18"},"id":"a"}"#, r#""\u0061""#, version(V)),
            (Json, r#"{"result":{"protocolVersion":"2025-06-18"},"id":"a"}"#, r#""b""#, Answer::NotFound),
            // Ids match by value, as clients match them (`rpc::IdKey`).
            (Json, r#"{"result":{"protocolVersion":"2025-06-18"},"id":1}"#, r#""1""#, version(V)),
            (Json, r#"{"result":{"protocolVersion":"2025-06-18"},"id":1.0}"#, "1", version(V)),
            (Json, r#"{"result":{"protocolVersion":"2025-06-18"},"id":"1x"}"#, "1", Answer::NotFound),
            (Json, r#"{"result":{"protocolVersion":"2025\u002d06-18"},"id":1}"#, "1", version(V)),
            (Json, r#"{"result":{"protocolVersion":"x","protocolVersion":"2025-06-18"},"id":1}"#, "1", version(V)),
            (Json, r#"{"error":{"code":-32602,"message":"Unsupported protocol version"},"id":1}"#, "1", Answer::NoVersion),
            (Json, r#"{"result":{"protocolVersion":20250618},"id":1}"#, "1", Answer::NoVersion),
            (Json, r#"{"result":{"protocolVersion":"\ud800"},"id":1}"#, "1", Answer::NoVersion),
            (Json, r#"{"result":[],"id":1}"#, "1", Answer::NoVersion),
            (Json, r#"{"result":{"serverInfo":{"protocolVersion":"2025-06-18"}},"id":1}"#, "1", Answer::NoVersion),
            // A request from the server with the same id is not the answer.
            (Json, r#"{"method":"ping","id":1,"result":{"protocolVersion":"x"}}"#, "1", Answer::NotFound),
            (Json, r#"[{"method":"ping","id":1},{"id":1,"result":{"protocolVersion":"2025-06-18"}}]"#, "1", version(V)),
            (Json, r#"{"result":{"protocolVersion":"2025-06-18"},"id":1"#, "1", Answer::NotFound),
            (Json, "", "1", Answer::NotFound),
            (Json, r#"{"result":{"protocolVersion":"2025-06-18"},"id":1}"#, "{", Answer::NotFound),
            (Json, r#"{"result":{"protocolVersion":"2025-06-18"},"id":null}"#, "null", Answer::NotFound),
            // SSE: FastMCP's CRLF form.
            (
                Sse,
                "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{\"protocolVersion\":\"2025-06-18\"}}\r\n\r\n",
                "0",
                version(V),
            ),
            // LF, no space after the colon, no event field, a BOM, comments.
            (Sse, "\u{feff}: hi\n\ndata:{\"id\":0,\"result\":{\"protocolVersion\":\"2025-03-26\"}}\n\n", "0", version("2025-03-26")),
            // Lone CRs; data split over lines (joined with LF: JSON whitespace).
            (
                Sse,
                "event: message\rdata: {\"id\":\"i\",\rdata: \"result\":{\"protocolVersion\":\r\rdata: \"x\"}}\r\r",
                "\"i\"",
                Answer::NotFound,
            ),
            (
                Sse,
                "event: message\rdata: {\"id\":\"i\",\rdata: \"result\":{\"protocolVersion\":\rdata: \"2025-06-18\"}}\r\r",
                "\"i\"",
                version(V),
            ),
            // A server request and a notification first, then the answer.
            (
                Sse,
                "id: 1\nevent: message\ndata: {\"method\":\"ping\",\"id\":0}\n\nevent: message\ndata: {\"method\":\"notifications/message\"}\n\nevent: message\ndata: {\"id\":0,\"result\":{\"protocolVersion\":\"2025-06-18\"}}\n\n",
                "0",
                version(V),
            ),
            // Another event type is not a message; nor is an event without data.
            (Sse, "event: other\ndata: {\"id\":0,\"result\":{\"protocolVersion\":\"x\"}}\n\n", "0", Answer::NotFound),
            (Sse, "event: message\n\nevent: message\ndata: {\"id\":0,\"result\":{\"protocolVersion\":\"y\"}}\n\n", "0", version("y")),
            // The event type resets after each dispatch.
            (Sse, "event: other\ndata: 1\n\ndata: {\"id\":0,\"result\":{\"protocolVersion\":\"z\"}}\n\n", "0", version("z")),
            // Cut before the dispatching blank line: not yet.
            (Sse, "event: message\ndata: {\"id\":0,\"result\":{\"protocolVersion\":\"x\"}}\n", "0", Answer::NotFound),
            (Sse, "event: message\ndata: {\"id\":0,\"result\":{\"protocolVersion\":\"x\"}}", "0", Answer::NotFound),
            // The first answer wins; an error is an answer.
            (
                Sse,
                "data: {\"id\":0,\"error\":{\"code\":1,\"message\":\"m\"}}\n\ndata: {\"id\":0,\"result\":{\"protocolVersion\":\"x\"}}\n\n",
                "0",
                Answer::NoVersion,
            ),
            // Non-JSON data is skipped.
            (Sse, "data: hello\n\ndata: {\"id\":0,\"result\":{\"protocolVersion\":\"x\"}}\n\n", "0", version("x")),
            // `data` without a colon is an empty data line.
            (Sse, "data\ndata: {\"id\":0,\"result\":{\"protocolVersion\":\"x\"}}\n\n", "0", version("x")),
        ]
    }

    #[test]
    fn protocol_version_of_json_and_sse_answers() {
        for (format, body, id, want) in cases() {
            assert_eq!(
                protocol_version(body.as_bytes(), format, id.as_bytes()),
                want,
                "{format:?} {body:?} {id}"
            );
        }
    }

    #[test]
    fn sse_cut_at_every_offset_never_finds_a_wrong_answer() {
        let stream = "event: message\r\ndata: {\"id\":5,\"result\":\r\ndata: {\"protocolVersion\":\"2025-06-18\"}}\r\n\r\n";
        let b = stream.as_bytes();
        for i in 0..b.len() {
            let got = protocol_version(&b[..i], Format::EventStream, b"5");
            // Complete only once the dispatching blank line is in (the
            // final CRLF's CR already ends that line).
            let want = if i >= b.len() - 1 { version(V) } else { Answer::NotFound };
            assert_eq!(got, want, "cut at {i}");
        }
        assert_eq!(protocol_version(b, Format::EventStream, b"5"), version(V));
    }

    #[test]
    fn json_cut_at_every_offset_is_not_found() {
        let body = br#"{"jsonrpc":"2.0","id":"x","result":{"protocolVersion":"2025-06-18"}}"#;
        for i in 0..body.len() {
            assert_eq!(protocol_version(&body[..i], Format::Json, br#""x""#), Answer::NotFound, "cut at {i}");
        }
    }

    #[test]
    fn format_from_content_type() {
        let cases: &[(&[u8], Option<Format>)] = &[
            (b"application/json", Some(Format::Json)),
            (b"Application/JSON; charset=utf-8", Some(Format::Json)),
            (b" text/event-stream ", Some(Format::EventStream)),
            (b"text/event-stream;charset=utf-8", Some(Format::EventStream)),
            (b"text/plain", None),
            (b"application/json-seq", None),
            (b"", None),
        ];
        for (value, want) in cases {
            assert_eq!(Format::from_content_type(value), *want, "{:?}", String::from_utf8_lossy(value));
        }
    }

    #[test]
    fn sse_events_are_split_like_the_spec() {
        let events = |s: &[u8]| {
            let mut out = Vec::new();
            for_each_message_event(s, |d| {
                out.push(String::from_utf8_lossy(d).into_owned());
                true
            });
            out
        };
        assert_eq!(events(b"data: a\ndata:  b\ndata\n\n"), ["a\n b\n"]);
        assert_eq!(events(b"data: a\r\n\r\ndata: b\r\r\ndata: c\n\n"), ["a", "b", "c"]);
        assert_eq!(events(b"\xEF\xBB\xBFdata: a\n\n\xEF\xBB\xBFdata: b\n\n"), ["a"]);
        assert_eq!(events(b"event: message\nevent: x\ndata: a\n\nevent:\ndata: b\n\n"), ["b"]);
        assert_eq!(events(b":data: x\n\ndata: \n\n"), [""]);
        assert!(events(b"").is_empty());
        // Stops when told to.
        let mut n = 0;
        for_each_message_event(b"data: 1\n\ndata: 2\n\n", |_| {
            n += 1;
            false
        });
        assert_eq!(n, 1);
    }
}

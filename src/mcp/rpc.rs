//! What a JSON-RPC body holds (JSON-RPC 2.0; `§` below are its sections), as far as the proxy must know to answer it:
//! for one message or each element of a batch, whether it is a request, a
//! notification or a response, its method, and its `id` exactly as sent;
//! and the JSON-RPC error body the proxy writes when it answers a body
//! itself. Pure: bytes in, values out; no I/O, no clock. It never changes a
//! body and never chooses an HTTP status (that is the caller's).
//!
//! Reading follows `json.rs` (Python's `json.loads` on UTF-8): escaped keys
//! are decoded (`"\u0069d"` is `id`), and of two equal keys the last counts,
//! as in the upstream's `json.loads` and in serde_json.

use std::borrow::Cow;
use std::io::Write as _;

use smallvec::SmallVec;

use crate::mcp::json::{self, Kind, ScanError, Value};

/// The method that opens a session (MCP "Lifecycle", Initialization).
pub const INITIALIZE: &str = "initialize";
/// The notification a client sends once initialised.
pub const INITIALIZED: &str = "notifications/initialized";
/// The method whose arguments carry the caller's identity.
pub const TOOLS_CALL: &str = "tools/call";

/// JSON-RPC 2.0 §5.1: invalid JSON was received.
pub const PARSE_ERROR: i32 = -32700;
/// JSON-RPC 2.0 §5.1: the JSON sent is not a valid Request object.
pub const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC 2.0 §5.1: -32000 to -32099 are reserved for implementation-
/// defined server errors; the proxy's own failures (upstream unavailable,
/// timed out, invalid) use this one.
pub const SERVER_ERROR: i32 = -32000;

/// JSON-RPC 2.0 §5.1 "Invalid params"; MCP answers a call of an unknown
/// tool with it (Tools, Error Handling).
pub const INVALID_PARAMS: i32 = -32602;

/// JSON-RPC 2.0 §5.1 "Internal error".
pub const INTERNAL_ERROR: i32 = -32603;

/// The `tools/list` method.
pub const TOOLS_LIST: &str = "tools/list";

/// What one message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Has `method` and `id` (JSON-RPC 2.0 §4): expects exactly one answer.
    Request,
    /// Has `method` and no `id` member (JSON-RPC 2.0 §4.1): the server must
    /// not answer it.
    Notification,
    /// Has no `method`: a client's answer to a server's request (§5).
    Response,
    /// Not an object (a bare value, or a batch element such as `1`): JSON-RPC
    /// 2.0 §6 answers it with an Invalid Request error whose id is null.
    Invalid,
}

/// A message's `id`, as the text to echo back in an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Id<'b> {
    /// No `id` member.
    Absent,
    /// A string or number: its JSON text exactly as sent, quotes included.
    Echo(&'b [u8]),
    /// `null`.
    Null,
    /// A value no answer can carry as an id: an object, array or boolean
    /// (JSON-RPC 2.0 §4 allows only a string, number or null), the Python
    /// literals `NaN`/`Infinity` (not JSON), a number at or beyond 1e300
    /// (RFC 8259 §6 leaves the range to implementations, and JSON readers
    /// refuse or round such numbers differently), or a string with a lone
    /// surrogate escape (RFC 8259 §8.2: unpredictable). JSON-RPC 2.0 §5: an
    /// answer whose request id cannot be determined carries null.
    Refused,
}

impl<'b> Id<'b> {
    /// The JSON text to write as the `id` of an answer: the id as sent, or
    /// `null`.
    pub fn json(&self) -> &'b [u8] {
        match self {
            Id::Echo(text) => text,
            Id::Absent | Id::Null | Id::Refused => b"null",
        }
    }
}

/// One message of a body: its role, method and id. Borrowed from the body,
/// `Copy`, no allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'b> {
    body: &'b [u8],
    role: Role,
    method: Option<Value>,
    id: Id<'b>,
}

impl<'b> Message<'b> {
    pub fn role(&self) -> Role {
        self.role
    }

    /// The `id` to echo (`Id::Absent` for a notification).
    pub fn id(&self) -> Id<'b> {
        self.id
    }

    /// Whether the proxy owes this message an answer when it answers the
    /// body itself: requests, and elements that are not messages at all.
    pub fn expects_answer(&self) -> bool {
        matches!(self.role, Role::Request | Role::Invalid)
    }

    /// The decoded method name; `None` when there is no `method`, when it is
    /// not a string, or when it holds a lone surrogate. Borrowed unless it
    /// contains an escape.
    pub fn method(&self) -> Option<Cow<'b, str>> {
        let v = self.method?;
        match v.kind {
            Kind::String { escaped: false } => {
                let raw = self.body.get(v.start + 1..v.end.checked_sub(1)?)?;
                std::str::from_utf8(raw).ok().map(Cow::Borrowed)
            }
            Kind::String { escaped: true } => v.decode_str(self.body).map(Cow::Owned),
            _ => None,
        }
    }

    /// Whether the method is the string `name` (compared after decoding
    /// escapes, without allocating): e.g. [`INITIALIZE`], [`INITIALIZED`],
    /// [`TOOLS_CALL`].
    pub fn is_method(&self, name: &str) -> bool {
        self.method.is_some_and(|v| v.is_str(self.body, name))
    }
}

/// A JSON-RPC body: one message, or a batch (a top-level array, allowed by
/// protocol 2025-03-26 and removed in 2025-06-18, so both are read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Body<'b> {
    batch: bool,
    /// One inline slot: a single message costs no allocation.
    messages: SmallVec<[Message<'b>; 1]>,
}

impl<'b> Body<'b> {
    pub fn is_batch(&self) -> bool {
        self.batch
    }

    /// The messages in order: the one message, or each batch element.
    pub fn messages(&self) -> &[Message<'b>] {
        &self.messages
    }

    /// A body whose messages another scan already read (see
    /// `Message::of_object`).
    pub fn of_envelope(batch: bool, messages: impl Iterator<Item = Message<'b>>) -> Body<'b> {
        Body { batch, messages: messages.collect() }
    }

    /// The message of a body that is not a batch.
    pub fn single(&self) -> Option<&Message<'b>> {
        match self.batch {
            false => self.messages.first(),
            true => None,
        }
    }

    /// Whether an answer made by the proxy has a body: false when the body
    /// holds only notifications and responses (the HTTP answer is then 202
    /// Accepted with no body). True for an empty batch, which JSON-RPC 2.0
    /// §6 answers with one Invalid Request error. Agrees with
    /// [`write_error`] writing anything.
    pub fn expects_answer(&self) -> bool {
        (self.batch && self.messages.is_empty()) || self.messages.iter().any(Message::expects_answer)
    }
}

/// Reads a request (or response) body. Errors are those of the strict
/// scanner (`json.rs`); the caller answers them with [`PARSE_ERROR`] and a
/// null id (`write_error(.., None, ..)`). Must not be given a body larger
/// than the caller's bound; it holds no limit of its own.
pub fn parse(body: &[u8]) -> Result<Body<'_>, ScanError> {
    let top = json::parse_value(body)?;
    let mut messages = SmallVec::new();
    let batch = top.kind == Kind::Array;
    if batch {
        json::for_each_element(body, &top, |v| {
            messages.push(message(body, v)?);
            Ok::<(), ScanError>(())
        })?;
    } else {
        messages.push(message(body, top)?);
    }
    Ok(Body { batch, messages })
}

fn message(body: &[u8], v: Value) -> Result<Message<'_>, ScanError> {
    if !matches!(v.kind, Kind::Object { .. }) {
        return Ok(Message::invalid(body));
    }
    let (mut method, mut id) = (None, None);
    // Last of equal keys wins, as in the upstream's reading.
    json::for_each_member(body, &v, |k, v| {
        if k.is(body, "method") {
            method = Some(v);
        } else if k.is(body, "id") {
            id = Some(v);
        }
        Ok::<(), ScanError>(())
    })?;
    Ok(Message::of_object(body, method, id))
}

impl<'b> Message<'b> {
    /// A body element that is not a message object (JSON-RPC 2.0 §5: its
    /// answer is an Invalid Request error with a null id).
    pub fn invalid(body: &'b [u8]) -> Message<'b> {
        Message { body, role: Role::Invalid, method: None, id: Id::Null }
    }

    /// The message object of `body` whose `method` and `id` members (the
    /// last of equal keys) are these spans: what another scan of the body
    /// already found (the stamp scan's envelope), so it is not parsed again.
    pub fn of_object(body: &'b [u8], method: Option<Value>, id: Option<Value>) -> Message<'b> {
        let role = match (method, id) {
            (Some(_), Some(_)) => Role::Request,
            (Some(_), None) => Role::Notification,
            (None, _) => Role::Response,
        };
        let id = id.map_or(Id::Absent, |v| echo_id(body, v));
        Message { body, role, method, id }
    }
}

/// What an answer may carry back of the id value `v`.
fn echo_id(body: &[u8], v: Value) -> Id<'_> {
    let text = v.bytes(body);
    let usable = match v.kind {
        Kind::String { escaped } => !escaped || v.decode_str(body).is_some(),
        Kind::Number => number_in_range(text),
        _ => false,
    };
    if usable {
        Id::Echo(text)
    } else if v.kind == Kind::Null {
        Id::Null
    } else {
        Id::Refused
    }
}

/// An RFC 8259 number comfortably inside a double's range (`NaN` and
/// `Infinity` are not RFC 8259 numbers). Rust's float syntax is a superset
/// of RFC 8259's, and its parse does not allocate.
fn number_in_range(text: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(text) else {
        return false;
    };
    if s.contains(['N', 'I']) {
        return false;
    }
    s.parse::<f64>().is_ok_and(|f| f.abs() < 1e300)
}

/// An id as MCP clients match an answer to their request: by value. The
/// TypeScript SDK keys its pending requests by `Number(id)`, and the Python
/// SDK turns a string of digits in an answer back into the int it sent, so
/// for them `7`, `7.0`, `"7"`, `" 7 "`, `"7e0"` and `"\u0037"` are all one
/// id. The rule here: a number is its value; a string whose decoded text,
/// trimmed of ASCII whitespace, reads as a decimal number (sign, digits,
/// fraction, exponent) is that number's value; any other string is its
/// decoded text. It is looser than any one client on purpose: it is used
/// where a wrong "different" would let an answer pass unfiltered.
#[derive(Clone, Debug, PartialEq)]
pub enum IdKey {
    Number(f64),
    Text(String),
}

impl IdKey {
    /// The key of the id whose JSON text is `text`; `None` for null, other
    /// kinds and strings that are not text (a lone surrogate).
    pub fn of(text: &[u8]) -> Option<IdKey> {
        // The ids clients send (1, 2, 3...), and strings of digits, read
        // without a parse: the answer reader keys every request and answer.
        let fast = match text.strip_prefix(b"\"").and_then(|t| t.strip_suffix(b"\"")) {
            Some(inner) => small_integer(inner),
            // A JSON number has no leading zero (a string's may).
            None if !matches!(text.strip_prefix(b"-").unwrap_or(text), [b'0', _, ..]) => small_integer(text),
            None => None,
        };
        match fast {
            Some(n) => Some(IdKey::Number(n)),
            None => IdKey::parsed(text),
        }
    }

    /// `of`, for any id text.
    fn parsed(text: &[u8]) -> Option<IdKey> {
        let v = json::parse_value(text).ok()?;
        match v.kind {
            Kind::Number => decimal(v.bytes(text)).map(IdKey::Number),
            Kind::String { .. } => {
                let s = v.decode_cow(text)?;
                let trimmed = s.trim_matches(|c: char| c.is_ascii_whitespace());
                Some(match decimal(trimmed.as_bytes()) {
                    Some(n) => IdKey::Number(n),
                    None => IdKey::Text(s.into_owned()),
                })
            }
            _ => None,
        }
    }
}

/// The value of `-?digits` with at most 15 digits (any integer of 15 digits
/// is exact as a double, so this is what the float parse gives).
fn small_integer(text: &[u8]) -> Option<f64> {
    let (negative, digits) = match text.strip_prefix(b"-") {
        Some(d) => (true, d),
        None => (false, text),
    };
    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')) as f64;
    Some(if negative { -n } else { n })
}

/// The value of `[+-]digits[.digits][(e|E)[+-]digits]` (a leading or
/// trailing dot allowed, as `Number` allows it), finite; `None` otherwise.
fn decimal(text: &[u8]) -> Option<f64> {
    let body = text.strip_prefix(b"-").or_else(|| text.strip_prefix(b"+")).unwrap_or(text);
    let (mantissa, exponent) = match body.iter().position(|&b| b == b'e' || b == b'E') {
        Some(at) => (body.get(..at)?, Some(body.get(at + 1..)?)),
        None => (body, None),
    };
    let (int, frac) = match mantissa.iter().position(|&b| b == b'.') {
        Some(at) => (mantissa.get(..at)?, mantissa.get(at + 1..)?),
        None => (mantissa, &b""[..]),
    };
    let digits = |d: &[u8]| d.iter().all(u8::is_ascii_digit);
    if !(digits(int) && digits(frac)) || int.len() + frac.len() == 0 {
        return None;
    }
    if let Some(e) = exponent {
        let e = e.strip_prefix(b"-").or_else(|| e.strip_prefix(b"+")).unwrap_or(e);
        if e.is_empty() || !digits(e) {
            return None;
        }
    }
    std::str::from_utf8(text).ok()?.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// Writes the JSON-RPC error body of a proxy-made answer to `answered`
/// (`None`: the body could not be read, or was never read) into `out`, and
/// returns how many error objects it wrote; 0 means nothing was written (the
/// body holds only notifications and responses: answer 202, no body).
///
/// - Unknown body: one error, id null (JSON-RPC 2.0 §5: null only when the
///   id cannot be determined).
/// - One message: one error carrying its id; none for a notification or a
///   response (§4.1: notifications are never answered).
/// - A batch: an array with one error per request, in order, and one with a
///   null id per element that is not a message (§6); none for notifications
///   and responses, and no empty array (§6: "MUST NOT return an empty
///   Array"). An empty batch gets one error object, id null (§6).
///
/// Appends to `out` (a reused buffer costs no allocation); the output is
/// JSON any reader accepts. It must not be used for an answer the upstream
/// gave: those are relayed, never rewritten.
pub fn write_error(out: &mut Vec<u8>, answered: Option<&Body<'_>>, code: i32, message: &str) -> usize {
    let Some(body) = answered else {
        write_one(out, b"null", code, message);
        return 1;
    };
    if !body.batch {
        return match body.messages.first() {
            Some(m) if m.expects_answer() => {
                write_one(out, m.id.json(), code, message);
                1
            }
            _ => 0,
        };
    }
    if body.messages.is_empty() {
        write_one(out, b"null", code, message);
        return 1;
    }
    let mut n = 0;
    for m in body.messages.iter().filter(|m| m.expects_answer()) {
        out.push(if n == 0 { b'[' } else { b',' });
        write_one(out, m.id.json(), code, message);
        n += 1;
    }
    if n > 0 {
        out.push(b']');
    }
    n
}

/// One JSON-RPC 2.0 §5 error Response object answering the request whose
/// id is `id` (JSON text: see `answer_id`).
pub fn write_error_for(out: &mut Vec<u8>, id: &[u8], code: i32, message: &str) {
    write_one(out, id, code, message);
}

/// The id text an answer to a request whose `id` member is `v` carries: the
/// id as sent, or `null` (see `Id`).
pub fn answer_id(body: &[u8], v: json::Value) -> &[u8] {
    echo_id(body, v).json()
}

/// One JSON-RPC 2.0 §5 error Response object.
fn write_one(out: &mut Vec<u8>, id: &[u8], code: i32, message: &str) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id);
    // Writing into a Vec cannot fail.
    let _ = write!(out, ",\"error\":{{\"code\":{code},\"message\":");
    json::write_json_string(message, out);
    out.extend_from_slice(b"}}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value as Json};

    /// (body, batch, [(role, method, id text)]) per message.
    type Case = (&'static str, bool, &'static [(Role, Option<&'static str>, Id<'static>)]);

    const CASES: &[Case] = &[
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#,
            false,
            &[(Role::Request, Some("initialize"), Id::Echo(b"1"))],
        ),
        (
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            false,
            &[(Role::Notification, Some("notifications/initialized"), Id::Absent)],
        ),
        (
            r#"{"jsonrpc":"2.0","id":"a\"b","result":{}}"#,
            false,
            &[(Role::Response, None, Id::Echo(br#""a\"b""#))],
        ),
        (r#"{"id":null,"method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Null)]),
        (r#"{"id":-12.5e3,"method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Echo(b"-12.5e3"))]),
        (r#"{"id":{"a":1},"method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Refused)]),
        (r#"{"id":[1],"method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Refused)]),
        (r#"{"id":true,"method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Refused)]),
        (r#"{"id":NaN,"method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Refused)]),
        (r#"{"id":-Infinity,"method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Refused)]),
        (r#"{"id":1e300,"method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Refused)]),
        (r#"{"id":1e400,"method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Refused)]),
        (r#"{"id":1e-400,"method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Echo(b"1e-400"))]),
        (
            r#"{"id":123456789012345678901234567890,"method":"x"}"#,
            false,
            &[(Role::Request, Some("x"), Id::Echo(b"123456789012345678901234567890"))],
        ),
        (r#"{"id":"\ud800","method":"x"}"#, false, &[(Role::Request, Some("x"), Id::Refused)]),
        (
            r#"{"id":"\ud83d\ude00","method":"x"}"#,
            false,
            &[(Role::Request, Some("x"), Id::Echo(br#""\ud83d\ude00""#))],
        ),
        // Escaped keys and method; the last of equal keys counts.
        (
            r#"{"\u0069d":"k","m\u0065thod":"tools\/call"}"#,
            false,
            &[(Role::Request, Some("tools/call"), Id::Echo(br#""k""#))],
        ),
        (
            r#"{"id":1,"id":"two","method":"a","method":"b"}"#,
            false,
            &[(Role::Request, Some("b"), Id::Echo(br#""two""#))],
        ),
        // A method that is not a string still makes a request.
        (r#"{"id":3,"method":7}"#, false, &[(Role::Request, None, Id::Echo(b"3"))]),
        (r#"{}"#, false, &[(Role::Response, None, Id::Absent)]),
        (r#" 1 "#, false, &[(Role::Invalid, None, Id::Null)]),
        (r#""initialize""#, false, &[(Role::Invalid, None, Id::Null)]),
        // Keys inside params do not count.
        (
            r#"{"method":"n","params":{"id":9,"method":"m"}}"#,
            false,
            &[(Role::Notification, Some("n"), Id::Absent)],
        ),
        ("[]", true, &[]),
        (
            r#"[{"id":1,"method":"a"},{"method":"b"},2,{"id":"r","result":{}},{"id":"x","method":"c"}]"#,
            true,
            &[
                (Role::Request, Some("a"), Id::Echo(b"1")),
                (Role::Notification, Some("b"), Id::Absent),
                (Role::Invalid, None, Id::Null),
                (Role::Response, None, Id::Echo(br#""r""#)),
                (Role::Request, Some("c"), Id::Echo(br#""x""#)),
            ],
        ),
        // A nested array is an element, not a batch.
        (r#"[[{"id":1,"method":"a"}]]"#, true, &[(Role::Invalid, None, Id::Null)]),
    ];

    #[test]
    fn messages_roles_methods_and_ids() {
        for (body, batch, want) in CASES {
            let b = parse(body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {e}"));
            assert_eq!(b.is_batch(), *batch, "{body}");
            let got: Vec<_> = b.messages().iter().map(|m| (m.role(), m.method(), m.id())).collect();
            let want: Vec<_> = want.iter().map(|(r, m, i)| (*r, m.map(Cow::Borrowed), *i)).collect();
            assert_eq!(got, want, "{body}");
        }
    }

    #[test]
    fn is_method() {
        let body =
            br#"[{"method":"tools\/call","id":1},{"method":"notifications/initialized"},{"method":1}]"#;
        let b = parse(body).unwrap();
        let m = b.messages();
        assert!(m[0].is_method(TOOLS_CALL));
        assert!(!m[0].is_method(INITIALIZE));
        assert!(m[1].is_method(INITIALIZED));
        assert!(!m[2].is_method("1"));
        assert_eq!(m[1].role(), Role::Notification);
        assert!(b.single().is_none());
        let one = br#"{"method":"initialize","id":0}"#;
        assert!(parse(one).unwrap().single().is_some_and(|m| m.is_method(INITIALIZE)));
    }

    #[test]
    fn non_json_is_refused() {
        for body in ["", "{", "[1,]", "{\"id\":1,}", "\u{feff}{}", "{}{}"] {
            assert!(parse(body.as_bytes()).is_err(), "{body:?}");
        }
        assert!(parse(b"\"\xff\"").is_err());
        let deep = "[".repeat(100_000);
        assert!(matches!(parse(deep.as_bytes()), Err(ScanError::TooDeep { .. })));
    }

    /// (body or None for unreadable, expected body as serde_json sees it,
    /// or None for nothing written).
    fn error_cases() -> Vec<(Option<&'static str>, Option<Json>)> {
        let e = |id: Json| json!({"jsonrpc":"2.0","id":id,"error":{"code":-32000,"message":"upstream \"down\"\n"}});
        vec![
            (None, Some(e(Json::Null))),
            (Some(r#"{"id":7,"method":"tools/call"}"#), Some(e(json!(7)))),
            (Some(r#"{"id":"s-1","method":"tools/call"}"#), Some(e(json!("s-1")))),
            (Some(r#"{"id":null,"method":"x"}"#), Some(e(Json::Null))),
            (Some(r#"{"id":{"x":1},"method":"x"}"#), Some(e(Json::Null))),
            (Some(r#"{"method":"notifications/initialized"}"#), None),
            (Some(r#"{"id":1,"result":{}}"#), None),
            (Some("17"), Some(e(Json::Null))),
            (Some("[]"), Some(e(Json::Null))),
            (Some(r#"[{"method":"a"},{"id":2,"result":1}]"#), None),
            (Some(r#"[{"method":"a"},{"id":2,"method":"b"}]"#), Some(json!([e(json!(2))]))),
            (
                Some(r#"[{"id":1,"method":"a"},{"method":"n"},true,{"id":"z","method":"b"}]"#),
                Some(json!([e(json!(1)), e(Json::Null), e(json!("z"))])),
            ),
        ]
    }

    #[test]
    fn error_bodies_carry_the_ids() {
        for (body, want) in error_cases() {
            let parsed = body.map(|b| parse(b.as_bytes()).unwrap());
            let mut out = b"prefix".to_vec();
            let n = write_error(&mut out, parsed.as_ref(), SERVER_ERROR, "upstream \"down\"\n");
            assert_eq!(&out[..6], b"prefix", "appends");
            let out = &out[6..];
            match want {
                None => {
                    assert_eq!((n, out), (0, &b""[..]), "{body:?}");
                    assert!(!parsed.unwrap().expects_answer(), "{body:?}");
                }
                Some(want) => {
                    let got: Json = serde_json::from_slice(out).unwrap_or_else(|e| panic!("{body:?}: {e}"));
                    assert_eq!(got, want, "{body:?}");
                    assert_eq!(n, want.as_array().map_or(1, Vec::len));
                    assert!(parsed.map_or(true, |p| p.expects_answer()), "{body:?}");
                }
            }
        }
    }

    #[test]
    fn error_ids_are_echoed_byte_for_byte() {
        let body = br#"[{"id":1.50,"method":"a"},{"id":"\u00e9\/","method":"b"}]"#;
        let mut out = Vec::new();
        write_error(&mut out, Some(&parse(body).unwrap()), PARSE_ERROR, "m");
        assert_eq!(
            out,
            br#"[{"jsonrpc":"2.0","id":1.50,"error":{"code":-32700,"message":"m"}},{"jsonrpc":"2.0","id":"\u00e9\/","error":{"code":-32700,"message":"m"}}]"#
        );
        // The strict scanner reads it back too.
        assert!(parse(&out).is_ok());
    }

    #[test]
    fn single_message_costs_no_allocation() {
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#;
        let b = parse(body).unwrap();
        assert!(!b.messages.spilled());
        assert!(matches!(b.single().and_then(Message::method), Some(Cow::Borrowed("tools/call"))));
    }

    #[test]
    fn ids_match_by_value_as_clients_match_them() {
        let same: &[(&str, &str)] = &[
            ("7", "7"),
            ("7", "7.0"),
            ("7", "\"7\""),
            ("7", "\" 7 \""),
            ("7", "\"7.0\""),
            ("7", "\"7e0\""),
            ("7", "\"\\u0037\""),
            ("7", "\"+7\""),
            ("-7", "\"-7\""),
            ("70", "7e1"),
            ("\"a\"", "\"\\u0061\""),
            ("\"é\"", "\"\\u00e9\""),
        ];
        for (a, b) in same {
            assert_eq!(IdKey::of(a.as_bytes()), IdKey::of(b.as_bytes()), "{a} {b}");
            assert!(IdKey::of(a.as_bytes()).is_some(), "{a}");
        }
        let different: &[(&str, &str)] =
            &[("7", "8"), ("7", "\"7x\""), ("7", "\"x7\""), ("\"a\"", "\"A\""), ("\"a \"", "\"a\"")];
        for (a, b) in different {
            assert_ne!(IdKey::of(a.as_bytes()), IdKey::of(b.as_bytes()), "{a} {b}");
        }
        for none in ["null", "true", "{}", "[]", "\"\\ud800\""] {
            assert_eq!(IdKey::of(none.as_bytes()), None, "{none}");
        }
        // Not numbers, whatever Rust's float parse would take.
        for text in ["\"inf\"", "\"NaN\"", "\"\"", "\".\"", "\"1e\"", "\"--1\"", "\"1_0\""] {
            assert!(matches!(IdKey::of(text.as_bytes()), Some(IdKey::Text(_))), "{text}");
        }
    }

    /// The digits-only fast path of `IdKey::of` keys every id as the parse
    /// does: numbers and strings, signs, leading zeros (not JSON in a
    /// number), lengths on both sides of the 15 digits it takes.
    #[test]
    fn the_fast_path_keys_ids_as_the_parse_does() {
        let mut texts =
            vec!["0".to_string(), "-0".into(), "\"-0\"".into(), "-".into(), "\"-\"".into(), "\"".into()];
        for len in 1..=18 {
            for digits in [
                "1".repeat(len),
                "9".repeat(len),
                format!("0{}", "7".repeat(len - 1)),
                format!("{}0", "5".repeat(len - 1)),
            ] {
                for sign in ["", "-", "+"] {
                    texts.push(format!("{sign}{digits}"));
                    texts.push(format!("\"{sign}{digits}\""));
                }
            }
        }
        for text in &texts {
            assert_eq!(IdKey::of(text.as_bytes()), IdKey::parsed(text.as_bytes()), "{text}");
        }
        assert_eq!(IdKey::of(b"007"), None, "not JSON");
        assert_eq!(IdKey::of(br#""007""#), Some(IdKey::Number(7.0)));
    }
}

//! The audit log's records: JSON Lines, one object per line, its keys in a
//! fixed order (README "Audit log" lists them). Keys follow OpenTelemetry's
//! semantic conventions for MCP where they have one (`mcp.session.id`,
//! `jsonrpc.request.id`, `mcp.method.name`, `gen_ai.tool.name`,
//! `http.response.status_code`, `error.type`). A record never holds an
//! argument value other than `claimed`, a token or a header value (the
//! session id is the one header the operator needs to follow a session).

use super::clock::Stamps;
use crate::mcp::json::{write_json_string, write_json_text};
use smallvec::SmallVec;
use std::time::Duration;

/// A record's short text (a method or tool name), kept inline up to 32
/// bytes: a record is made per request, and three allocations each were a
/// sixth of the audit's cost.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Text(SmallVec<[u8; 32]>);

impl std::ops::Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        // Made only from a `str` (`From`), so always UTF-8 (checked here:
        // the hot paths take `as_bytes`).
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl Text {
    /// The text's UTF-8 bytes, unchecked.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text(SmallVec::from_slice(s.as_bytes()))
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

/// A request id's JSON text, kept inline up to 32 bytes.
pub type IdText = SmallVec<[u8; 32]>;

/// A session id as the client sent it, kept inline up to 48 bytes (a UUID's
/// text is 36): a record is made per request, and its allocation was one.
pub type SessionText = SmallVec<[u8; 48]>;

/// Longest method or tool name written (a client may send any length).
pub const MAX_NAME: usize = 128;
/// Longest id text written as sent; a longer one is written as `null`.
pub const MAX_ID: usize = 256;
/// Bytes of a claimed identity kept (cut at a character boundary).
pub const MAX_CLAIMED: usize = 64;

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// A result (not a tool error), or a legacy POST the upstream accepted.
    Ok,
    /// A JSON-RPC error, or an HTTP error status without one.
    Error,
    /// A `tools/call` result with `isError: true`.
    ToolError,
    /// Answered by the proxy without asking the upstream (the policy, a
    /// body it cannot vouch for).
    Refused,
    /// The answer was cut short (the upstream or the client went away).
    Cut,
}

impl Outcome {
    pub const ALL: [Outcome; 5] =
        [Outcome::Ok, Outcome::Error, Outcome::ToolError, Outcome::Refused, Outcome::Cut];

    /// Its place in `ALL`.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::ToolError => "tool_error",
            Outcome::Refused => "refused",
            Outcome::Cut => "cut",
        }
    }
}

/// One JSON-RPC request, as relayed or answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// The session id the client holds (none outside a session).
    pub session: Option<SessionText>,
    /// The request's id, its JSON text as sent.
    pub id: IdText,
    pub method: Text,
    /// `params.name` of a `tools/call`.
    pub tool: Option<Text>,
    pub status: u16,
    pub outcome: Option<Outcome>,
    /// The JSON-RPC error code as a string, the HTTP status, or the
    /// proxy's reason.
    pub error_type: Option<Box<str>>,
    pub by_proxy: bool,
    /// Why the proxy answered (`refused_body`, `hidden_tool`,
    /// `upstream_unavailable`, `timeout`, `bad_upstream`).
    pub reason: Option<&'static str>,
    pub duration_ms: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// The identity argument the client sent, when it is not the agent's
    /// name: its first `MAX_CLAIMED` bytes.
    pub claimed: Option<Box<str>>,
}

/// One audit record's event.
// Records live briefly, in a connection's reused `Vec`: a `Request` kept
// inline costs no allocation, which boxing it would bring back.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Request(Request),
    /// An `initialize` answered with a session id.
    SessionCreated {
        session: Box<[u8]>,
    },
    /// A recorded session re-initialised after an upstream restart.
    SessionReinitialised {
        session: Box<[u8]>,
        ok: bool,
    },
    /// The client's DELETE of its session passed.
    SessionDeleted {
        session: Box<[u8]>,
    },
    /// The identity in force changed (its name, or only its token).
    IdentityChanged {
        previous: Box<str>,
    },
    /// A credential source gave a new token (never written: the token).
    CredentialRenewed {
        source: &'static str,
        reason: &'static str,
        /// Seconds since the epoch; `None`: the token does not expire.
        expires_at: Option<u64>,
    },
    /// A credential source failed; the token in force was kept.
    CredentialFailed {
        source: &'static str,
        reason: &'static str,
        /// What failed (never the source's output).
        why: Box<str>,
    },
}

/// `text`'s first `max` bytes, cut at a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// A record key as it is written, `,"NAME":`, made at compile time.
macro_rules! k {
    ($name:literal) => {
        concat!(",\"", $name, "\":")
    };
}

/// A key and one of the format's own words (no escape needed) as they are
/// written, `,"NAME":"WORD"`, made at compile time: one copy, not four.
macro_rules! kw {
    ($name:literal, $word:literal) => {
        concat!(",\"", $name, "\":\"", $word, "\"")
    };
}

/// `k`: a key made by `k!`.
fn key(out: &mut Vec<u8>, k: &str) {
    out.extend_from_slice(k.as_bytes());
}

fn string(out: &mut Vec<u8>, k: &str, v: &str) {
    key(out, k);
    write_json_string(v, out);
}

fn bytes(out: &mut Vec<u8>, k: &str, v: &[u8]) {
    match std::str::from_utf8(v) {
        Ok(text) => string(out, k, text),
        Err(_) => string(out, k, &String::from_utf8_lossy(v)),
    }
}

/// A `Text` value, its first `max` bytes (cut at a character boundary).
fn text(out: &mut Vec<u8>, k: &str, v: &Text, max: usize) {
    key(out, k);
    let mut end = v.as_bytes().len().min(max);
    // Back to the start of the character `end` falls in (UTF-8
    // continuation bytes are 0b10xxxxxx).
    while end > 0 && v.as_bytes().get(end).is_some_and(|b| b & 0xc0 == 0x80) {
        end -= 1;
    }
    write_json_text(v.as_bytes().get(..end).unwrap_or_default(), out);
}

/// A value known to need no escape (a fixed word of the format).
fn word(out: &mut Vec<u8>, k: &str, v: &str) {
    key(out, k);
    out.push(b'"');
    out.extend_from_slice(v.as_bytes());
    out.push(b'"');
}

fn number(out: &mut Vec<u8>, k: &str, v: u64) {
    key(out, k);
    crate::http::write::push_decimal(out, v);
}

/// `,"http.response.status_code":N`: three digits for a status from
/// 100 to 999 (every status a response head can carry), written with
/// constant divisors.
fn status(out: &mut Vec<u8>, v: u16) {
    if !(100..=999).contains(&v) {
        return number(out, k!("http.response.status_code"), u64::from(v));
    }
    key(out, k!("http.response.status_code"));
    let digit = |d: u16| b'0' + (d % 10) as u8;
    out.extend_from_slice(&[digit(v / 100), digit(v / 10), digit(v)]);
}

/// `,"outcome":"…"` for `o` (`Outcome::as_str`, made at compile time).
fn outcome_field(o: Outcome) -> &'static str {
    match o {
        Outcome::Ok => kw!("outcome", "ok"),
        Outcome::Error => kw!("outcome", "error"),
        Outcome::ToolError => kw!("outcome", "tool_error"),
        Outcome::Refused => kw!("outcome", "refused"),
        Outcome::Cut => kw!("outcome", "cut"),
    }
}

/// Appends `record` as one line: `ts` (since the epoch), `event`, `agent`
/// (the name in force), then the event's keys.
#[cfg(test)]
pub fn write_record(ts: Duration, agent: &str, record: &Record, out: &mut Vec<u8>) {
    Writer::default().write(ts, agent, record, out);
}

/// Writes records one after another, keeping what the next one likely
/// repeats: the text of the time stamp's second, and the agent's, the
/// session's, the method's and the tool's escaped text with their keys (the
/// same for every request of a session, and an agent's requests are mostly
/// `tools/call`s of a few tools).
#[derive(Debug, Default)]
pub struct Writer {
    stamps: Stamps,
    agent: Repeated,
    session: Repeated,
    method: Repeated,
    tool: Repeated,
}

/// A value written last, and how it was written.
#[derive(Debug, Default)]
struct Repeated {
    value: Vec<u8>,
    written: Vec<u8>,
}

impl Repeated {
    /// Appends `value` as `write` writes it, copied when it is the value
    /// written last time.
    fn write(&mut self, value: &[u8], out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
        if self.written.is_empty() || self.value != value {
            self.value.clear();
            self.value.extend_from_slice(value);
            self.written.clear();
            write(&mut self.written);
        }
        out.extend_from_slice(&self.written);
    }
}

impl Writer {
    /// Appends `record` as one line: `ts` (since the epoch), `event`,
    /// `agent` (the name in force), then the event's keys.
    pub fn write(&mut self, ts: Duration, agent: &str, record: &Record, out: &mut Vec<u8>) {
        // A request record is about 300 bytes: one reservation, not several.
        out.reserve(384);
        out.extend_from_slice(b"{\"ts\":\"");
        self.stamps.write(ts, out);
        out.push(b'"');
        let event = match record {
            Record::Request(_) => kw!("event", "request"),
            Record::SessionCreated { .. } => kw!("event", "session.created"),
            Record::SessionReinitialised { .. } => kw!("event", "session.reinitialised"),
            Record::SessionDeleted { .. } => kw!("event", "session.deleted"),
            Record::IdentityChanged { .. } => kw!("event", "identity.changed"),
            Record::CredentialRenewed { .. } => kw!("event", "credential.renewed"),
            Record::CredentialFailed { .. } => kw!("event", "credential.failed"),
        };
        out.extend_from_slice(event.as_bytes());
        self.agent.write(agent.as_bytes(), out, |w| string(w, k!("agent"), agent));
        match record {
            Record::Request(r) => self.write_request(r, out),
            Record::SessionCreated { session } | Record::SessionDeleted { session } => {
                bytes(out, k!("mcp.session.id"), session);
            }
            Record::SessionReinitialised { session, ok } => {
                bytes(out, k!("mcp.session.id"), session);
                string(out, k!("result"), if *ok { "ok" } else { "failed" });
            }
            Record::IdentityChanged { previous } => string(out, k!("previous_agent"), previous),
            Record::CredentialRenewed { source, reason, expires_at } => {
                string(out, k!("source"), source);
                string(out, k!("reason"), reason);
                key(out, k!("expires_at"));
                match expires_at {
                    Some(at) => out.extend_from_slice(at.to_string().as_bytes()),
                    None => out.extend_from_slice(b"null"),
                }
            }
            Record::CredentialFailed { source, reason, why } => {
                string(out, k!("source"), source);
                string(out, k!("reason"), reason);
                string(out, k!("error"), why);
            }
        }
        out.extend_from_slice(b"}\n");
    }

    fn write_request(&mut self, r: &Request, out: &mut Vec<u8>) {
        if let Some(s) = &r.session {
            self.session.write(s, out, |w| bytes(w, k!("mcp.session.id"), s));
        }
        key(out, k!("jsonrpc.request.id"));
        // The id's own JSON text (a number or a string, as the strict scanner
        // read it: no raw line break can be in it).
        if r.id.is_empty() || r.id.len() > MAX_ID {
            out.extend_from_slice(b"null");
        } else {
            out.extend_from_slice(&r.id);
        }
        let method = &r.method;
        self.method.write(method.as_bytes(), out, |w| text(w, k!("mcp.method.name"), method, MAX_NAME));
        if let Some(t) = &r.tool {
            self.tool.write(t.as_bytes(), out, |w| text(w, k!("gen_ai.tool.name"), t, MAX_NAME));
        }
        status(out, r.status);
        out.extend_from_slice(outcome_field(r.outcome.unwrap_or(Outcome::Ok)).as_bytes());
        if let Some(e) = &r.error_type {
            string(out, k!("error.type"), e);
        }
        let by = if r.by_proxy { kw!("answered_by", "proxy") } else { kw!("answered_by", "upstream") };
        out.extend_from_slice(by.as_bytes());
        if let Some(why) = r.reason {
            word(out, k!("reason"), why);
        }
        number(out, k!("duration_ms"), r.duration_ms);
        number(out, k!("bytes_in"), r.bytes_in);
        number(out, k!("bytes_out"), r.bytes_out);
        if let Some(c) = &r.claimed {
            string(out, k!("claimed"), cut(c, MAX_CLAIMED));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn line(record: &Record) -> (String, Value) {
        let mut out = Vec::new();
        write_record(Duration::from_millis(1_796_168_405_123), "alice \"the\" agent", record, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1, "{text:?}");
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (text, v)
    }

    #[test]
    fn a_request_record_has_its_keys_in_order() {
        let r = Request {
            session: Some(SessionText::from_slice(b"abc")),
            id: b"\"x\\\"1\"".as_slice().into(),
            method: "tools/call".into(),
            tool: Some("chat_send".into()),
            status: 200,
            outcome: Some(Outcome::ToolError),
            error_type: None,
            by_proxy: false,
            reason: None,
            duration_ms: 12,
            bytes_in: 100,
            bytes_out: 2000,
            claimed: Some("bob\u{e9}".repeat(20).into()),
        };
        let (text, v) = line(&Record::Request(r));
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let _ = keys; // serde_json sorts keys: the order is checked on the text.
        let order = [
            "ts",
            "event",
            "agent",
            "mcp.session.id",
            "jsonrpc.request.id",
            "mcp.method.name",
            "gen_ai.tool.name",
            "http.response.status_code",
            "outcome",
            "answered_by",
            "duration_ms",
            "bytes_in",
            "bytes_out",
            "claimed",
        ];
        let at: Vec<usize> = order.iter().map(|k| text.find(&format!("\"{k}\":")).unwrap()).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert_eq!(v["ts"], "2026-12-01T23:40:05.123Z");
        assert_eq!(v["agent"], "alice \"the\" agent");
        assert_eq!(v["jsonrpc.request.id"], "x\"1");
        assert_eq!(v["outcome"], "tool_error");
        let claimed = v["claimed"].as_str().unwrap();
        assert!(claimed.len() <= MAX_CLAIMED && "bob\u{e9}".repeat(20).starts_with(claimed), "{claimed}");
        assert_eq!(claimed.len(), 63, "cut at the character boundary before byte 64");
    }

    #[test]
    fn a_proxy_answer_and_the_session_events() {
        let r = Request {
            id: b"7".as_slice().into(),
            method: "tools/call".into(),
            status: 200,
            outcome: Some(Outcome::Refused),
            error_type: Some("-32602".into()),
            by_proxy: true,
            reason: Some("hidden_tool"),
            ..Request::default()
        };
        let (_, v) = line(&Record::Request(r));
        assert_eq!((v["answered_by"].as_str(), v["reason"].as_str()), (Some("proxy"), Some("hidden_tool")));
        assert_eq!(v["jsonrpc.request.id"], 7);
        assert!(v.get("mcp.session.id").is_none() && v.get("claimed").is_none());
        let long_id = Request { id: vec![b'1'; MAX_ID + 1].into(), ..Request::default() };
        assert_eq!(line(&Record::Request(long_id)).1["jsonrpc.request.id"], Value::Null);
        let (_, v) = line(&Record::SessionReinitialised { session: b"s\xff".as_slice().into(), ok: false });
        assert_eq!(
            (v["event"].as_str(), v["result"].as_str()),
            (Some("session.reinitialised"), Some("failed"))
        );
        let (_, v) = line(&Record::IdentityChanged { previous: "old".into() });
        assert_eq!(v["previous_agent"], "old");
    }

    #[test]
    fn a_writer_kept_from_record_to_record_writes_what_a_new_one_writes() {
        let request = |session: Option<&[u8]>, outcome| {
            Record::Request(Request {
                session: session.map(SessionText::from_slice),
                id: b"1".as_slice().into(),
                method: "tools/call".into(),
                outcome: Some(outcome),
                ..Request::default()
            })
        };
        let records = [
            (0, "alice", request(Some(b"s1"), Outcome::Ok)),
            (999, "alice", request(Some(b"s1"), Outcome::ToolError)),
            (1_000, "alice", request(Some(b"s\"2\xff"), Outcome::Error)),
            (1_000, "bob\n", request(None, Outcome::Refused)),
            (5, "bob\n", request(Some(b"s1"), Outcome::Cut)),
            (5, "bob\n", Record::SessionDeleted { session: b"s1".as_slice().into() }),
            (86_400_000, "", request(Some(b""), Outcome::Ok)),
            (86_400_000, "", request(Some(b"s1"), Outcome::Ok)),
        ];
        let named = |method: &str, tool: Option<&str>, status| {
            Record::Request(Request {
                method: method.into(),
                tool: tool.map(Into::into),
                status,
                ..Request::default()
            })
        };
        let records = records.into_iter().chain([
            (1, "a", named("tools/call", Some("chat_send"), 200)),
            (1, "a", named("tools/call", Some("chat_read"), 0)),
            (1, "a", named("tools/list", None, 99)),
            (1, "a", named("tools/call", Some("chat_read"), 100)),
            (1, "a", named("tools/call", Some("chat\"send"), 999)),
            (1, "a", named("tools/call\n", Some("chat_send"), 1000)),
            (1, "a", named("tools/call\n", Some("chat_send"), u16::MAX)),
        ]);
        let mut kept = Writer::default();
        for (ms, agent, record) in records {
            let ts = Duration::from_millis(1_796_168_405_000 + ms);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            kept.write(ts, agent, &record, &mut a);
            Writer::default().write(ts, agent, &record, &mut b);
            assert_eq!(String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
            let v: Value = serde_json::from_slice(&a).unwrap();
            assert_eq!(v["agent"], agent);
            if let Record::Request(r) = &record {
                assert_eq!(v["http.response.status_code"], r.status);
                assert_eq!(v["mcp.method.name"], *r.method);
            }
        }
    }

    #[test]
    fn each_outcome_is_written_as_its_name() {
        for (i, o) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(o.index(), i);
        }
        for o in Outcome::ALL {
            assert_eq!(outcome_field(o), format!(",\"outcome\":\"{}\"", o.as_str()));
        }
    }

    #[test]
    fn long_names_are_cut_at_a_character_boundary_and_escapes_kept() {
        // Every place of a two-byte character around the cut.
        for pad in 0..3 {
            let name = format!("{}{}", "t".repeat(MAX_NAME - 2 + pad), "\u{e9}".repeat(4));
            let method = format!("m\"{}", "\n".repeat(MAX_NAME));
            let r = Request {
                method: method.as_str().into(),
                tool: Some(name.as_str().into()),
                ..Request::default()
            };
            let (_, v) = line(&Record::Request(r));
            let tool = v["gen_ai.tool.name"].as_str().unwrap();
            assert!(tool.len() <= MAX_NAME && name.starts_with(tool), "{tool}");
            assert!(tool.len() >= MAX_NAME - 1, "{pad}: {}", tool.len());
            let m = v["mcp.method.name"].as_str().unwrap();
            assert_eq!(m, &method[..MAX_NAME], "the escapes written, the cut made on the text");
        }
    }
}

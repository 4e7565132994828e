//! What the audit reads of one exchange, without a socket: each JSON-RPC
//! request of its body (read once when the body is whole, from the stamp
//! scan's envelope), its answer's outcome (read as the answer streams past,
//! by the same reader as an `initialize`'s version), and the records they
//! make. `mod.rs` is where the connection feeds it.

use super::End;
use crate::conn::answer::Answer;
use crate::mcp::initialize::Format;
use crate::mcp::json::{Kind, Value};
use crate::mcp::rpc::{self, Role};
use crate::mcp::version_scan::{Answered, VersionScan};
use crate::obs::audit::{cut, IdText, Outcome, Record, Request, SessionText, Text, MAX_CLAIMED, MAX_NAME};
use log::warn;
use smallvec::SmallVec;
use std::borrow::Cow;

/// Most requests of one batch given a record each (a batch may be large;
/// the rest are counted in the log line).
const MAX_AUDITED: usize = 64;

/// One request of the body.
#[derive(Debug)]
pub(super) struct Audited {
    pub(super) id: IdText,
    pub(super) method: Text,
    pub(super) tool: Option<Text>,
    pub(super) claimed: Option<Box<str>>,
    /// Answered by the proxy in the upstream's place (a hidden tool).
    pub(super) hidden: bool,
    /// Its place among the ids the answer scan waits for.
    pub(super) slot: Option<usize>,
}

/// The requests of the exchange's body.
#[derive(Debug, Default)]
pub(in crate::conn) struct ExchangeAudit {
    pub(super) requests: SmallVec<[Audited; 1]>,
    /// The body is a batch (else its answer is its one request's).
    pub(super) batch: bool,
    /// One reader of the answer for every request (one pass).
    pub(super) scan: Option<VersionScan>,
    pub(super) bytes_in: u64,
    /// The status of the head relayed to the client: a client that leaves
    /// after it does not change what it was answered (the log's 499 is no
    /// response).
    pub(super) relayed: Option<u16>,
}

/// What the audit reads of one message of the body.
struct Seen<'b> {
    /// Has `method` and `id` (`rpc::Role::Request`).
    request: bool,
    is_call: bool,
    /// The decoded method (`rpc::Message::method`).
    method: Option<Cow<'b, str>>,
    /// The id's JSON text as an answer may echo it (`rpc::Id::json`).
    id: &'b [u8],
}

impl<'b> Seen<'b> {
    fn of_message(m: &rpc::Message<'b>) -> Seen<'b> {
        let is_call = m.is_method(rpc::TOOLS_CALL);
        // A `tools/call`'s decoded method is that name: not decoded again.
        let method = if is_call { Some(Cow::Borrowed(rpc::TOOLS_CALL)) } else { m.method() };
        Seen { request: m.role() == Role::Request, is_call, method, id: m.id().json() }
    }

    /// A message of the stamp scan's envelope, read as `of_message` reads
    /// `rpc::Message::of_object`, without its work where the answer is
    /// plain: an id that is a string without escapes or a number of at most
    /// 15 digits is echoed as sent (any other goes by `rpc`'s rule).
    fn of_envelope(body: &'b [u8], method: Option<Value>, id: Option<Value>) -> Seen<'b> {
        let (Some(m), Some(v)) = (method, id) else {
            return Seen::of_message(&rpc::Message::of_object(body, method, id));
        };
        let is_call = m.is_str(body, rpc::TOOLS_CALL);
        let raw = v.bytes(body);
        let id = match v.kind {
            Kind::String { escaped: false } => raw,
            Kind::Number if small_integer(raw) => raw,
            _ => rpc::Message::of_object(body, None, Some(v)).id().json(),
        };
        let method = if is_call { Some(Cow::Borrowed(rpc::TOOLS_CALL)) } else { m.decode_cow(body) };
        Seen { request: true, is_call, method, id }
    }
}

/// `-?[0-9]{1,15}`: an integer well inside a double's range.
fn small_integer(text: &[u8]) -> bool {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    (1..=15).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit)
}

impl ExchangeAudit {
    /// `read_into` a new `ExchangeAudit`.
    #[cfg(test)]
    fn read(
        body: &[u8],
        plan: &crate::mcp::stamp::Plan,
        agent: &str,
        policy: &crate::mcp::tools::Policy,
        bytes_in: u64,
    ) -> ExchangeAudit {
        let mut a = ExchangeAudit::default();
        a.read_into(body, plan, agent, policy, bytes_in);
        a
    }

    /// Forgets the last exchange, then reads the requests of `body`
    /// (nothing for notifications and responses), with each `tools/call`'s
    /// tool, and the identity it claimed when that is not `agent` (`plan`
    /// has the spans the stamp scan found).
    pub(in crate::conn) fn read_into(
        &mut self,
        body: &[u8],
        plan: &crate::mcp::stamp::Plan,
        agent: &str,
        policy: &crate::mcp::tools::Policy,
        bytes_in: u64,
    ) {
        self.requests.clear();
        self.batch = false;
        self.scan = None;
        self.bytes_in = bytes_in;
        self.relayed = None;
        let mut call = 0;
        let mut skipped = 0;
        let mut note = |requests: &mut SmallVec<[Audited; 1]>, m: Seen| {
            let is_call = m.is_call;
            let index = call;
            call += usize::from(is_call);
            if !m.request {
                return;
            }
            if requests.len() >= MAX_AUDITED {
                skipped += 1;
                return;
            }
            let method = m.method.map(|s| cut(&s, MAX_NAME).into()).unwrap_or_default();
            let name = is_call.then(|| plan.called_tools().get(index).copied().flatten()).flatten();
            let tool = name.and_then(|n| n.decode_cow(body)).map(|t| cut(&t, MAX_NAME).into());
            let claimed = plan.claim(index).filter(|_| is_call).and_then(|v| {
                let text =
                    v.decode_str(body).unwrap_or_else(|| String::from_utf8_lossy(v.bytes(body)).into_owned());
                (text != agent).then(|| cut(&text, MAX_CLAIMED).into())
            });
            let hidden = is_call && !policy.allows_call(body, name.as_ref());
            requests.push(Audited {
                id: IdText::from_slice(m.id),
                method,
                tool,
                claimed,
                hidden,
                slot: None,
            });
        };
        // The stamp scan's envelope when it read the body (every accepted
        // POST): the body is not parsed again. A refused body is parsed
        // here (it may still be JSON-RPC with a duplicate key).
        if let Some(envelope) = plan.envelope() {
            self.batch = plan.is_batch();
            for e in envelope {
                let seen = match e.object {
                    true => Seen::of_envelope(body, e.method, e.id),
                    false => Seen::of_message(&e.message(body)),
                };
                note(&mut self.requests, seen);
            }
        } else if let Ok(parsed) = rpc::parse(body) {
            self.batch = parsed.is_batch();
            for m in parsed.messages() {
                note(&mut self.requests, Seen::of_message(m));
            }
        } else if crate::mcp::json::first_byte(body).is_some() {
            // Not JSON (refused): one record with a null id.
            let none = Audited {
                id: IdText::from_slice(b"null"),
                method: "".into(),
                tool: None,
                claimed: None,
                hidden: false,
                slot: None,
            };
            self.requests.push(none);
        } // else no body (a GET, a DELETE): no request
        if skipped > 0 {
            warn!("audit: a batch of more than {MAX_AUDITED} requests: {skipped} of them get no record");
        }
    }

    /// The answer is `format`: read each request's outcome from it.
    pub(in crate::conn) fn answer_format(&mut self, format: Format) {
        let mut ids: SmallVec<[&[u8]; 1]> = SmallVec::new();
        for r in self.requests.iter_mut().filter(|r| !r.hidden) {
            // Only a string or number id is answered (not null).
            if matches!(r.id.first(), Some(b'"' | b'-' | b'0'..=b'9')) {
                r.slot = Some(ids.len());
                ids.push(&r.id);
            }
        }
        self.scan = VersionScan::for_ids(format, &ids, !self.batch);
    }

    /// The head the client is sent has `status`.
    pub(in crate::conn) fn relayed(&mut self, status: u16) {
        self.relayed = Some(status);
    }

    /// Payload bytes of the answer.
    pub(in crate::conn) fn feed(&mut self, data: &[u8]) {
        if let Some(s) = self.scan.as_mut() {
            s.feed(data);
        }
    }

    pub(super) fn records(
        &mut self,
        session: &[u8],
        status: u16,
        ms: u64,
        bytes_out: u64,
        end: End,
        out: &mut Vec<Record>,
    ) {
        let status = self.relayed.unwrap_or(status);
        for r in self.requests.drain(..) {
            let mut rec = Request {
                session: (!session.is_empty()).then(|| SessionText::from_slice(session)),
                id: r.id,
                method: r.method,
                tool: r.tool,
                status,
                duration_ms: ms,
                bytes_in: self.bytes_in,
                bytes_out,
                claimed: r.claimed,
                ..Request::default()
            };
            let answered = r.slot.and_then(|i| self.scan.as_ref()?.outcome_of(i));
            let (outcome, error_type, reason) = match (end, r.hidden) {
                (End::Proxy(a), _) => proxy_outcome(a),
                // The rest of a batch went on; this call the proxy answered.
                (_, true) => (Outcome::Refused, Some(rpc::INVALID_PARAMS.to_string()), Some("hidden_tool")),
                (End::Cut, false) if answered.is_none() => (Outcome::Cut, None, None),
                (_, false) => match answered {
                    Some(Answered::Ok) => (Outcome::Ok, None, None),
                    Some(Answered::ToolError) => (Outcome::ToolError, None, None),
                    Some(Answered::Error(code)) => {
                        (Outcome::Error, Some(code.map_or("error".to_string(), |c| c.to_string())), None)
                    }
                    // A legacy SSE POST: its answer travels on the stream.
                    None if status == 202 => (Outcome::Ok, None, None),
                    None if status >= 400 => (Outcome::Error, Some(status.to_string()), None),
                    None => (Outcome::Error, Some("no_answer".to_string()), None),
                },
            };
            rec.by_proxy = matches!(end, End::Proxy(_)) || r.hidden;
            rec.outcome = Some(outcome);
            rec.error_type = error_type.map(Into::into);
            rec.reason = reason;
            out.push(Record::Request(rec));
        }
    }
}

/// A proxy answer's outcome, `error.type` and reason.
fn proxy_outcome(a: Answer) -> (Outcome, Option<String>, Option<&'static str>) {
    let code = Some(a.jsonrpc_code().to_string());
    match a {
        Answer::HiddenTool | Answer::HiddenToolLegacy => (Outcome::Refused, code, Some("hidden_tool")),
        Answer::UpstreamUnavailable | Answer::UpstreamUnreachable | Answer::ConnectTimeout => {
            (Outcome::Error, Some("upstream_unavailable".into()), Some("upstream_unavailable"))
        }
        Answer::UpstreamTls => (Outcome::Error, Some("tls".into()), Some("upstream_unavailable")),
        Answer::UpstreamProxy => (Outcome::Error, Some("proxy".into()), Some("upstream_unavailable")),
        Answer::UpstreamTimeout => (Outcome::Error, Some("timeout".into()), Some("timeout")),
        Answer::BadUpstream | Answer::UpstreamClosed => {
            (Outcome::Error, Some("bad_upstream".into()), Some("bad_upstream"))
        }
        _ => (Outcome::Refused, code, Some("refused_body")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::stamp::{plan, StampMap};
    use crate::mcp::tools::{Policy, ToolFlags};

    fn read(body: &str) -> ExchangeAudit {
        let map = StampMap::agentchattr();
        let p = plan(body.as_bytes(), "alice", &map).unwrap_or_default();
        let policy = Policy::from_flags(&ToolFlags {
            allow: None,
            deny: vec!["chat_rules".into()],
            show_identity_params: false,
            identity_params: vec![],
        });
        ExchangeAudit::read(body.as_bytes(), &p, "alice", &policy, 10)
    }

    #[test]
    fn requests_tools_claims_and_hidden_calls_are_read_from_the_body() {
        let a = read(
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"bob","message":"x"}}},
               {"jsonrpc":"2.0","method":"notifications/initialized"},
               {"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"alice"}}},
               {"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"chat_rules","arguments":{}}},
               {"jsonrpc":"2.0","id":4,"method":"tools/list"}]"#,
        );
        let got: Vec<(&[u8], &str, Option<&str>, Option<&str>, bool)> = a
            .requests
            .iter()
            .map(|r| (&*r.id, &*r.method, r.tool.as_deref(), r.claimed.as_deref(), r.hidden))
            .collect();
        assert_eq!(
            got,
            [
                (&b"1"[..], "tools/call", Some("chat_send"), Some("bob"), false),
                (&b"\"b\""[..], "tools/call", Some("chat_send"), None, false),
                (&b"3"[..], "tools/call", Some("chat_rules"), None, true),
                (&b"4"[..], "tools/list", None, None, false),
            ],
            "the notification has no record; the agent's own name is no claim"
        );
    }

    #[test]
    fn no_body_is_no_request_and_a_body_that_is_not_json_is_one() {
        assert!(read("").requests.is_empty());
        assert!(read(" \r\n").requests.is_empty());
        let a = read("{not json");
        assert_eq!((a.requests.len(), &*a.requests[0].id), (1, &b"null"[..]));
    }

    #[test]
    fn the_stamp_scans_envelope_reads_as_a_second_parse_would() {
        let bodies = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"bob"}}}"#,
            r#"{"id":1,"id":"two","method":"tools\u002flist"}"#,
            r#"[{"id":NaN,"method":"a"},{"id":1e400,"method":"b"},{"id":"\ud800","method":"c"},{"id":null,"method":"d"}]"#,
            r#"[1,{"method":"n"},{"id":3,"result":{}},[],{"id":{},"method":"x"},{"method":5,"id":6}]"#,
            r#" [ ] "#,
            r#"[{"id":-0,"method":"a"},{"id":123456789012345,"method":"c"},{"id":-123456789012345,"method":"d"},{"id":1234567890123456,"method":"e"},{"id":1.5,"method":"f"},{"id":-1e400,"method":"g"},{"id":Infinity,"method":"h"},{"id":-Infinity,"method":"i"},{"id":"","method":"j"},{"id":"a\"b","method":"k"},{"id":true,"method":"l"},{"id":[1],"method":"m"}]"#,
            r#"[{"id":1,"method":"tools\u002fcall","params":{"name":"chat_send"}},{"id":2,"method":"tools/call","params":{"name":"chat_send"}},{"id":3,"method":"tools/cal"},{"id":4,"method":1}]"#,
            r#"{"jsonrpc":"2.0","id":"\"q\"","method":"tools/call","params":{"name":"chat_rules"}}"#,
        ];
        let key = |a: &ExchangeAudit| -> Vec<(Vec<u8>, String, Option<String>, bool)> {
            a.requests
                .iter()
                .map(|r| {
                    (r.id.to_vec(), r.method.to_string(), r.tool.as_deref().map(str::to_string), r.hidden)
                })
                .collect()
        };
        for body in bodies {
            let p = plan(body.as_bytes(), "alice", &StampMap::agentchattr()).unwrap();
            assert!(p.envelope().is_some(), "{body}");
            let policy = Policy::from_flags(&ToolFlags {
                allow: None,
                deny: vec!["chat_rules".into()],
                show_identity_params: false,
                identity_params: vec![],
            });
            let from_envelope = ExchangeAudit::read(body.as_bytes(), &p, "alice", &policy, 10);
            // The same plan with no envelope: the body is parsed again.
            let mut bare = p.clone();
            bare.forget_envelope();
            let parsed = ExchangeAudit::read(body.as_bytes(), &bare, "alice", &policy, 10);
            assert_eq!(key(&from_envelope), key(&parsed), "{body}");
            assert_eq!(from_envelope.batch, parsed.batch, "{body}");
        }
    }

    fn outcomes(a: &mut ExchangeAudit) -> Vec<Option<Outcome>> {
        let mut out = Vec::new();
        a.records(b"", 200, 5, 99, End::Relayed, &mut out);
        out.iter()
            .map(|r| match r {
                Record::Request(r) => r.outcome,
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_request_whose_id_is_too_long_to_keep_still_gets_its_answers_outcome() {
        let id = format!("\"{}\"", "i".repeat(2000));
        let request =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"x"}}}}"#);
        let answer = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"isError":true}}}}"#);
        for format in [Format::Json, Format::EventStream] {
            let body = match format {
                Format::Json => answer.clone(),
                Format::EventStream => format!("event: message\ndata: {answer}\n\n"),
            };
            // Alone, and in a batch (where the id must be matched).
            for batched in [false, true] {
                let req = if batched { format!("[{request}]") } else { request.clone() };
                let body = if batched && format == Format::Json { format!("[{body}]") } else { body.clone() };
                let mut a = read(&req);
                a.answer_format(format);
                for piece in body.as_bytes().chunks(100) {
                    a.feed(piece);
                }
                assert_eq!(outcomes(&mut a), [Some(Outcome::ToolError)], "{format:?} batched {batched}");
            }
        }
        // A long id the answer does not carry is no answer in a batch.
        let mut a = read(&format!("[{request}]"));
        a.answer_format(Format::Json);
        a.feed(format!(r#"[{{"jsonrpc":"2.0","id":"{}","result":{{}}}}]"#, "j".repeat(2000)).as_bytes());
        assert_eq!(outcomes(&mut a), [Some(Outcome::Error)]);
    }

    #[test]
    fn a_batchs_answers_are_read_in_one_pass_each_to_its_request() {
        let n = 64;
        let requests: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"x"}}}}"#))
            .collect();
        // Answered in reverse order, every third a tool error, every fifth an
        // error, the ids spelled as strings half the time.
        let answer = |i: usize| {
            let id = if i % 2 == 0 { format!("{i}") } else { format!("\"{i}\"") };
            match (i % 5, i % 3) {
                (0, _) => format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-{i},"message":"m"}}}}"#),
                (_, 0) => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"isError":true}}}}"#),
                _ => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#),
            }
        };
        let want: Vec<Option<Outcome>> = (0..n)
            .map(|i| match (i % 5, i % 3) {
                (0, _) => Some(Outcome::Error),
                (_, 0) => Some(Outcome::ToolError),
                _ => Some(Outcome::Ok),
            })
            .collect();
        let json = format!("[{}]", (0..n).rev().map(answer).collect::<Vec<_>>().join(","));
        let sse: String = (0..n).rev().map(|i| format!("data: {}\r\n\r\n", answer(i))).collect();
        for (format, body) in [(Format::Json, json), (Format::EventStream, sse)] {
            let mut a = read(&format!("[{}]", requests.join(",")));
            a.answer_format(format);
            a.feed(body.as_bytes());
            assert_eq!(outcomes(&mut a), want, "{format:?}");
        }
    }

    #[test]
    fn outcomes_come_from_the_answer_or_the_ending() {
        let mut a = read(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}"#);
        a.answer_format(Format::EventStream);
        a.feed(
            b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"isError\":true}}\r\n\r\n",
        );
        let mut out = Vec::new();
        a.records(b"s1", 200, 5, 99, End::Relayed, &mut out);
        let Record::Request(r) = &out[0] else { panic!("{out:?}") };
        assert_eq!(
            (r.outcome, r.by_proxy, r.session.as_deref()),
            (Some(Outcome::ToolError), false, Some(&b"s1"[..]))
        );
        let mut a = read(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}"#);
        a.answer_format(Format::Json);
        a.feed(br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"m"}}"#);
        let mut out = Vec::new();
        a.records(b"", 200, 5, 99, End::Relayed, &mut out);
        let Record::Request(r) = &out[0] else { panic!() };
        assert_eq!(
            (r.outcome, r.error_type.as_deref(), r.session.is_none()),
            (Some(Outcome::Error), Some("-32601"), true)
        );
        let mut a = read(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}"#);
        a.answer_format(Format::Json);
        a.feed(br#"{"jsonrpc":"2.0","id":7,"res"#);
        let mut out = Vec::new();
        a.records(b"", 200, 5, 99, End::Cut, &mut out);
        let Record::Request(r) = &out[0] else { panic!() };
        assert_eq!(r.outcome, Some(Outcome::Cut));
        let mut a = read(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}"#);
        let mut out = Vec::new();
        a.records(b"", 504, 5, 99, End::Proxy(Answer::UpstreamTimeout), &mut out);
        let Record::Request(r) = &out[0] else { panic!() };
        assert_eq!((r.outcome, r.by_proxy, r.reason), (Some(Outcome::Error), true, Some("timeout")));
    }
}

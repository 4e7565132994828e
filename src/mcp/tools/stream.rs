//! A `tools/list` answer rewritten as it streams past the relay: the answer
//! (the response whose id is the request's) is held whole, up to
//! `MAX_LIST_ANSWER`, rewritten by `rewrite_list` and sent on; everything
//! else passes unchanged and in order. As JSON (`application/json`, any
//! framing) the body is the answer. As an event stream (FastMCP answers a
//! POST that way) the answer is one `message` event among others: events
//! before it (progress, log notifications) pass as they complete, the
//! answering event's `data` is replaced by the rewritten message, and the
//! rest passes as it comes.
//!
//! Fail closed: an answer that cannot be rewritten safely (over the bound,
//! not JSON, no `result.tools` array) is replaced by a JSON-RPC error with
//! the request's id when the policy hides something; when it hides nothing
//! (the list is only read to learn stamps) it passes unchanged. Pure: bytes
//! in, bytes out.

use super::list::{rewrite_list, Learned, ListError, ListOptions};
use super::policy::Policy;
use crate::mcp::initialize::{for_each_message_event, Format};
use crate::mcp::json;
use crate::mcp::rpc;
use crate::mcp::sse::{self, Framer, NoEvents, Stop, UTF8_BOM};
use crate::mcp::stamp::StampMap;
use std::fmt;

/// Largest `tools/list` answer held to be rewritten. agentchattr's is about
/// 10 KB; a thousand tools with rich schemas stay under 4 MiB, which is
/// also FastMCP's own request-body limit. Past it the answer is refused.
pub const MAX_LIST_ANSWER: usize = 4 * 1024 * 1024;

/// Why an answer was not rewritten (for the warn line; no content of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotRewritten {
    TooLarge,
    Invalid(ListError),
    /// The body ended before an answer to the request's id.
    NoAnswer,
}

impl fmt::Display for NotRewritten {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotRewritten::TooLarge => write!(f, "the answer is over {MAX_LIST_ANSWER} bytes"),
            NotRewritten::Invalid(e) => write!(f, "{e}"),
            NotRewritten::NoAnswer => f.write_str("the body ended before the answer"),
        }
    }
}

/// What a finished filter reports.
#[derive(Debug, Default)]
pub struct ListReport {
    /// Stamps the list taught.
    pub learned: Vec<Learned>,
    /// Tools and identity parameters removed.
    pub hidden_tools: usize,
    pub hidden_params: usize,
    /// Why the answer passed unchanged or was replaced by an error.
    pub failed: Option<NotRewritten>,
    /// The answer was replaced by an error.
    pub refused: bool,
}

/// An id whose answer is the list (several in a batch).
#[derive(Debug)]
struct Wanted {
    raw: Box<[u8]>,
    /// `raw` as clients match it (`rpc::IdKey`; `None`: nothing answers it).
    key: Option<rpc::IdKey>,
    answered: bool,
    /// Answered with an error for an event too large to read, which may or
    /// may not have been its answer: a later answer to it is still filtered
    /// (never let through), so the filter is not done.
    unseen: bool,
}

/// The filter of one `tools/list` answer (or of a batch's answers).
#[derive(Debug)]
pub struct ListFilter {
    format: Format,
    ids: smallvec::SmallVec<[Wanted; 1]>,
    policy: Policy,
    map: StampMap,
    options: ListOptions,
    /// The body answers one request, the list, and nothing else (a POST
    /// that is not a batch): every response message in it is taken as the
    /// list's answer whatever its id says, and the filter stays on to the
    /// end of the body.
    sole: bool,
    /// The policy hides something: an answer that cannot be rewritten is
    /// refused, not passed.
    enforce: bool,
    /// Bytes held: the JSON body, or the SSE event being read.
    held: Vec<u8>,
    /// The held bytes went past the bound; the rest of the event (SSE) or
    /// body (JSON) is dropped.
    over: bool,
    /// The answer has been dealt with: what follows passes as it is.
    done: bool,
    /// The stream's events, as they end (each byte is read once).
    framer: Framer,
    /// The held event ended on a CR that ended the read: an LF may follow.
    cr_pending: bool,
    outcome: ListReport,
}

impl ListFilter {
    /// A filter for the answer to the request whose id is `request_id`
    /// (JSON text), answered as `format` on a stream that carries other
    /// answers too (a legacy SSE session's); `enforce` when the policy hides
    /// tools or parameters (see `Policy::list_handling`).
    pub fn new(
        format: Format,
        request_id: &[u8],
        policy: &Policy,
        map: &StampMap,
        options: ListOptions,
        enforce: bool,
    ) -> ListFilter {
        ListFilter::for_ids(format, &[request_id], policy, map, options, enforce)
    }

    /// The filter is for the answer to a POST whose one request is the
    /// list: every response in that answer is the list's, whatever its id
    /// (see `sole`).
    pub fn answering_alone(mut self) -> ListFilter {
        self.sole = true;
        self
    }

    /// A filter for the answers to the `tools/list` requests of a batch
    /// whose ids are `ids`: each answer is rewritten where it comes (an
    /// element of the JSON array, or its own event).
    pub fn for_ids(
        format: Format,
        ids: &[&[u8]],
        policy: &Policy,
        map: &StampMap,
        options: ListOptions,
        enforce: bool,
    ) -> ListFilter {
        let ids = ids
            .iter()
            .map(|id| Wanted { raw: (*id).into(), key: rpc::IdKey::of(id), answered: false, unseen: false })
            .collect();
        ListFilter {
            format,
            ids,
            policy: policy.clone(),
            map: map.clone(),
            options,
            sole: false,
            enforce,
            held: Vec::new(),
            over: false,
            done: false,
            framer: Framer::default(),
            cr_pending: false,
            outcome: ListReport::default(),
        }
    }

    /// Nothing more to rewrite: later payload passes as it is.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// What the filter did, once finished.
    pub fn take_outcome(&mut self) -> ListReport {
        std::mem::take(&mut self.outcome)
    }

    /// Payload bytes in; what to send goes to `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.done {
            out.extend_from_slice(data);
            return;
        }
        match self.format {
            Format::Json => self.hold(data),
            Format::EventStream => {
                let mut rest = data;
                if self.cr_pending && !rest.is_empty() {
                    // The event ended on a CR: an LF now is the second half
                    // of that line end, and goes with the event.
                    self.cr_pending = false;
                    if let Some(lf) = rest.get(..1).filter(|b| *b == b"\n") {
                        self.framer.feed(lf, &mut NoEvents);
                        self.hold(lf);
                        rest = rest.get(1..).unwrap_or_default();
                    }
                    self.end_event(out);
                }
                while !rest.is_empty() && !self.done {
                    let (n, dispatched) = self.framer.feed(rest, &mut NoEvents);
                    let piece = rest.get(..n).unwrap_or_default();
                    self.hold(piece);
                    rest = rest.get(n..).unwrap_or_default();
                    if dispatched {
                        // A blank line ended by a CR: an LF after it is the
                        // second half of that line end, and goes with the
                        // event (it may come in the next read).
                        if piece.last() == Some(&b'\r') {
                            if rest.is_empty() {
                                self.cr_pending = true;
                                continue;
                            }
                            if let Some(lf) = rest.get(..1).filter(|b| *b == b"\n") {
                                self.framer.feed(lf, &mut NoEvents);
                                self.hold(lf);
                                rest = rest.get(1..).unwrap_or_default();
                            }
                        }
                        self.end_event(out);
                    }
                }
                if self.done && !rest.is_empty() {
                    out.extend_from_slice(rest);
                }
            }
        }
    }

    /// The held event is whole: rewritten, passed, or (over the bound)
    /// refused.
    fn end_event(&mut self, out: &mut Vec<u8>) {
        if self.over {
            self.refuse_sse(NotRewritten::TooLarge, out);
        } else {
            let event = std::mem::take(&mut self.held);
            self.event(&event, out);
        }
    }

    /// The body ended.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        self.done = true;
        match self.format {
            Format::Json if self.over => self.fail_json(NotRewritten::TooLarge, out),
            Format::Json if json::is_array(&self.held) => {
                let body = std::mem::take(&mut self.held);
                match self.rewrite_batch(&body) {
                    Some(rewritten) => out.extend_from_slice(&rewritten),
                    None => {
                        self.held = body;
                        self.fail_json(NotRewritten::Invalid(ListError::NoResult), out);
                    }
                }
            }
            Format::Json => {
                let body = std::mem::take(&mut self.held);
                match rewrite_list(&body, &self.policy, &self.map, self.options) {
                    Ok(edit) => {
                        self.note(&edit);
                        out.extend(edit.parts(&body).flatten());
                    }
                    Err(e) => {
                        self.held = body;
                        self.fail_json(NotRewritten::Invalid(e), out);
                    }
                }
            }
            Format::EventStream => {
                if std::mem::take(&mut self.cr_pending) {
                    // The stream ended after an event's closing CR.
                    self.done = false;
                    self.end_event(out);
                    if self.done {
                        return;
                    }
                    self.done = true;
                }
                // No answer in the stream: what is held is a cut event,
                // which no client dispatches. While the policy hides
                // something the client gets the error with its id instead
                // (a list is never let through for want of a frame);
                // otherwise the bytes pass as they came.
                if self.over {
                    self.refuse_sse(NotRewritten::TooLarge, out);
                } else if self.enforce {
                    // Every list still owed gets its error.
                    while !self.ids.iter().all(|w| w.answered) {
                        self.refuse_sse(NotRewritten::NoAnswer, out);
                    }
                } else {
                    out.append(&mut self.held);
                    self.outcome.failed = Some(NotRewritten::NoAnswer);
                }
            }
        }
    }

    fn hold(&mut self, data: &[u8]) {
        if self.over {
            return;
        }
        let room = MAX_LIST_ANSWER.saturating_sub(self.held.len());
        if data.len() > room {
            self.held.extend_from_slice(data.get(..room).unwrap_or_default());
            self.over = true;
        } else {
            self.held.extend_from_slice(data);
        }
    }

    fn note(&mut self, edit: &super::list::ListEdit) {
        self.outcome.learned.extend(edit.learned().iter().cloned());
        self.outcome.hidden_tools += edit.hidden_tools;
        self.outcome.hidden_params += edit.hidden_params;
    }

    /// A JSON answer that cannot be rewritten: the error, or (nothing
    /// hidden) the answer as it came.
    fn fail_json(&mut self, why: NotRewritten, out: &mut Vec<u8>) {
        self.outcome.failed = Some(why);
        if self.enforce || why == NotRewritten::TooLarge {
            self.outcome.refused = true;
            out.extend_from_slice(&self.error_message(why));
        } else {
            out.append(&mut self.held);
        }
    }

    /// An SSE answer that cannot be sent: an error event in its place.
    fn refuse_sse(&mut self, why: NotRewritten, out: &mut Vec<u8>) {
        self.outcome.failed = Some(why);
        self.outcome.refused = true;
        self.held.clear();
        self.over = false;
        let message = self.error_message(why);
        if let Some(w) = self.ids.iter_mut().find(|w| !w.answered) {
            w.answered = true;
            w.unseen = why == NotRewritten::TooLarge;
        }
        self.done = self.settled();
        sse::write_message_event(&message, out);
    }

    /// Every list answered, none by a guess: later payload passes as it is
    /// (never in a `sole` answer, where any later response is read too).
    fn settled(&self) -> bool {
        !self.sole && self.ids.iter().all(|w| w.answered && !w.unseen)
    }

    /// The error for the first list still owed.
    fn error_message(&self, why: NotRewritten) -> Vec<u8> {
        let w = self.ids.iter().find(|w| !w.answered).or(self.ids.first());
        error_for(w.map_or(&b"null"[..], |w| &w.raw), why)
    }

    /// A JSON batch answer: each element answering a list is rewritten (or,
    /// when it cannot be and the policy hides something, replaced by its
    /// error); the rest passes. `None` when the body is not a JSON array.
    fn rewrite_batch(&mut self, body: &[u8]) -> Option<Vec<u8>> {
        let top = json::parse_value(body).ok().filter(|v| v.kind == json::Kind::Array)?;
        let mut elements = Vec::new();
        json::for_each_element(body, &top, |v| {
            elements.push(v);
            Ok::<(), json::ScanError>(())
        })
        .ok()?;
        let mut out = Vec::with_capacity(body.len());
        let mut from = 0;
        for v in elements {
            let element = v.bytes(body);
            let Some(answering) = self.answers(element) else { continue };
            let Some(replacement) = self.rewrite_answer(element, answering) else { continue };
            out.extend_from_slice(body.get(from..v.start).unwrap_or_default());
            out.extend_from_slice(&replacement);
            from = v.end;
        }
        out.extend_from_slice(body.get(from..).unwrap_or_default());
        Some(out)
    }
}

/// The error answering list request `id` that could not be filtered.
fn error_for(id: &[u8], why: NotRewritten) -> Vec<u8> {
    let mut m = Vec::new();
    let text = format!("the tool list could not be filtered for this agent: {why}");
    rpc::write_error_for(&mut m, id, rpc::INTERNAL_ERROR, &text);
    m
}

impl ListFilter {
    /// One complete SSE event: the answer is rewritten, anything else
    /// passes as it came.
    fn event(&mut self, event: &[u8], out: &mut Vec<u8>) {
        let mut data = None;
        for_each_message_event(event, |d| {
            data = Some(d.to_vec());
            false
        });
        let Some(data) = data else {
            out.extend_from_slice(event);
            return;
        };
        if json::is_array(&data) {
            // A batch's answers in one event.
            match self.rewrite_batch(&data) {
                Some(rewritten) if rewritten != data => write_event_like(event, &rewritten, out),
                _ => out.extend_from_slice(event),
            }
            self.done = self.settled();
            return;
        }
        let Some(answering) = self.answers(&data) else {
            out.extend_from_slice(event);
            return;
        };
        match self.rewrite_answer(&data, answering) {
            Some(message) => write_event_like(event, &message, out),
            None => out.extend_from_slice(event),
        }
        self.done = self.settled();
    }

    /// Whether `data` (one message) is a response that must be read as a
    /// list's answer: in a `sole` answer any response is; elsewhere one
    /// whose id is an owed list's by `rpc::IdKey` (the clients' rule, so no
    /// other spelling of the id gets past), or any other response, as a
    /// `Stray` that is rewritten if it holds a list.
    fn answers(&self, data: &[u8]) -> Option<Answering> {
        let body = rpc::parse(data).ok()?;
        let m = body.single().filter(|m| m.role() == rpc::Role::Response)?;
        let text = m.id().json();
        if self.sole {
            return Some(Answering::Owed(0));
        }
        let key = rpc::IdKey::of(text);
        let owed = self.ids.iter().position(|w| (!w.answered || w.unseen) && key.is_some() && w.key == key);
        Some(match owed {
            Some(at) => Answering::Owed(at),
            None => Answering::Stray(text.into()),
        })
    }

    /// The message to send in place of response `data`, or `None` to send
    /// it as it came: a list rewritten; one that cannot be, its error while
    /// the policy hides something. A stray response that holds no list
    /// (any other answer of a batch) passes.
    fn rewrite_answer(&mut self, data: &[u8], answering: Answering) -> Option<Vec<u8>> {
        let stray = matches!(answering, Answering::Stray(_));
        let id = match answering {
            Answering::Owed(at) => {
                let w = self.ids.get_mut(at)?;
                w.answered = true;
                w.unseen = false;
                w.raw.clone()
            }
            Answering::Stray(id) => id,
        };
        match rewrite_list(data, &self.policy, &self.map, self.options) {
            Ok(edit) if edit.is_unchanged() => {
                self.note(&edit);
                None
            }
            Ok(edit) => {
                self.note(&edit);
                Some(edit.apply(data))
            }
            Err(e) if stray && e.is_not_a_list() => None,
            Err(e) => {
                self.outcome.failed = Some(NotRewritten::Invalid(e));
                if !self.enforce {
                    return None;
                }
                self.outcome.refused = true;
                Some(error_for(&id, NotRewritten::Invalid(e)))
            }
        }
    }
}

/// What a response in the answer is to the filter.
#[derive(Debug)]
enum Answering {
    /// The answer to owed list `ids[i]`.
    Owed(usize),
    /// A response whose id is no owed list's (its id's JSON text): read in
    /// case it holds a list all the same.
    Stray(Box<[u8]>),
}

/// `event`'s lines with its `data` lines replaced by `message`'s (each of
/// its lines one `data:` line), the event read as `for_each_message_event`
/// read it; every line ends with CRLF.
fn write_event_like(event: &[u8], message: &[u8], out: &mut Vec<u8>) {
    let mut framer = Framer::default();
    let mut rest = event;
    let mut wrote = false;
    loop {
        let (n, stop) = framer.feed_line(rest, &mut NoEvents);
        let (line, tail) = rest.split_at(n.min(rest.len()));
        rest = tail;
        // The line's bytes after the LF of the CRLF before it, without the
        // byte that ended it.
        let content = line.strip_prefix(b"\n").unwrap_or(line);
        let content = content.get(..content.len().saturating_sub(1)).unwrap_or_default();
        match stop {
            Stop::Line { data: true } => {
                if !wrote {
                    // A data line that begins with a BOM is the stream's
                    // first line, whose BOM stays where it was.
                    if content.starts_with(UTF8_BOM) {
                        out.extend_from_slice(UTF8_BOM);
                    }
                    sse::write_data(message, out);
                    wrote = true;
                }
            }
            Stop::Line { data: false } => {
                out.extend_from_slice(content);
                out.extend_from_slice(b"\r\n");
            }
            Stop::Dispatch | Stop::Input => break,
        }
    }
    if !wrote {
        sse::write_data(message, out);
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::tools::ToolFlags;

    fn policy(deny: &[&str]) -> Policy {
        Policy::from_flags(&ToolFlags {
            allow: None,
            deny: deny.iter().map(|s| s.to_string()).collect(),
            show_identity_params: false,
            identity_params: vec!["sender".into()],
        })
    }

    const LIST: &str = r#"{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"chat_send","description":"Send \u00e9","inputSchema":{"type":"object","properties":{"sender":{"type":"string"},"message":{"type":"string"}},"required":["sender","message"]}},{"name":"chat_rules","inputSchema":{"type":"object","properties":{}}}]}}"#;

    fn run(format: Format, pieces: &[&[u8]], deny: &[&str]) -> (Vec<u8>, ListReport) {
        let p = policy(deny);
        let map = StampMap::agentchattr();
        let mut f = ListFilter::new(
            format,
            b"3",
            &p,
            &map,
            ListOptions { learn_room: 8, insert_cache_scope: false },
            true,
        );
        let mut out = Vec::new();
        for piece in pieces {
            f.feed(piece, &mut out);
        }
        f.finish(&mut out);
        (out, f.take_outcome())
    }

    fn tools(message: &[u8]) -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_slice(message).unwrap();
        v["result"]["tools"].clone()
    }

    #[test]
    fn a_json_answer_is_rewritten_whatever_its_pieces() {
        let body = LIST.as_bytes();
        for cut in 0..=body.len() {
            let (out, o) = run(Format::Json, &[&body[..cut], &body[cut..]], &["chat_rules"]);
            let t = tools(&out);
            assert_eq!(t.as_array().unwrap().len(), 1, "cut {cut}");
            assert_eq!(t[0]["name"], "chat_send");
            assert!(t[0]["inputSchema"]["properties"].get("sender").is_none());
            assert_eq!(t[0]["inputSchema"]["required"], serde_json::json!(["message"]));
            // Untouched bytes stay as sent: the escape is still an escape.
            assert!(String::from_utf8_lossy(&out).contains(r#""Send \u00e9""#));
            assert_eq!((o.hidden_tools, o.refused), (1, false));
        }
    }

    #[test]
    fn an_sse_answer_among_other_events_is_rewritten_and_the_rest_passes_in_order() {
        let note = "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":\"x\"}}\r\n\r\n";
        let answer = format!("id: 7\r\nevent: message\r\ndata: {LIST}\r\n\r\n");
        let after = ": trailing comment\r\n\r\n";
        let stream = format!(": hi\n\n{note}{answer}{after}");
        let b = stream.as_bytes();
        for cut in 0..=b.len() {
            let (out, o) = run(Format::EventStream, &[&b[..cut], &b[cut..]], &["chat_rules"]);
            let text = String::from_utf8(out.clone()).unwrap();
            assert!(
                text.starts_with(&format!(": hi\n\n{note}id: 7\r\nevent: message\r\ndata: ")),
                "cut {cut}: {text}"
            );
            assert!(text.ends_with(after), "cut {cut}: {text}");
            let mut data = None;
            for_each_message_event(&out, |d| {
                if d.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":3") {
                    data = Some(d.to_vec());
                }
                true
            });
            let t = tools(&data.expect("the answer event"));
            assert_eq!(t.as_array().unwrap().len(), 1, "cut {cut}");
            assert!(!text.contains("chat_rules") && !text.contains("\"sender\""), "cut {cut}: {text}");
            assert!(!o.refused);
        }
    }

    /// An answer whose stream began with a BOM and then its data line kept
    /// that line as it came, the original list in it, beside the rewritten
    /// data: the BOM was read as part of the line's field name there, but
    /// not where the answer was found.
    #[test]
    fn regression_an_answer_after_the_stream_s_bom_is_replaced_whole() {
        let stream = format!("\u{FEFF}data: {LIST}\r\nid: 1\r\n\r\n");
        let b = stream.as_bytes();
        for cut in 0..=b.len() {
            let (out, o) = run(Format::EventStream, &[&b[..cut], &b[cut..]], &["chat_rules"]);
            let text = String::from_utf8(out.clone()).unwrap();
            assert!(
                text.starts_with("\u{FEFF}data: {") && text.ends_with("}\r\nid: 1\r\n\r\n"),
                "cut {cut}: {text}"
            );
            assert!(!text.contains("chat_rules"), "cut {cut}: {text}");
            assert_eq!((o.hidden_tools, o.refused), (1, false), "cut {cut}");
        }
    }

    #[test]
    fn an_sse_answer_fed_a_byte_at_a_time_is_the_one_fed_whole() {
        let note = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n";
        for eol in ["\n", "\r\n", "\r"] {
            let stream = format!("{note}event: message{eol}data: {LIST}{eol}{eol}: after{eol}{eol}");
            let whole = run(Format::EventStream, &[stream.as_bytes()], &["chat_rules"]).0;
            let bytes: Vec<&[u8]> = stream.as_bytes().chunks(1).collect();
            let (one_by_one, o) = run(Format::EventStream, &bytes, &["chat_rules"]);
            assert_eq!(String::from_utf8_lossy(&one_by_one), String::from_utf8_lossy(&whole), "eol {eol:?}");
            assert!(!String::from_utf8_lossy(&whole).contains("chat_rules"), "eol {eol:?}");
            assert_eq!((o.hidden_tools, o.refused), (1, false), "eol {eol:?}");
        }
    }

    #[test]
    fn what_cannot_be_rewritten_is_refused_with_the_id() {
        for body in [
            &br#"{"jsonrpc":"2.0","id":3,"result":{"tools":{}}}"#[..],
            b"not json",
            br#"{"jsonrpc":"2.0","id":3"#,
        ] {
            let (out, o) = run(Format::Json, &[body], &["chat_rules"]);
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(
                (v["id"].clone(), v["error"]["code"].clone()),
                (serde_json::json!(3), serde_json::json!(-32603))
            );
            assert!(o.refused && o.failed.is_some());
        }
        // Over the bound: refused, in JSON and in an event stream.
        let big = format!(
            r#"{{"jsonrpc":"2.0","id":3,"result":{{"tools":[],"x":"{}"}}}}"#,
            "a".repeat(MAX_LIST_ANSWER)
        );
        let (out, o) = run(Format::Json, &[big.as_bytes()], &[]);
        assert!(String::from_utf8_lossy(&out).contains("-32603") && out.len() < 1000 && o.refused);
        // An event stream without the answer (a JSON body labelled as one,
        // or one cut before its blank line): the error, never the bytes.
        for stream in [LIST.to_string(), format!("event: message\ndata: {LIST}\n")] {
            let (out, o) = run(Format::EventStream, &[stream.as_bytes()], &["chat_rules"]);
            let text = String::from_utf8_lossy(&out);
            assert!(text.contains("-32603") && !text.contains("chat_rules") && o.refused, "{text}");
        }
        let sse = format!("event: message\ndata: {big}\n\nevent: message\ndata: {{\"after\":1}}\n\n");
        let (out, o) = run(Format::EventStream, &[sse.as_bytes()], &[]);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("-32603") && out.len() < 1000 && o.refused, "{text}");
    }

    /// How the filter knows the list's request: a POST of it alone, a
    /// batch holding it among others, a legacy stream's owed id.
    #[derive(Clone, Copy, Debug)]
    enum Asked {
        Sole,
        Batch,
        Legacy,
    }

    fn filter(asked: Asked, format: Format, id: &[u8]) -> ListFilter {
        let p = policy(&["chat_rules"]);
        let map = StampMap::agentchattr();
        let options = ListOptions { learn_room: 8, insert_cache_scope: false };
        match asked {
            Asked::Sole => ListFilter::new(format, id, &p, &map, options, true).answering_alone(),
            Asked::Batch => ListFilter::for_ids(format, &[id], &p, &map, options, true),
            Asked::Legacy => ListFilter::new(format, id, &p, &map, options, true),
        }
    }

    /// The messages of an output, as a client reads them (each event's
    /// data, or the JSON body; arrays flattened).
    fn messages(format: Format, out: &[u8]) -> Vec<serde_json::Value> {
        let mut bodies = Vec::new();
        match format {
            Format::Json => bodies.push(out.to_vec()),
            Format::EventStream => for_each_message_event(out, |d| {
                bodies.push(d.to_vec());
                true
            }),
        }
        let mut all = Vec::new();
        for b in bodies {
            match serde_json::from_slice::<serde_json::Value>(&b) {
                Ok(serde_json::Value::Array(items)) => all.extend(items),
                Ok(v) => all.push(v),
                Err(e) => panic!("{e}: {}", String::from_utf8_lossy(&b)),
            }
        }
        all
    }

    #[test]
    fn a_list_answered_under_any_spelling_of_its_id_is_filtered_never_relayed_as_it_came() {
        // The request said 515; the upstream answers "515", 515.0, an
        // escaped "515", " 515", 5.15e2 (clients take each as 515), or an
        // id that is nobody's: the list is filtered whatever the spelling,
        // in JSON, in a JSON array, in an event, in an event holding an
        // array, and however the body is split.
        let spellings =
            [r#""515""#, "515.0", r#""\u0035\u0031\u0035""#, r#"" 515""#, "5.15e2", r#""nobody""#, "515"];
        for spelling in spellings {
            let list = LIST.replacen(r#""id":3"#, &format!(r#""id":{spelling}"#), 1);
            let bodies = [
                (Format::Json, list.clone()),
                (Format::Json, format!("[{list}]")),
                (Format::EventStream, format!("event: message\r\ndata: {list}\r\n\r\n")),
                (Format::EventStream, format!("event: message\ndata: [{list}]\n\n")),
            ];
            for asked in [Asked::Sole, Asked::Batch, Asked::Legacy] {
                for (format, body) in &bodies {
                    // A JSON single body is the answer wherever it comes
                    // from; a legacy stream is always an event stream.
                    if matches!(asked, Asked::Legacy) && *format == Format::Json {
                        continue;
                    }
                    let b = body.as_bytes();
                    for cut in 0..=b.len() {
                        let mut f = filter(asked, *format, b"515");
                        let mut out = Vec::new();
                        f.feed(&b[..cut], &mut out);
                        f.feed(&b[cut..], &mut out);
                        f.finish(&mut out);
                        let text = String::from_utf8_lossy(&out);
                        let what = format!("{asked:?} {format:?} id {spelling} cut {cut}: {text}");
                        assert!(!text.contains("chat_rules") && !text.contains(r#""sender""#), "{what}");
                        let listed: Vec<_> = messages(*format, &out)
                            .into_iter()
                            .filter(|m| m["result"]["tools"].is_array())
                            .collect();
                        assert_eq!(listed.len(), 1, "{what}");
                        assert_eq!(listed[0]["result"]["tools"][0]["name"], "chat_send", "{what}");
                        // A spelling clients read as 515 answers the list:
                        // no error is added for it.
                        if spelling != r#""nobody""# || matches!(asked, Asked::Sole) {
                            assert!(!text.contains("could not be filtered"), "{what}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_sole_answer_is_read_to_its_end_so_a_second_response_cannot_carry_the_list_past() {
        // An error under another id first, then the list: a client that
        // skipped the first (its id is not the request's) takes the second.
        let first = r#"{"jsonrpc":"2.0","id":"abc","error":{"code":-1,"message":"x"}}"#;
        let list = LIST.replacen(r#""id":3"#, r#""id":515"#, 1);
        for eol in ["\n", "\r\n", "\r"] {
            let body = format!(
                "event: message{eol}data: {first}{eol}{eol}event: message{eol}data: {list}{eol}{eol}"
            );
            let b = body.as_bytes();
            for cut in 0..=b.len() {
                let mut f = filter(Asked::Sole, Format::EventStream, b"515");
                let mut out = Vec::new();
                f.feed(&b[..cut], &mut out);
                f.feed(&b[cut..], &mut out);
                f.finish(&mut out);
                let text = String::from_utf8_lossy(&out);
                assert!(!text.contains("chat_rules"), "eol {eol:?} cut {cut}: {text}");
                assert!(
                    text.contains("chat_send") && text.contains(r#""id":"abc""#),
                    "eol {eol:?} cut {cut}: {text}"
                );
            }
        }
        // In a JSON array too.
        let body = format!("[{first},{list}]");
        let mut f = filter(Asked::Sole, Format::Json, b"515");
        let mut out = Vec::new();
        f.feed(body.as_bytes(), &mut out);
        f.finish(&mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("chat_rules") && text.contains("chat_send"), "{text}");
    }

    #[test]
    fn a_batchs_other_answers_pass_unchanged_beside_its_filtered_list() {
        // A tools/call answer and an error in the batch's array: not lists,
        // so they pass as they came, byte for byte.
        let call = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"chat_rules"}]}}"#;
        let err = r#"{"jsonrpc":"2.0","id":"x","error":{"code":-32602,"message":"no"}}"#;
        let list = LIST.replacen(r#""id":3"#, r#""id":"515""#, 1);
        let body = format!("[{call},{list},{err}]");
        let mut f = filter(Asked::Batch, Format::Json, b"515");
        let mut out = Vec::new();
        f.feed(body.as_bytes(), &mut out);
        f.finish(&mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with(&format!("[{call},")) && text.ends_with(&format!(",{err}]")), "{text}");
        let m = messages(Format::Json, &out);
        assert_eq!(m[1]["result"]["tools"].as_array().map(Vec::len), Some(1), "{text}");
    }

    #[test]
    fn an_event_too_large_to_read_before_the_answer_never_lets_the_answer_through_unfiltered() {
        // A 4 MiB progress notification, then the list: the large one is
        // answered with the error (it may have been the list), and the list
        // that follows is still filtered, not relayed as it came.
        let big = format!(
            "event: message\r\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"data\":\"{}\"}}}}\r\n\r\n",
            "x".repeat(MAX_LIST_ANSWER)
        );
        let list = format!("event: message\r\ndata: {LIST}\r\n\r\n");
        let body = format!("{big}{list}");
        for piece in [body.len(), 64 * 1024, 1000] {
            let pieces: Vec<&[u8]> = body.as_bytes().chunks(piece).collect();
            let (out, o) = run(Format::EventStream, &pieces, &["chat_rules"]);
            let text = String::from_utf8_lossy(&out);
            assert!(o.refused, "piece {piece}");
            assert!(!text.contains("chat_rules"), "piece {piece}: the list went through unfiltered");
            assert!(
                text.contains("chat_send") && text.contains("could not be filtered"),
                "piece {piece}: {}",
                &text[..text.len().min(400)]
            );
        }
    }
}

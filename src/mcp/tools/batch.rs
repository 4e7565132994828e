//! A batch (protocol 2025-03-26) holding a `tools/call` the policy hides:
//! the rest goes upstream, and each hidden request gets its error in its
//! place. `split_batch` splits the request (from the stamp scan's
//! envelope: the body is not parsed again); `BatchAnswer` adds the errors to
//! the upstream's answer as it streams past: into its JSON array, as events
//! of its event stream, or as the whole answer when the upstream accepted
//! the rest with 202 (it held no request). Pure: bytes in, bytes out.

use super::policy::Policy;
use crate::mcp::initialize::Format;
use crate::mcp::json;
use crate::mcp::rpc;
use crate::mcp::sse::write_message_event;
use crate::mcp::stamp::Plan;

/// A batch some of whose `tools/call`s the policy hides, split: the rest
/// goes upstream, and each hidden call that is a request gets its error in
/// its place (`message` under `code`, with its id).
#[derive(Debug, PartialEq, Eq)]
pub struct BatchSplit {
    /// The batch without the hidden calls (`[]` when none is left).
    pub forward: Vec<u8>,
    /// How many elements `forward` holds.
    pub kept: usize,
    /// One JSON-RPC error object per hidden request, in order.
    pub errors: Vec<Vec<u8>>,
}

/// Splits `body`, scanned into `plan`, when it is a batch holding a
/// `tools/call` the policy hides (read as `allows_call` reads it); `None`
/// otherwise, or when the body was not scanned (the caller has refused such
/// a body already). A hidden call that is a request is answered with its
/// id (`null` when it has none that an answer can carry); one that is a
/// notification is owed nothing.
pub fn split_batch(
    body: &[u8],
    plan: &Plan,
    policy: &Policy,
    code: i32,
    message: &str,
) -> Option<BatchSplit> {
    if !plan.is_batch() {
        return None;
    }
    let mut split = BatchSplit { forward: vec![b'['], kept: 0, errors: Vec::new() };
    for e in plan.envelope()? {
        let call = e.object && e.method.is_some_and(|m| m.is_str(body, rpc::TOOLS_CALL));
        if call && !policy.allows_call(body, e.name.as_ref()) {
            if let Some(id) = e.id {
                let mut error = Vec::new();
                rpc::write_error_for(&mut error, rpc::answer_id(body, id), code, message);
                split.errors.push(error);
            }
            continue;
        }
        if split.kept > 0 {
            split.forward.push(b',');
        }
        split.forward.extend_from_slice(body.get(e.start..e.end).unwrap_or_default());
        split.kept += 1;
    }
    split.forward.push(b']');
    let hidden = split.kept < plan.envelope()?.len();
    hidden.then_some(split)
}

/// How the upstream's answer to the rest of a batch is completed.
#[derive(Debug)]
pub struct BatchAnswer {
    errors: Vec<Vec<u8>>,
    mode: Mode,
    state: State,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A JSON answer: the errors go into its array.
    Json,
    /// An event stream: the errors go first, one event each.
    Events,
    /// The upstream's body (202's) is dropped; the errors are the answer.
    Replace,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace seen.
    Start,
    /// The answer's `[` was written; the errors go before its first element.
    Open,
    /// The answer was not an array: it was wrapped in one, closed at the end.
    Wrapped,
    Done,
}

impl BatchAnswer {
    /// For an answer of `format`; `replace` for a 202 (no answer of the
    /// upstream's to add to).
    pub fn new(format: Format, errors: Vec<Vec<u8>>, replace: bool) -> BatchAnswer {
        let mode = match (replace, format) {
            (true, _) => Mode::Replace,
            (false, Format::EventStream) => Mode::Events,
            (false, Format::Json) => Mode::Json,
        };
        BatchAnswer { errors, mode, state: State::Start }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// How many errors the proxy adds.
    pub fn count(&self) -> usize {
        self.errors.len()
    }

    fn joined(&self, out: &mut Vec<u8>) {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(e);
        }
    }

    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let mut rest = data;
        loop {
            match (self.mode, self.state) {
                (Mode::Replace, _) => return,
                (_, State::Done | State::Wrapped) => break,
                (Mode::Events, _) => {
                    for e in &self.errors {
                        write_message_event(e, out);
                    }
                    self.state = State::Done;
                }
                (Mode::Json, state) => {
                    let ws = rest.iter().take_while(|&&b| json::is_ws(b)).count();
                    out.extend_from_slice(rest.get(..ws).unwrap_or_default());
                    rest = rest.get(ws..).unwrap_or_default();
                    let Some(&first) = rest.first() else { return };
                    match (state, first) {
                        (State::Start, b'[') => {
                            out.push(b'[');
                            rest = rest.get(1..).unwrap_or_default();
                            self.state = State::Open;
                        }
                        (State::Start, _) => {
                            out.push(b'[');
                            self.joined(out);
                            out.push(b',');
                            self.state = State::Wrapped;
                        }
                        (_, b']') => {
                            self.joined(out);
                            self.state = State::Done;
                        }
                        _ => {
                            self.joined(out);
                            out.push(b',');
                            self.state = State::Done;
                        }
                    }
                }
            }
        }
        out.extend_from_slice(rest);
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        match (self.mode, self.state) {
            (Mode::Replace, _) | (Mode::Json, State::Start) => {
                out.push(b'[');
                self.joined(out);
                out.push(b']');
            }
            (Mode::Events, State::Start) => {
                for e in &self.errors {
                    write_message_event(e, out);
                }
            }
            (_, State::Wrapped) => out.push(b']'),
            _ => {}
        }
        self.state = State::Done;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::tools::ToolFlags;
    use serde_json::{json, Value as Json};

    fn deny(names: &[&str]) -> Policy {
        Policy::from_flags(&ToolFlags {
            allow: None,
            deny: names.iter().map(|s| s.to_string()).collect(),
            show_identity_params: false,
            identity_params: vec![],
        })
    }

    /// `body` scanned as the proxy scans a request, then split.
    fn split(body: &[u8], policy: &Policy, code: i32, message: &str) -> Option<BatchSplit> {
        let plan =
            crate::mcp::stamp::plan(body, "alice", &crate::mcp::stamp::StampMap::agentchattr()).unwrap();
        split_batch(body, &plan, policy, code, message)
    }

    #[test]
    fn a_batch_is_split_around_its_hidden_calls() {
        let body = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_rules"}},
            {"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"chat_send","arguments":{}}},
            7, "s",
            {"jsonrpc":"2.0","method":"tools/call","params":{"name":"chat_rules"}},
            {"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"chat_r\u0075les"}},
            {"jsonrpc":"2.0","id":4,"method":"tools/call","params":{}},
            {"jsonrpc":"2.0","id":5,"method":"tools\/call","params":{"name":"chat_rules"}},
            {"jsonrpc":"2.0","id":[],"method":"tools/call","params":{"name":"chat_rules"}},
            {"jsonrpc":"2.0","method":"notifications/x"}, null]"#;
        let s = split(body, &deny(&["chat_rules"]), -32602, "Unknown tool").unwrap();
        let fwd: Json = serde_json::from_slice(&s.forward).unwrap();
        // The elements that are not objects stay, for the upstream to answer.
        assert_eq!(
            fwd,
            json!([{"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"chat_send","arguments":{}}},
            7, "s", {"jsonrpc":"2.0","method":"notifications/x"}, null])
        );
        assert_eq!(s.kept, 5);
        let errs: Vec<Json> = s.errors.iter().map(|e| serde_json::from_slice(e).unwrap()).collect();
        let ids: Vec<&Json> = errs.iter().map(|e| &e["id"]).collect();
        // The notification gets no answer; a call without a name is refused;
        // an id no answer can carry is answered with null.
        assert_eq!(ids, [&json!(1), &json!(3), &json!(4), &json!(5), &Json::Null]);
        assert!(errs.iter().all(|e| e["error"]["code"] == -32602));
    }

    #[test]
    fn nothing_is_split_without_a_hidden_call_or_a_batch() {
        let p = deny(&["chat_rules"]);
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_rules"}}"#;
        assert_eq!(split(call, &p, -32602, "x"), None, "not a batch");
        let ok = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send"}}, 1]"#;
        assert_eq!(split(ok, &p, -32602, "x"), None);
        let all = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_rules"}}]"#;
        let s = split(all, &p, -32602, "x").unwrap();
        assert_eq!((s.forward.as_slice(), s.kept), (&b"[]"[..], 0));
        // A body the scan did not read is not split here.
        let mut plan =
            crate::mcp::stamp::plan(all, "alice", &crate::mcp::stamp::StampMap::agentchattr()).unwrap();
        plan.forget_envelope();
        assert_eq!(split_batch(all, &plan, &p, -32602, "x"), None);
    }

    fn answer(format: Format, replace: bool, body: &[u8], cut: usize) -> Vec<u8> {
        let errors = vec![br#"{"id":7}"#.to_vec(), br#"{"id":8}"#.to_vec()];
        let mut a = BatchAnswer::new(format, errors, replace);
        let mut out = Vec::new();
        let (x, y) = body.split_at(cut);
        a.feed(x, &mut out);
        a.feed(y, &mut out);
        a.finish(&mut out);
        out
    }

    #[test]
    fn the_errors_join_the_json_answer_whatever_its_shape_and_split() {
        let cases: &[(&[u8], &str)] = &[
            (b" [ {\"id\":1} ]", r#"[{"id":7},{"id":8},{"id":1}]"#),
            (b"[]", r#"[{"id":7},{"id":8}]"#),
            (b"\n[\n]", r#"[{"id":7},{"id":8}]"#),
            (b"{\"id\":1}", r#"[{"id":7},{"id":8},{"id":1}]"#),
            (b"", r#"[{"id":7},{"id":8}]"#),
        ];
        for (body, want) in cases {
            for cut in 0..=body.len() {
                let out = answer(Format::Json, false, body, cut);
                let got: Json = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"));
                assert_eq!(got, serde_json::from_str::<Json>(want).unwrap(), "cut {cut}");
            }
        }
    }

    #[test]
    fn the_errors_lead_an_event_stream_and_replace_a_202() {
        let body = b"event: message\r\ndata: {\"id\":1}\r\n\r\n";
        for cut in 0..=body.len() {
            let out = answer(Format::EventStream, false, body, cut);
            let text = String::from_utf8(out).unwrap();
            assert!(
                text.starts_with(
                    "event: message\r\ndata: {\"id\":7}\r\n\r\nevent: message\r\ndata: {\"id\":8}\r\n\r\n"
                ),
                "{text}"
            );
            assert!(text.ends_with(std::str::from_utf8(body).unwrap()), "{text}");
        }
        assert_eq!(answer(Format::Json, true, b"Accepted", 3), br#"[{"id":7},{"id":8}]"#);
    }
}

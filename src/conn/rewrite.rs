//! A response payload's rewrite: an ordered chain of stages (the legacy
//! SSE endpoint, a `tools/list` answer filtered, a legacy stream under the
//! tool policy, a batch's answer completed with the proxy's errors), each fed
//! what the one before it made. Socket-free: bytes in, bytes out;
//! `client_out.rs` frames what the last stage makes.

use crate::mcp::legacy::LegacyStream;
use crate::mcp::sse::EndpointRewriter;
use crate::mcp::tools::{BatchAnswer, ListFilter};
use smallvec::SmallVec;

/// One stage of a response payload's rewrite: the legacy SSE `endpoint`
/// event, a `tools/list` answer the tool policy filters, a legacy SSE stream
/// under the tool policy (its endpoint, the lists it carries, and the
/// proxy's own answers to POSTs), or a batch's answer completed with the
/// proxy's errors for its hidden calls.
#[derive(Debug)]
pub enum Stage {
    Endpoint(EndpointRewriter),
    List(ListFilter),
    /// Boxed: the largest, and one per legacy stream.
    Legacy(Box<LegacyStream>),
    Batch(BatchAnswer),
}

impl Stage {
    fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        match self {
            Stage::Endpoint(r) => r.feed(data, out),
            Stage::List(f) => f.feed(data, out),
            Stage::Legacy(l) => l.feed(data, out),
            Stage::Batch(b) => b.feed(data, out),
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        match self {
            Stage::Endpoint(r) => r.finish(out),
            Stage::List(f) => f.finish(out),
            Stage::Legacy(l) => l.finish(out),
            Stage::Batch(b) => b.finish(out),
        }
    }

    fn is_done(&self) -> bool {
        match self {
            Stage::Endpoint(r) => r.is_done(),
            Stage::List(f) => f.is_done(),
            // Owed answers may come at any time: never done.
            Stage::Legacy(_) => false,
            Stage::Batch(b) => b.is_done(),
        }
    }
}

/// A response payload's rewrite, with the proxy framing what it emits: its
/// stages in order, each fed what the one before it made (a batch's lists
/// filtered, then its hidden calls' errors added).
#[derive(Debug, Default)]
pub struct BodyRewriter {
    stages: SmallVec<[Stage; 2]>,
    /// What a stage made for the next (reused: no allocation per read).
    carry: Vec<u8>,
    made: Vec<u8>,
}

impl BodyRewriter {
    /// The rewrite of these stages, in order; `None` when there is none.
    pub fn of(stages: impl IntoIterator<Item = Stage>) -> Option<BodyRewriter> {
        let mut rw = BodyRewriter::default();
        rw.push_all(stages);
        (!rw.is_empty()).then_some(rw)
    }

    /// Adds stages after those it has.
    pub fn push_all(&mut self, stages: impl IntoIterator<Item = Stage>) {
        self.stages.extend(stages);
    }

    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// The stages, in order (their outcomes are the caller's to read).
    pub fn stages_mut(&mut self) -> impl Iterator<Item = &mut Stage> {
        self.stages.iter_mut()
    }

    /// The legacy stream this rewrite holds, if any.
    pub fn legacy(&mut self) -> Option<&mut LegacyStream> {
        self.stages.iter_mut().find_map(|s| match s {
            Stage::Legacy(l) => Some(&mut **l),
            _ => None,
        })
    }

    pub(super) fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        self.pass_from(0, data, out);
    }

    /// `data`, made by stage `from - 1` (or the payload, from 0), through
    /// stages `from..` into `out`.
    fn pass_from(&mut self, from: usize, data: &[u8], out: &mut Vec<u8>) {
        if from >= self.stages.len() {
            // Made by the last stage: the client's.
            out.extend_from_slice(data);
            return;
        }
        let last = self.stages.len() - 1;
        let (mut carry, mut made) = (std::mem::take(&mut self.carry), std::mem::take(&mut self.made));
        for i in from..self.stages.len() {
            made.clear();
            let input: &[u8] = if i == from { data } else { &carry };
            let output = if i == last { &mut *out } else { &mut made };
            if let Some(stage) = self.stages.get_mut(i) {
                stage.feed(input, output);
            }
            std::mem::swap(&mut carry, &mut made);
        }
        (self.carry, self.made) = (carry, made);
    }

    /// The payload is over: each stage, fed what the one before it made,
    /// ends in turn.
    pub(super) fn finish(&mut self, out: &mut Vec<u8>) {
        let last = self.stages.len().saturating_sub(1);
        let (mut carry, mut made) = (std::mem::take(&mut self.carry), std::mem::take(&mut self.made));
        carry.clear();
        for (i, stage) in self.stages.iter_mut().enumerate() {
            made.clear();
            let output = if i == last { &mut *out } else { &mut made };
            if i > 0 {
                stage.feed(&carry, output);
            }
            stage.finish(output);
            std::mem::swap(&mut carry, &mut made);
        }
        (self.carry, self.made) = (carry, made);
    }

    /// What a legacy stream owes its client now (the proxy's events,
    /// between the upstream's), through the stages after it.
    pub(super) fn idle(&mut self, out: &mut Vec<u8>) {
        let Some(at) = self.stages.iter().position(|s| matches!(s, Stage::Legacy(_))) else { return };
        let mut owed = Vec::new();
        if let Some(Stage::Legacy(l)) = self.stages.get_mut(at) {
            l.idle(&mut owed);
        }
        if !owed.is_empty() {
            self.pass_from(at + 1, &owed, out);
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.stages.iter().all(Stage::is_done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::initialize::Format;
    use crate::mcp::legacy::Owed;
    use crate::mcp::stamp::StampMap;
    use crate::mcp::tools::{ListOptions, Policy, ToolFlags};
    use serde_json::{json, Value as Json};

    /// `body` through `rw` in the pieces `cuts` makes, then its end.
    fn through(mut rw: BodyRewriter, body: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0;
        for &cut in cuts.iter().chain([&body.len()]) {
            rw.feed(&body[at..cut], &mut out);
            at = cut;
        }
        rw.finish(&mut out);
        out
    }

    /// A batch's answer through two stages: its `tools/list` answer filtered
    /// (the denied tool and the identity parameter go), then the proxy's error
    /// for its hidden call added; the same whatever the split, JSON or an
    /// event stream.
    #[test]
    fn a_batchs_lists_are_filtered_then_its_errors_added_at_every_split() {
        let policy = Policy::from_flags(&ToolFlags {
            allow: None,
            deny: vec!["chat_rules".into()],
            show_identity_params: false,
            identity_params: vec![],
        });
        let map = StampMap::agentchattr();
        let list = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"chat_rules","inputSchema":{"type":"object"}},{"name":"chat_send","inputSchema":{"type":"object","properties":{"sender":{"type":"string"},"message":{"type":"string"}}}}]}}"#;
        let call = r#"{"jsonrpc":"2.0","id":2,"result":{"content":[]}}"#;
        let error = br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"hidden"}}"#;
        let json_body = format!("[{list},{call}]").into_bytes();
        let sse_body =
            format!("event: message\ndata: {list}\n\nevent: message\ndata: {call}\n\n").into_bytes();
        for (format, body) in [(Format::Json, &json_body), (Format::EventStream, &sse_body)] {
            let chain = || {
                let options = ListOptions { learn_room: 0, insert_cache_scope: false };
                let list = ListFilter::for_ids(format, &[b"1"], &policy, &map, options, true);
                let batch = BatchAnswer::new(format, vec![error.to_vec()], false);
                BodyRewriter::of([Stage::List(list), Stage::Batch(batch)]).unwrap()
            };
            let answers = |payload: Vec<u8>| -> Vec<Json> {
                match format {
                    Format::Json => serde_json::from_slice::<Vec<Json>>(&payload).unwrap(),
                    Format::EventStream => String::from_utf8(payload)
                        .unwrap()
                        .lines()
                        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                        .map(|d| serde_json::from_str(d).unwrap())
                        .collect(),
                }
            };
            let got = answers(through(chain(), body, &[]));
            assert_eq!(got.len(), 3, "{format:?}: {got:?}");
            let by_id =
                |id: i64| got.iter().find(|a| a["id"] == json!(id)).unwrap_or_else(|| panic!("{got:?}"));
            let tools = &by_id(1)["result"]["tools"];
            assert_eq!(tools.as_array().map(Vec::len), Some(1), "{format:?}: the denied tool stays: {tools}");
            assert_eq!(tools[0]["name"], "chat_send");
            assert!(
                tools[0]["inputSchema"]["properties"].get("sender").is_none(),
                "the identity parameter stays"
            );
            assert_eq!(*by_id(2), serde_json::from_str::<Json>(call).unwrap());
            assert_eq!(by_id(3)["error"]["message"], "hidden");
            for a in 0..=body.len() {
                assert_eq!(answers(through(chain(), body, &[a])), got, "{format:?} cut at {a}");
                let b = (a + 7).min(body.len());
                assert_eq!(answers(through(chain(), body, &[a, b])), got, "{format:?} cuts at {a}, {b}");
            }
        }
    }

    /// What a legacy stream owes its client between the upstream's events
    /// (the proxy's answer to a hidden call) is made when the stream is
    /// idle, and is the client's when the legacy stream is the last stage.
    #[test]
    fn a_legacy_streams_owed_events_are_made_when_idle() {
        let legacy = LegacyStream::new(EndpointRewriter::new(b"up.example:9000", b"127.0.0.1:4000"));
        let mut rw = BodyRewriter::of([Stage::Legacy(Box::new(legacy))]).unwrap();
        let mut out = Vec::new();
        rw.feed(b"event: endpoint\ndata: /messages/?session_id=abc\n\n", &mut out);
        let endpoint = out.len();
        assert!(endpoint > 0);
        rw.idle(&mut out);
        assert_eq!(out.len(), endpoint, "nothing owed yet");
        let event = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":-32602}}\n\n";
        let options = ListOptions { learn_room: 0, insert_cache_scope: false };
        let policy = Policy::from_flags(&ToolFlags::default());
        let owed = Owed { lists: vec![], events: event.to_vec() };
        rw.legacy().unwrap().owe(owed, &policy, &StampMap::agentchattr(), options, true);
        rw.idle(&mut out);
        assert_eq!(&out[endpoint..], &event[..]);
        assert!(!rw.is_done(), "a legacy stream is never done");
    }
}

//! The tool policy of an exchange, at its fixed points. At the request
//! (`request.rs`, once the body is whole and stamped): a `tools/call` of a
//! tool the policy hides is answered by the proxy (a batch's hidden calls
//! each in its place, the rest forwarded), and the ids of the `tools/list`
//! requests whose answers are filtered are kept. At the response head
//! (`response.rs`): the stages of the response's rewrite, a `tools/list`
//! answer's filter and a batch answer's completion. After the rewrite: what
//! its stages reported (learned stamps, lists not rewritten), and a legacy
//! stream's turn (the lists and errors POSTs owe it).

use crate::conn::answer::Answer;
use crate::conn::client_out::{BodyRewriter, Stage};
use crate::conn::exchange::Exchange;
use crate::conn::Ctx;
use crate::http::framing::Framing;
use crate::http::head::ResponseHead;
use crate::http::headers::name;
use crate::mcp::initialize::Format;
use crate::mcp::legacy;
use crate::mcp::rpc;
use crate::mcp::stamp::Plan;
use crate::mcp::tools::{split_batch, Policy as ToolPolicy};
use crate::mcp::tools::{BatchAnswer, ListFilter, ListHandling, ListOptions};
use log::debug;
use log::warn;
use smallvec::SmallVec;

/// The tool policy's part of the exchange.
#[derive(Default)]
pub(in crate::conn) struct PolicyState {
    /// The ids (JSON text) of the body's `tools/list` requests, when the
    /// policy rewrites their answers.
    pub(in crate::conn) list_request: Option<Box<[Box<[u8]>]>>,
    /// The proxy's errors for the hidden calls of a batch whose rest went
    /// upstream: added to the upstream's answer.
    pub(in crate::conn) batch_errors: Vec<Vec<u8>>,
}

impl PolicyState {
    /// A new exchange: nothing listed, nothing owed.
    pub(in crate::conn) fn begin(&mut self) {
        self.list_request = None;
        self.batch_errors.clear();
    }
}

/// The first `tools/call` of the body (a message or a batch) of a tool the
/// policy hides, from the calls the stamp scan noted: the tool's decoded
/// name, its first 64 bytes (at a character boundary: it goes in a log
/// line, and the client chose it).
fn hidden_call(body: &[u8], plan: &Plan, policy: &ToolPolicy) -> Option<String> {
    let name = plan.called_tools().iter().find(|name| !policy.allows_call(body, name.as_ref()))?;
    let mut name = name.and_then(|n| n.decode_str(body)).unwrap_or_default();
    let mut cut = name.len().min(64);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    name.truncate(cut);
    Some(name)
}

/// The ids (JSON text) of the `tools/list` requests of a body (one
/// message, or a batch's), read from the stamp scan's envelope; `None`
/// when it has none.
fn tools_list_ids(body: &[u8], plan: &Plan) -> Option<Box<[Box<[u8]>]>> {
    let ids: Vec<Box<[u8]>> = plan
        .messages(body)?
        .filter(|m| m.role() == rpc::Role::Request && m.is_method(rpc::TOOLS_LIST))
        .map(|m| m.id().json().into())
        .collect();
    (!ids.is_empty()).then(|| ids.into())
}

/// What becomes of a request whose body calls a tool the policy hides:
/// the core carries it out.
pub(in crate::conn) enum Refusal {
    /// The rest of a batch goes upstream (the exchange's body and plan are
    /// the rest's now).
    Forward,
    /// 202 and no body: nothing is owed on this POST (`Answer` says why,
    /// for the log and the record).
    Accepted(Answer),
    /// The proxy's answer, with the requests' ids.
    Reply(Answer),
}

impl Exchange {
    /// The tool policy at the request, once the body is whole and stamped:
    /// a hidden tool's call is refused (`refuse_hidden`); the ids of the
    /// `tools/list` requests whose answers are filtered are kept (on legacy
    /// SSE the session's stream expects them; one not relayed here cannot
    /// filter them, so under a policy that hides something the list is
    /// refused, 403). `conn` names the connection in the log lines.
    pub(in crate::conn) fn request_policy(&mut self, conn: u64, ctx: &Ctx) -> Refusal {
        if !ctx.policy.allows_all() {
            if let Some(tool) = hidden_call(&self.body, &self.plan, ctx.policy) {
                let legacy = legacy::post_session(&self.req.target).map(<[u8]>::to_vec);
                let refusal = self.refuse_hidden(conn, ctx, &tool, legacy.as_deref());
                if !matches!(refusal, Refusal::Forward) {
                    return refusal;
                }
            }
        }
        // Asked only of a body that lists tools (not on every call's path).
        let handling = if self.plan.lists_tools() {
            ctx.policy.list_handling(ctx.stamps, ctx.stamps.learn_room())
        } else {
            ListHandling::Relay
        };
        let list =
            if handling != ListHandling::Relay { tools_list_ids(&self.body, &self.plan) } else { None };
        let legacy = list.as_ref().and_then(|_| legacy::post_session(&self.req.target)).map(<[u8]>::to_vec);
        match (list, legacy) {
            // A legacy session's list arrives on its GET stream, which
            // filters it; a stream not relayed here cannot, so under a
            // policy that hides something the list is not asked for.
            (Some(ids), Some(session)) => {
                let mut routes = ctx.legacy.borrow_mut();
                let routed = ids.iter().all(|id| routes.expect_list(&session, id));
                drop(routes);
                if !routed && handling == ListHandling::Rewrite {
                    warn!(
                        "conn {conn}: tools/list of a legacy SSE session whose stream is not relayed here: refused (403)"
                    );
                    return Refusal::Reply(Answer::ListUnfiltered);
                }
            }
            (list, _) => self.policy.list_request = list,
        }
        Refusal::Forward
    }

    /// A `tools/call` of a tool the policy hides, answered by the proxy
    /// (a batch: each of its hidden calls; the rest, if any, goes on):
    /// on streamable HTTP in the POST's answer (200 with MCP's unknown-tool
    /// error and the request's id; a batch's errors join the upstream's
    /// answer). On legacy SSE (`session`) answers travel on the session's
    /// GET stream: the errors go there as `message` events and the POST
    /// gets 202 (or the upstream's answer to the rest); when that stream is
    /// not relayed here, the whole POST gets 403 with the errors. `conn`
    /// names the connection in the log lines.
    fn refuse_hidden(&mut self, conn: u64, ctx: &Ctx, tool: &str, session: Option<&[u8]>) -> Refusal {
        let code = Answer::HiddenTool.jsonrpc_code();
        let message = Answer::HiddenTool.message();
        let split = split_batch(&self.body, &self.plan, ctx.policy, code, &message);
        let errors = match &split {
            Some(s) => s.errors.clone(),
            None => {
                // A notification gets no error (empty): it is owed no answer.
                let mut e = Vec::new();
                let parsed = self.request_body();
                Answer::HiddenTool.write_errors(parsed.as_ref(), &mut e);
                vec![e]
            }
        };
        let rest = split.filter(|s| s.kept > 0);
        // Notifications only: 202 and no body, as MCP's streamable HTTP
        // answers them, and nothing forwarded (over legacy SSE too: nothing
        // is owed on the stream).
        let owed = errors.iter().any(|e| !e.is_empty());
        if rest.is_none() && !owed {
            warn!(
                "conn {}: tools/call notification of {tool:?}, which the tool policy hides: dropped (202)",
                conn
            );
            return Refusal::Accepted(Answer::HiddenTool);
        }
        if let Some(session) = session {
            if !ctx.legacy.borrow().has(session) {
                warn!(
                    "conn {}: tools/call of {tool:?}, which the tool policy hides: answered by the proxy (403: the legacy SSE stream is not relayed here)",
                    conn
                );
                return Refusal::Reply(Answer::HiddenToolLegacy);
            }
            let mut routes = ctx.legacy.borrow_mut();
            let sent = errors.iter().filter(|e| !e.is_empty()).all(|e| routes.send(session, e));
            drop(routes);
            if !sent {
                warn!(
                    "conn {}: legacy SSE stream owes too much: the proxy's error for {tool:?} dropped",
                    conn
                );
            }
        }
        let Some(rest) = rest else {
            warn!(
                "conn {}: tools/call of {tool:?}, which the tool policy hides: answered by the proxy",
                conn
            );
            return match session {
                Some(_) => Refusal::Accepted(Answer::HiddenTool),
                None => Refusal::Reply(Answer::HiddenTool),
            };
        };
        warn!(
            "conn {}: tools/call of {tool:?} in a batch, which the tool policy hides: {} answered by the proxy, {} forwarded",
            conn,
            errors.len(),
            rest.kept
        );
        self.body = rest.forward;
        if let Err(e) = self.plan_upstream(ctx) {
            warn!("conn {conn}: request body refused: {e}");
            return Refusal::Reply(Answer::BodyRefused(e));
        }
        if session.is_none() {
            self.policy.batch_errors = errors;
        }
        Refusal::Forward
    }
}

/// The tool policy at the response: the filter of a `tools/list` answer and
/// the completion of a batch's answer, stages of the response's rewrite.
impl Exchange {
    /// The filter of this exchange's `tools/list` answer, when the tool
    /// policy rewrites it: a 200 with a body. An event stream is read as
    /// one; any other `Content-Type`, or none, as JSON, so that a list the
    /// policy must filter never passes for want of a label (what is not
    /// JSON is then refused).
    pub(in crate::conn) fn list_filter(&self, resp: &ResponseHead, ctx: &Ctx) -> Option<ListFilter> {
        let ids: SmallVec<[&[u8]; 1]> = self.policy.list_request.as_deref()?.iter().map(|id| &**id).collect();
        if resp.status != 200 || resp.framing == Framing::None {
            return None;
        }
        let format = resp.headers.get_name(name::CONTENT_TYPE).and_then(Format::from_content_type);
        let format = format.unwrap_or(Format::Json);
        let handling = ctx.policy.list_handling(ctx.stamps, ctx.stamps.learn_room());
        // 2026-07-28 put a cache scope on list results: a filtered list is
        // this agent's, not a shared one.
        let revision = self.req.headers.get_name(name::MCP_PROTOCOL_VERSION).unwrap_or_default();
        let options = ListOptions {
            learn_room: ctx.stamps.learn_room(),
            insert_cache_scope: revision >= &b"2026-07-28"[..],
        };
        let enforce = handling == ListHandling::Rewrite;
        let filter = ListFilter::for_ids(format, &ids, ctx.policy, ctx.stamps, options, enforce);
        // One request's answer: every response in it is the list's.
        Some(if crate::mcp::json::is_array(&self.body) { filter } else { filter.answering_alone() })
    }

    /// The completion of a batch's answer with the proxy's errors for its
    /// hidden calls: added to a 200's JSON array or event stream; a 202
    /// (the upstream owed the rest no answer) becomes a 200 whose body is
    /// the errors. Any other status is relayed as it came: the errors are
    /// not sent (said at warn).
    pub(in crate::conn) fn batch_answer(
        &mut self,
        resp: &mut ResponseHead,
        conn: u64,
    ) -> Option<BatchAnswer> {
        if self.policy.batch_errors.is_empty() {
            return None;
        }
        let errors = std::mem::take(&mut self.policy.batch_errors);
        let format = resp.headers.get_name(name::CONTENT_TYPE).and_then(Format::from_content_type);
        match resp.status {
            200 if resp.framing != Framing::None => {
                Some(BatchAnswer::new(format.unwrap_or(Format::Json), errors, false))
            }
            202 if resp.framing != Framing::None => {
                resp.status = 200;
                resp.reason = smallvec::SmallVec::from_slice(b"OK");
                // A constant, valid field: `set` cannot fail here.
                let _ = resp.headers.set_name(name::CONTENT_TYPE, b"application/json");
                Some(BatchAnswer::new(Format::Json, errors, true))
            }
            status => {
                warn!(
                    "conn {}: the upstream answered a batch's forwarded part with {status}: the proxy's {} errors for its hidden calls are not sent",
                    conn,
                    errors.len()
                );
                None
            }
        }
    }
}

/// The tool policy after the response's rewrite: what its stages reported.
/// A rewriter is done: a `tools/list` filter's learned stamps go to the
/// loop, and what it could not rewrite is said at warn.
pub(in crate::conn) fn rewriter_finished(conn: u64, finished: Option<Box<BodyRewriter>>, ctx: &Ctx) {
    let Some(mut finished) = finished else { return };
    for stage in finished.stages_mut() {
        match stage {
            Stage::List(f) => list_outcome(conn, f.take_outcome(), ctx),
            Stage::Legacy(l) => {
                ctx.legacy.borrow_mut().close(conn);
                for o in l.take_outcomes() {
                    list_outcome(conn, o, ctx);
                }
            }
            Stage::Endpoint(_) | Stage::Batch(_) => {}
        }
    }
}

/// A legacy stream's turn, with no socket touched: it registers the
/// session its endpoint event named, takes what POSTs owe it (lists to
/// filter, events to add) and reports the lists it finished.
pub(in crate::conn) fn legacy_turn(conn: u64, rewriter: &mut Option<Box<BodyRewriter>>, ctx: &Ctx) {
    let Some(l) = rewriter.as_deref_mut().and_then(BodyRewriter::legacy) else { return };
    let mut routes = ctx.legacy.borrow_mut();
    if let Some(session) = l.take_new_session() {
        debug!("conn {}: legacy SSE stream of session {:?}", conn, String::from_utf8_lossy(&session));
        routes.open(session, conn);
    }
    if let Some(owed) = routes.take(conn) {
        let options = ListOptions { learn_room: ctx.stamps.learn_room(), insert_cache_scope: false };
        let enforce = ctx.policy.list_handling(ctx.stamps, ctx.stamps.learn_room()) == ListHandling::Rewrite;
        l.owe(owed, ctx.policy, ctx.stamps, options, enforce);
    }
    drop(routes);
    for o in l.take_outcomes() {
        list_outcome(conn, o, ctx);
    }
}

fn list_outcome(conn: u64, o: crate::mcp::tools::ListReport, ctx: &Ctx) {
    if let Some(why) = o.failed {
        if o.refused {
            warn!("conn {}: tools/list answer not relayed: {why}: answered with a JSON-RPC error", conn);
        } else {
            debug!("conn {}: tools/list answer relayed as it came: {why}", conn);
        }
    } else if o.hidden_tools + o.hidden_params > 0 {
        debug!(
            "conn {}: tools/list filtered: {} tools and {} identity parameters hidden",
            conn, o.hidden_tools, o.hidden_params
        );
    }
    ctx.learned.borrow_mut().extend(o.learned);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::filter::Fixture;
    use serde_json::Value;

    fn call(id: Option<u32>, tool: &str) -> String {
        let id = id.map(|i| format!(r#""id":{i},"#)).unwrap_or_default();
        format!(
            r#"{{"jsonrpc":"2.0",{id}"method":"tools/call","params":{{"name":"{tool}","arguments":{{"sender":"mallory"}}}}}}"#
        )
    }

    /// What the policy decides for `body` POSTed to `target` (a legacy
    /// POST names `session`), with the exchange as it leaves it.
    fn decide(f: &Fixture, target: &str, body: &str, session: Option<&[u8]>) -> (Refusal, Exchange) {
        let ctx = f.ctx();
        let mut ex = Fixture::post(target, body.as_bytes());
        ex.plan_upstream(&ctx).unwrap();
        let tool = hidden_call(&ex.body, &ex.plan, ctx.policy).expect("a hidden call");
        assert_eq!(tool, "chat_rules");
        let refusal = ex.refuse_hidden(7, &ctx, &tool, session);
        (refusal, ex)
    }

    fn ids(errors: &[Vec<u8>]) -> Vec<Value> {
        errors
            .iter()
            .filter(|e| !e.is_empty())
            .map(|e| serde_json::from_slice::<Value>(e).unwrap()["id"].clone())
            .collect()
    }

    #[test]
    fn a_hidden_tools_call_is_refused_in_every_shape_of_body_and_transport() {
        let f = Fixture::new(&["--deny-tool", "chat_rules"]);
        let (hidden, kept) = (call(Some(1), "chat_rules"), call(Some(2), "chat_send"));
        // No hidden call at all: nothing to decide.
        let ctx = f.ctx();
        let mut ex = Fixture::post("/mcp", kept.as_bytes());
        ex.plan_upstream(&ctx).unwrap();
        assert_eq!(hidden_call(&ex.body, &ex.plan, ctx.policy), None);

        // Streamable HTTP: one call is answered with its id; a notification
        // gets 202 and nothing is forwarded.
        assert!(matches!(decide(&f, "/mcp", &hidden, None).0, Refusal::Reply(Answer::HiddenTool)));
        assert!(matches!(
            decide(&f, "/mcp", &call(None, "chat_rules"), None).0,
            Refusal::Accepted(Answer::HiddenTool)
        ));
        // A batch of hidden calls only: answered whole.
        let all_hidden = format!("[{hidden},{}]", call(Some(3), "chat_rules"));
        assert!(matches!(decide(&f, "/mcp", &all_hidden, None).0, Refusal::Reply(Answer::HiddenTool)));
        // A batch with a call kept: the rest goes on, stamped, and the
        // errors wait for the upstream's answer, with their ids.
        for batch in [format!("[{hidden},{kept}]"), format!("[{kept},{hidden}]")] {
            let (refusal, ex) = decide(&f, "/mcp", &batch, None);
            assert!(matches!(refusal, Refusal::Forward), "{batch}");
            let sent: Vec<u8> = ex.plan.parts(&ex.body).flatten().copied().collect();
            let sent: Value = serde_json::from_slice(&sent).unwrap();
            let sent = sent.as_array().unwrap();
            assert_eq!(sent.len(), 1, "{sent:?}");
            assert_eq!(
                (sent[0]["id"].clone(), sent[0]["params"]["arguments"]["sender"].clone()),
                (2.into(), "claude".into())
            );
            assert_eq!(ids(&ex.policy.batch_errors), vec![Value::from(1)], "{batch}");
        }

        // Legacy SSE: the errors travel on the session's stream when it is
        // relayed here (the POST gets 202, or the upstream's answer to the
        // rest); when it is not, the POST gets 403 and nothing is sent.
        let target = "/messages/?session_id=abc";
        assert!(matches!(
            decide(&f, target, &hidden, Some(b"abc")).0,
            Refusal::Reply(Answer::HiddenToolLegacy)
        ));
        f.legacy.borrow_mut().open(b"abc"[..].into(), 40);
        let (refusal, ex) = decide(&f, target, &hidden, Some(b"abc"));
        assert!(matches!(refusal, Refusal::Accepted(Answer::HiddenTool)));
        assert!(ex.policy.batch_errors.is_empty());
        let owed = f.legacy.borrow_mut().take(40).expect("the error is owed to the stream");
        let events = String::from_utf8(owed.events).unwrap();
        assert!(
            events.starts_with("event: message\r\ndata: ") || events.starts_with("event: message\ndata: "),
            "{events:?}"
        );
        assert!(events.contains(r#""id":1"#) && events.contains("Unknown tool"), "{events:?}");
        let (refusal, ex) = decide(&f, target, &format!("[{hidden},{kept}]"), Some(b"abc"));
        assert!(matches!(refusal, Refusal::Forward));
        assert!(ex.policy.batch_errors.is_empty(), "the errors went on the stream, not into the answer");
        assert!(f.legacy.borrow_mut().take(40).is_some_and(|o| !o.events.is_empty()));
    }

    #[test]
    fn a_tools_list_is_kept_for_the_filter_or_refused_where_no_filter_can_reach_it() {
        let list = r#"[{"jsonrpc":"2.0","id":"a","method":"tools/list"},{"jsonrpc":"2.0","id":9,"method":"tools/list"}]"#;
        let decide = |f: &Fixture, target: &str| {
            let ctx = f.ctx();
            let mut ex = Fixture::post(target, list.as_bytes());
            ex.plan_upstream(&ctx).unwrap();
            let refusal = ex.request_policy(7, &ctx);
            (refusal, ex.policy.list_request.map(|ids| ids.iter().map(|i| i.to_vec()).collect::<Vec<_>>()))
        };
        // Nothing hidden and nothing to learn from: relayed as it is.
        let open = Fixture::new(&["--no-default-stamps", "--show-identity-params"]);
        assert!(matches!(decide(&open, "/mcp"), (Refusal::Forward, None)));
        // Under a policy that hides a tool the answer's ids are kept, as sent.
        let f = Fixture::new(&["--deny-tool", "chat_rules"]);
        let (refusal, ids) = decide(&f, "/mcp");
        assert!(matches!(refusal, Refusal::Forward));
        assert_eq!(ids, Some(vec![br#""a""#.to_vec(), b"9".to_vec()]));
        // Legacy SSE: the session's stream expects the answers, or, not
        // relayed here, the list is refused.
        let target = "/messages/?session_id=abc";
        assert!(matches!(decide(&f, target), (Refusal::Reply(Answer::ListUnfiltered), None)));
        f.legacy.borrow_mut().open(b"abc"[..].into(), 40);
        assert!(matches!(decide(&f, target), (Refusal::Forward, None)));
        let owed = f.legacy.borrow_mut().take(40).expect("the stream expects the lists");
        assert_eq!(owed.lists, vec![br#""a""#.to_vec().into_boxed_slice(), b"9".to_vec().into_boxed_slice()]);
    }
}

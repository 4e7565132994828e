//! The tool policy of an exchange, at its fixed points. At the request
//! (`request.rs`, once the body is whole and stamped): a `tools/call` of a
//! tool the policy hides is answered by the proxy (a batch's hidden calls
//! each in its place, the rest forwarded), and the ids of the `tools/list`
//! requests whose answers are filtered are kept. At the response head
//! (`response.rs`): the stages of the response's rewrite, a `tools/list`
//! answer's filter and a batch answer's completion. After the rewrite: what
//! its stages reported (learned stamps, lists not rewritten), and a legacy
//! stream's turn (the lists and errors POSTs owe it).

use super::answer::Answer;
use super::client_out::{BodyRewriter, Stage};
use super::exchange::Exchange;
use super::{Conn, Ctx};
use crate::http::framing::Framing;
use crate::http::head::ResponseHead;
use crate::http::headers::name;
use crate::mcp::initialize::Format;
use crate::mcp::rpc;
use crate::mcp::stamp::Plan;
use crate::mcp::tools::{split_batch, Policy as ToolPolicy};
use crate::mcp::tools::{BatchAnswer, ListFilter, ListHandling, ListOptions};
use log::debug;
use log::warn;
use smallvec::SmallVec;

/// The first `tools/call` of the body (a message or a batch) of a tool the
/// policy hides, from the calls the stamp scan noted: the tool's decoded
/// name, its first 64 bytes (at a character boundary: it goes in a log
/// line, and the client chose it).
pub(super) fn hidden_call(body: &[u8], plan: &Plan, policy: &ToolPolicy) -> Option<String> {
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
/// message, or a batch's); `None` when it has none.
pub(super) fn tools_list_ids(body: &[u8]) -> Option<Box<[Box<[u8]>]>> {
    let parsed = rpc::parse(body).ok()?;
    let ids: Vec<Box<[u8]>> = parsed
        .messages()
        .iter()
        .filter(|m| m.role() == rpc::Role::Request && m.is_method(rpc::TOOLS_LIST))
        .map(|m| m.id().json().into())
        .collect();
    (!ids.is_empty()).then(|| ids.into())
}

impl Conn {
    /// A `tools/call` of a tool the policy hides, answered by the proxy
    /// (a batch: each of its hidden calls; the rest, if any, goes on):
    /// on streamable HTTP in the POST's answer (200 with MCP's unknown-tool
    /// error and the request's id; a batch's errors join the upstream's
    /// answer). On legacy SSE (`session`) answers travel on the session's
    /// GET stream: the errors go there as `message` events and the POST
    /// gets 202 (or the upstream's answer to the rest); when that stream is
    /// not relayed here, the whole POST gets 403 with the errors. Returns
    /// whether the request goes on upstream.
    pub(super) fn refuse_hidden(&mut self, ctx: &Ctx, tool: &str, session: Option<&[u8]>) -> bool {
        let code = Answer::HiddenTool.jsonrpc_code();
        let message = Answer::HiddenTool.message();
        let split = split_batch(&self.ex.body, ctx.policy, code, &message);
        let errors = match &split {
            Some(s) => s.errors.clone(),
            None => {
                // A notification gets no error (empty): it is owed no answer.
                let mut e = Vec::new();
                let parsed = rpc::parse(&self.ex.body).ok();
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
                self.id
            );
            self.queue_answer(ctx, 202, b"", Answer::HiddenTool);
            return false;
        }
        if let Some(session) = session {
            if !ctx.legacy.borrow().has(session) {
                warn!(
                    "conn {}: tools/call of {tool:?}, which the tool policy hides: answered by the proxy (403: the legacy SSE stream is not relayed here)",
                    self.id
                );
                self.reply_error(ctx, Answer::HiddenToolLegacy);
                return false;
            }
            let mut routes = ctx.legacy.borrow_mut();
            let sent = errors.iter().filter(|e| !e.is_empty()).all(|e| routes.send(session, e));
            drop(routes);
            if !sent {
                warn!(
                    "conn {}: legacy SSE stream owes too much: the proxy's error for {tool:?} dropped",
                    self.id
                );
            }
        }
        let Some(rest) = rest else {
            warn!(
                "conn {}: tools/call of {tool:?}, which the tool policy hides: answered by the proxy",
                self.id
            );
            match session {
                Some(_) => self.queue_answer(ctx, 202, b"", Answer::HiddenTool),
                None => self.reply_error(ctx, Answer::HiddenTool),
            }
            return false;
        };
        warn!(
            "conn {}: tools/call of {tool:?} in a batch, which the tool policy hides: {} answered by the proxy, {} forwarded",
            self.id,
            errors.len(),
            rest.kept
        );
        self.ex.body = rest.forward;
        if let Err(e) = self.ex.plan_upstream(ctx) {
            warn!("conn {}: request body refused: {e}", self.id);
            self.reply_error(ctx, Answer::BodyRefused(e));
            return false;
        }
        if session.is_none() {
            self.ex.policy.batch_errors = errors;
        }
        true
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
    pub(super) fn list_filter(&self, resp: &ResponseHead, ctx: &Ctx) -> Option<ListFilter> {
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
    pub(super) fn batch_answer(&mut self, resp: &mut ResponseHead, conn: u64) -> Option<BatchAnswer> {
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
pub(super) fn rewriter_finished(conn: u64, finished: Option<Box<BodyRewriter>>, ctx: &Ctx) {
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
pub(super) fn legacy_turn(conn: u64, rewriter: &mut Option<Box<BodyRewriter>>, ctx: &Ctx) {
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

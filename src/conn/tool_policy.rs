//! The tool policy at the request: a `tools/call` of a tool the policy
//! hides is answered by the proxy (a batch's hidden calls each in its
//! place, the rest forwarded), and the ids of the `tools/list` requests
//! whose answers the relay filters. Called by `request.rs` once the body is
//! whole and stamped.

use super::answer::Answer;
use super::{Conn, Ctx};
use crate::mcp::rpc;
use crate::mcp::stamp::Plan;
use crate::mcp::tools::{split_batch, Policy as ToolPolicy};
use log::warn;

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
        if let Err(e) = self.plan_upstream_request(ctx) {
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

//! MCP session bookkeeping on the relay path (MCP Session Management): the
//! sessions seen created through this proxy are recorded, so that an
//! upstream restart under one of them gets an answer the session survives.

use super::reopen::VersionCapture;
use super::{Conn, Ctx};
use crate::http::head::ResponseHead;
use crate::mcp::rpc;
use log::debug;

impl Conn {
    /// On a response head: a session is created by a 200 to an `initialize`
    /// POST without a session id that carries one `Mcp-Session-Id` (a
    /// second, different one is refused by the parser); the client's DELETE
    /// is the only signal that a session really ended, whatever the upstream
    /// answered.
    /// Returns the capture that reads the chosen `protocolVersion` from the
    /// body of a recorded `initialize`'s answer as it is relayed.
    pub(super) fn note_session(&self, resp: &ResponseHead, ctx: &Ctx) -> Option<VersionCapture> {
        let ex = &self.ex;
        let mut table = ctx.sessions.borrow_mut();
        match ex.method.as_slice() {
            b"DELETE" if !ex.session_id.is_empty() => {
                table.forget(&ex.session_id);
            }
            b"POST" if ex.session_id.is_empty() && resp.status == 200 => {
                let id = resp.headers.get(b"mcp-session-id")?;
                let Ok(body) = rpc::parse(&ex.body) else { return None };
                let init = body.single().filter(|m| m.is_method(rpc::INITIALIZE))?;
                // What a replay needs: end-to-end fields without the
                // credentials (the identity current at replay time is used).
                let fields = ex.headers.iter().map(|h| (h.name(), h.value())).filter(|(name, _)| {
                    !matches!(*name, b"authorization" | b"x-agent-token" | b"host" | b"content-length")
                });
                table.expire(ctx.now);
                match table.record(id, &ex.body, fields, "", ctx.now) {
                    Ok(()) => {
                        debug!("conn {}: MCP session recorded", self.id);
                        let content_type = resp.headers.get(b"content-type").unwrap_or_default();
                        return VersionCapture::new(id, init.id().json(), content_type);
                    }
                    Err(why) => debug!("conn {}: MCP session not tracked: {why:?}", self.id),
                }
            }
            b"POST"
                if ex.in_session
                    && rpc::parse(&ex.body).is_ok_and(|b| b.find_method(rpc::INITIALIZED).is_some()) =>
            {
                table.note_initialized(&ex.session_id, ctx.now);
            }
            _ => {}
        }
        None
    }
}

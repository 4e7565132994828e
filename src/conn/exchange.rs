//! The current request/response pair, and each feature's state for it: one
//! value per feature (its time and byte counts, its session, the tool
//! policy's, the audit's, the recovery's), reset together when an exchange
//! starts. The vectors are reused across exchanges on one connection.

use std::time::Instant;

use smallvec::SmallVec;

use super::filter::{AuditState, PolicyState, SessionState};
use super::reattach::Reattach;
use super::reopen::Reopen;
use crate::http::head::RequestHead;
use crate::http::headers::name;
use crate::mcp::stamp::Plan;

#[derive(Default)]
pub(super) struct Exchange {
    /// The request head, parsed in place (reused from one request to the
    /// next): method, target, version and framing as the client sent them;
    /// its fields are edited into what goes upstream.
    pub(super) req: RequestHead,
    /// The Host the client used (for `Location` rewriting).
    pub(super) client_host: SmallVec<[u8; 32]>,
    /// The rewritten request head for the upstream.
    pub(super) head_out: Vec<u8>,
    /// The whole request body (de-chunked), read before anything is sent.
    pub(super) body: Vec<u8>,
    /// The whole body has been read (so its ids can be read).
    pub(super) body_read: bool,
    /// The response relayed is an event stream.
    pub(super) event_stream: bool,
    /// When it started, what it was answered, how much of it.
    pub(super) meter: Meter,
    /// Splices that put the agent's name into the body.
    pub(super) plan: Plan,
    pub(super) session: SessionState,
    pub(super) policy: PolicyState,
    pub(super) audit: AuditState,
    pub(super) recovery: Recovery,
}

impl Exchange {
    /// May be sent again after a stale pooled connection failed (RFC 9110
    /// §9.2.2).
    pub(super) fn idempotent(&self) -> bool {
        matches!(self.req.method.as_slice(), b"GET" | b"HEAD" | b"OPTIONS" | b"DELETE" | b"PUT")
    }

    /// The request body as JSON-RPC, for the answers the proxy makes with
    /// its requests' ids: from the stamp scan's envelope, else parsed (a
    /// body the scan refused).
    pub(super) fn request_body(&self) -> Option<crate::mcp::rpc::Body<'_>> {
        self.plan.rpc_body(&self.body).or_else(|| crate::mcp::rpc::parse(&self.body).ok())
    }

    /// A new exchange on the connection, its head in `req`, begins `now`:
    /// its Host and session id are taken from the head, and what the last
    /// exchange left is cleared (its buffers kept).
    pub(super) fn begin(&mut self, now: Instant) {
        let headers = &self.req.headers;
        self.client_host = SmallVec::from_slice(headers.get_name(name::HOST).unwrap_or_default());
        self.session.begin(headers.get_name(name::MCP_SESSION_ID).unwrap_or_default());
        self.body.clear();
        // Not the last exchange's spans: until this body is scanned, the
        // readers of the envelope parse it (`request_body`).
        self.plan.forget_envelope();
        self.body_read = false;
        self.event_stream = false;
        self.meter = Meter { start: Some(now), status: 0, bytes_out: 0 };
        self.policy.begin();
        self.audit.begin();
        self.recovery = Recovery::default();
    }
}

/// What the access log and the records count of an exchange.
#[derive(Default)]
pub(super) struct Meter {
    pub(super) start: Option<Instant>,
    pub(super) status: u16,
    pub(super) bytes_out: u64,
}

/// What may send the exchange again or hold it open while the upstream
/// comes back.
#[derive(Default)]
pub(super) struct Recovery {
    /// A stale pooled connection was already replaced once.
    pub(super) retried: bool,
    /// The credential source's token generation the request was planned
    /// under (`Ctx::token_generation`).
    pub(super) token_generation: u64,
    /// The re-initialisation of this exchange's session, once its upstream
    /// answered 404.
    pub(super) reopen: Option<Box<Reopen>>,
    /// A session's GET stream held open while its upstream comes back.
    pub(super) reattach: Option<Box<Reattach>>,
}

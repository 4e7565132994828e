//! The current request/response pair, and each feature's state for it: one
//! value per feature (its time and byte counts, its session, the tool
//! policy's, the audit's, the recovery's), reset together when an exchange
//! starts. The vectors are reused across exchanges on one connection.

use std::time::Instant;

use smallvec::SmallVec;

use super::audit::ExchangeAudit;
use super::reattach::Reattach;
use super::reopen::Reopen;
use super::session::VersionCapture;
use super::{editor, Ctx};
use crate::http::framing::Framing;
use crate::http::head::RequestHead;
use crate::http::headers::name;
use crate::mcp::stamp::{Plan, StampError};

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

    /// Scans and stamps the body with the identity in force now and writes
    /// the upstream head (`editor::plan_request`).
    pub(super) fn plan_upstream(&mut self, ctx: &Ctx) -> Result<(), StampError> {
        let ex = self;
        let req = editor::Outgoing {
            method: &ex.req.method,
            target: &ex.req.target,
            // The client delimited a body (Content-Length or chunked).
            framed: ex.req.framing != Framing::None,
        };
        let (who, route) = (ctx.credentials(), ctx.route());
        ex.plan = editor::plan_request(&req, &mut ex.req.headers, &ex.body, &who, &route, &mut ex.head_out)?;
        Ok(())
    }

    /// A new exchange on the connection, its head in `req`, begins `now`:
    /// its Host and session id are taken from the head, and what the last
    /// exchange left is cleared (its buffers kept).
    pub(super) fn begin(&mut self, now: Instant) {
        let headers = &self.req.headers;
        self.client_host = SmallVec::from_slice(headers.get_name(name::HOST).unwrap_or_default());
        self.session.id = SmallVec::from_slice(headers.get_name(name::MCP_SESSION_ID).unwrap_or_default());
        self.body.clear();
        self.body_read = false;
        self.event_stream = false;
        self.meter = Meter { start: Some(now), status: 0, bytes_out: 0 };
        self.session.known = false;
        self.session.capture = None;
        self.policy.list_request = None;
        self.policy.batch_errors.clear();
        if let Some(a) = self.audit.current.take() {
            self.audit.spare = Some(a);
        }
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

/// The exchange's MCP session, as its request named it.
#[derive(Default)]
pub(super) struct SessionState {
    /// The client's `Mcp-Session-Id`, as sent (empty: none).
    pub(super) id: SmallVec<[u8; 64]>,
    /// `id` names a session this proxy saw created.
    pub(super) known: bool,
    /// The reading of a recorded `initialize`'s answer as it is relayed,
    /// kept until its `protocolVersion` is found (no copy of the answer).
    pub(super) capture: Option<Box<VersionCapture>>,
}

/// The tool policy's part of the exchange.
#[derive(Default)]
pub(super) struct PolicyState {
    /// The ids (JSON text) of the body's `tools/list` requests, when the
    /// policy rewrites their answers.
    pub(super) list_request: Option<Box<[Box<[u8]>]>>,
    /// The proxy's errors for the hidden calls of a batch whose rest went
    /// upstream: added to the upstream's answer.
    pub(super) batch_errors: Vec<Vec<u8>>,
}

/// The audit's part: the body's requests, for the audit log and the
/// metrics (none when neither is on), and the records made.
#[derive(Default)]
pub(super) struct AuditState {
    pub(super) current: Option<Box<ExchangeAudit>>,
    /// The last exchange's, emptied, for the next one (its allocation and
    /// its buffers are reused).
    pub(super) spare: Option<Box<ExchangeAudit>>,
    /// The connection's records waiting for the loop (kept across
    /// exchanges until the loop reads them).
    pub(super) queue: Vec<crate::obs::audit::Record>,
}

/// What may send the exchange again or hold it open while the upstream
/// comes back.
#[derive(Default)]
pub(super) struct Recovery {
    /// A stale pooled connection was already replaced once.
    pub(super) retried: bool,
    /// The re-initialisation of this exchange's session, once its upstream
    /// answered 404.
    pub(super) reopen: Option<Box<Reopen>>,
    /// A session's GET stream held open while its upstream comes back.
    pub(super) reattach: Option<Box<Reattach>>,
}

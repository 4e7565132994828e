//! A connection's phase and what a drive tells the loop: `Phase` (per-phase
//! data in its variant), `Verdict`, and the readiness seen on a socket.

use super::client_out;
use super::CloseReason;
use crate::http::body::{Decoder, Encoder};
use std::time::Instant;

/// What the loop must do after a drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Wait for readiness or the deadline.
    Wait,
    /// Progress was cut short by the per-event bound: drive again soon.
    Again,
    /// Give this connection an upstream socket (`UpstreamSide::attach`).
    NeedUpstream,
    /// Drop the connection (its reason has been logged).
    Close,
}

/// Readiness seen on a socket since the last WouldBlock (edge-triggered).
#[derive(Clone, Copy, Debug, Default)]
pub struct Ready {
    pub readable: bool,
    pub writable: bool,
    /// The peer's FIN (or an error) was reported: a short read does not
    /// mean drained, the EOF is still to be read.
    pub hup: bool,
}

pub(super) enum Phase {
    ReadHead,
    ReadBody {
        decoder: Decoder,
    },
    Connect {
        attempt: u32,
        retry_at: Option<Instant>,
        since: Instant,
    },
    SendRequest {
        written: usize,
    },
    ReadResponseHead {
        since: Instant,
    },
    /// An upstream answer read whole instead of relayed (a 404 the session
    /// may recover from, or the answer to a request of a re-initialisation):
    /// `upstream_buf` holds it from its head; `at` is how far it was walked.
    Collect {
        input: Decoder,
        at: usize,
    },
    /// A recorded session's GET stream lost its upstream: the client's
    /// response is held open (`reattach`) until `until` at most.
    Hold {
        until: Instant,
    },
    /// Another exchange is re-initialising this one's session.
    AwaitReopen {
        until: Instant,
        next_check: Instant,
    },
    Relay {
        input: Decoder,
        out: Encoder,
        input_done: bool,
        /// Legacy SSE (MCP specification 2024-11-05, Transports, HTTP with
        /// SSE: the server's first event is `endpoint`, the URI the client
        /// must post to): rewrites an absolute upstream URL in it to name
        /// the proxy; dropped once it is done.
        rewriter: Option<Box<client_out::BodyRewriter>>,
    },
    /// A proxy-generated response (or what arrived of a truncated one) is
    /// being flushed; then close or go on.
    Reply {
        close: bool,
        reason: CloseReason,
    },
    /// Our side is shut for writing; unread client bytes are drained so the
    /// kernel does not answer them with a reset that could destroy the
    /// response in flight (lingering close, as nginx does).
    Linger {
        until: Instant,
        reason: CloseReason,
    },
    Closed(CloseReason),
}

impl Phase {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Phase::ReadHead => "read-head",
            Phase::ReadBody { .. } => "read-body",
            Phase::Connect { .. } => "connect",
            Phase::SendRequest { .. } => "send-request",
            Phase::ReadResponseHead { .. } => "read-response-head",
            Phase::Collect { .. } => "collect",
            Phase::Hold { .. } => "hold",
            Phase::AwaitReopen { .. } => "await-reopen",
            Phase::Relay { .. } => "relay",
            Phase::Reply { .. } => "reply",
            Phase::Linger { .. } => "linger",
            Phase::Closed(_) => "closed",
        }
    }
}

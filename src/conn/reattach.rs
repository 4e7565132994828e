//! A recorded session's GET stream outlives an upstream restart. When the
//! upstream goes away under it (the body cut at a chunk boundary: a killed
//! server's socket closes or resets), the client's response is held open,
//! nothing written and no error, while the proxy reaches the upstream
//! again: the GET goes out anew (the session's current upstream id, the
//! identity current now, no `Last-Event-ID`: a restarted server has no
//! events to resume), a 404 re-initialises the session as for any request
//! (`reopen`), and the new stream's body continues the client's one, its
//! chunks passed as before; its head is not relayed (the client has one).
//! Notifications sent after the restart reach the client as if nothing
//! had happened.
//!
//! The hold lasts at most `--restart-grace` plus `STREAM_HOLD_EXTRA`
//! (`limits.rs` says why); past it, or on any answer that cannot continue
//! the stream (not 200, not an event stream, another framing), the stream
//! ends as a cut one does (no last chunk, connection closed), and the
//! client reconnects as it would without the proxy.

use super::{CloseReason, Conn, Ctx, Phase};
use crate::conn::exchange::Exchange;
use crate::http::body::{Decoder, Encoder};
use crate::http::head::ResponseHead;
use crate::http::headers::name;
use crate::limits::STREAM_HOLD_EXTRA;
use log::{info, warn};
use std::fmt;
use std::time::Instant;

/// A GET stream held open while its upstream comes back.
#[derive(Debug)]
pub(super) struct Reattach {
    /// How the client's body is framed: the new stream must be framed the
    /// same way to continue it.
    out: Encoder,
    /// When the stream was lost, and the end of the hold.
    since: Instant,
    pub(super) until: Instant,
}

impl Exchange {
    /// A reattach is under way: the client's response head is out, so no
    /// proxy-made answer can be sent; a failure ends the stream instead.
    pub(super) fn reattaching(&self) -> bool {
        self.recovery.reattach.is_some()
    }

    /// The upstream closed a relayed body before its end: true when it is
    /// a recorded session's GET event stream cut where the client's framing
    /// can go on (between chunks), so it is held instead of cut.
    pub(super) fn may_hold_stream(&self, input: &Decoder, out: Encoder, ctx: &Ctx) -> bool {
        self.event_stream
            && self.meter.status == 200
            && self.req.method.as_slice() == b"GET"
            && out == (Encoder::PassThrough { chunked: true })
            && input.at_chunk_boundary()
            && !ctx.shutting_down
            && !self.session.id.is_empty()
            && ctx.sessions.borrow().get(&self.session.id).is_some()
    }
}

impl Conn {
    /// Holds the client's stream open (`Phase::Hold`) once what arrived of
    /// the old one is written.
    pub(super) fn hold_stream(&mut self, out: Encoder, ctx: &Ctx) {
        let until = ctx.now + ctx.config.restart_grace + STREAM_HOLD_EXTRA;
        info!(
            "conn {}: upstream closed a session's GET stream: held open for up to {} s while it comes back",
            self.id,
            (until - ctx.now).as_secs()
        );
        self.upstream.reusable = false;
        self.upstream.spend();
        self.ex.recovery.reattach = Some(Box::new(Reattach { out, since: ctx.now, until }));
        self.set_phase(Phase::Hold { until });
    }

    /// `Phase::Hold`: once the old stream's bytes are written, the GET goes
    /// out again.
    pub(super) fn hold(&mut self, ctx: &Ctx) -> bool {
        if self.out.pending() || !self.out.holds_no_upstream_bytes() {
            return false;
        }
        // What is left is a cut chunk-size line at most: never the client's.
        self.upstream_buf.clear();
        let upstream_id = ctx.sessions.borrow().get(&self.ex.session.id).map(|s| s.upstream_id().to_vec());
        let Some(upstream_id) = upstream_id else {
            self.end_held_stream(ctx, &"the session was deleted meanwhile");
            return true;
        };
        let ex = &mut self.ex;
        if ex.req.headers.set_name(name::MCP_SESSION_ID, &upstream_id).is_err() {
            self.end_held_stream(ctx, &"session id not usable in a header");
            return true;
        }
        ex.req.headers.remove_name(name::LAST_EVENT_ID);
        // A fresh chance to re-initialise the session, and no pooled
        // socket (after a restart the pool holds the old server's).
        ex.recovery.reopen = None;
        ex.recovery.retried = false;
        if self.ex.plan_upstream(ctx).is_err() {
            // Cannot happen: a GET has no body to refuse.
            self.end_held_stream(ctx, &"request refused");
            return true;
        }
        self.set_phase(Phase::Connect { attempt: 0, retry_at: None, since: ctx.now });
        true
    }

    /// The upstream's answer to the GET sent again: continue the client's
    /// body with the new stream's, or end it.
    pub(super) fn reattach_relay(&mut self, resp: &ResponseHead, ctx: &Ctx) {
        let Some(held) = self.ex.recovery.reattach.take() else { return };
        let out = Encoder::for_response(resp.framing, self.ex.req.http10, false);
        if resp.status != 200 || !super::editor::is_event_stream(&resp.headers) || out != held.out {
            self.ex.recovery.reattach = Some(held);
            let why =
                format!("the GET sent again was answered {} and cannot continue the stream", resp.status);
            self.end_held_stream(ctx, &why);
            return;
        }
        info!(
            "conn {}: session GET stream reattached after {} ms",
            self.id,
            ctx.now.saturating_duration_since(held.since).as_millis()
        );
        self.upstream.reusable = resp.keep_alive;
        let input = Decoder::new(resp.framing);
        let input_done = input.is_done();
        self.set_phase(Phase::Relay { input, out, input_done, rewriter: None });
    }

    /// The upstream cannot be reached again (or the stream cannot go on):
    /// the held stream ends as a cut one, without its last chunk.
    pub(super) fn end_held_stream(&mut self, ctx: &Ctx, why: &dyn fmt::Display) {
        let held_ms = self
            .ex
            .recovery
            .reattach
            .take()
            .map_or(0, |r| ctx.now.saturating_duration_since(r.since).as_millis());
        warn!("conn {}: session GET stream not reattached after {held_ms} ms ({why}): ended", self.id);
        self.upstream.reusable = false;
        self.upstream.spend();
        self.out.drop_upstream_bytes();
        self.upstream_buf.clear();
        self.log_exchange(
            ctx.now,
            &"upstream closed mid-body, not reattached",
            super::filter::audit::End::Cut,
        );
        self.set_phase(Phase::Reply { close: true, reason: CloseReason::UpstreamTruncated });
    }

    /// A connect (or the connection before an answer) failed during a
    /// reattach: try again shortly until the hold is over.
    pub(super) fn reattach_retry(&mut self, ctx: &Ctx, attempt: u32) {
        self.upstream.spend();
        let retry_at = ctx.now + crate::limits::CONNECT_RETRY_DELAY;
        match self.ex.recovery.reattach.as_deref().map(|r| r.until) {
            Some(until) if retry_at <= until => {
                self.upstream_buf.clear();
                self.set_phase(Phase::Connect {
                    attempt: attempt + 1,
                    retry_at: Some(retry_at),
                    since: ctx.now,
                });
            }
            _ => self.end_held_stream(ctx, &"upstream unreachable"),
        }
    }
}

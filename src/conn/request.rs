//! The client-to-upstream direction: read the request head and body from
//! the client, admit, scan and stamp it, and write it to the upstream.

use super::answer::Answer;
use super::filter::audit::End;
use super::filter::policy::Refusal;
use super::{fill_from, CloseReason, Conn, Ctx, Phase};
use crate::http::body::{BodyError, Decoder};
use crate::http::framing::Framing;
use crate::http::guard::{self, Policy};
use crate::http::head;
use crate::io::{slices_after, write_vectored, SocketState};
use crate::limits::{MAX_REQUEST_HEAD, MAX_STAMP_BODY};
use crate::mcp::stamp::Plan;
use log::{debug, warn};
use std::time::{Duration, Instant};

/// How long a closing connection drains unread client bytes.
const LINGER: Duration = Duration::from_secs(2);

/// RFC 9110 §10.1.1: a client that sent `Expect: 100-continue` waits for
/// this before its body.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

impl Conn {
    /// Shut our sending side and drain the client for a moment before the
    /// socket is dropped.
    pub(super) fn linger(&mut self, now: Instant, reason: CloseReason) {
        self.upstream.release(now);
        self.client.shutdown_write();
        self.client_buf.clear();
        self.set_phase(Phase::Linger { until: now + LINGER, reason });
    }

    pub(super) fn drain_client(&mut self) -> bool {
        let Phase::Linger { reason, .. } = self.phase else {
            return false;
        };
        loop {
            self.client_buf.clear();
            let (n, gone) = self.read_client();
            if gone {
                self.close(reason);
                return true;
            }
            if n == 0 {
                return false;
            }
        }
    }

    /// Read from the client into `client_buf`; returns (bytes, eof/error).
    pub(super) fn read_client(&mut self) -> (usize, bool) {
        fill_from(&mut self.client, &mut self.client_ready, &mut self.client_buf)
    }

    /// During connect/response phases: notice a client that went away.
    pub(super) fn watch_client(&mut self) -> bool {
        if !self.client_ready.readable || !self.client_buf.has_space() {
            return false;
        }
        let (n, gone) = self.read_client();
        if gone {
            debug!("conn {}: client went away mid-exchange", self.id);
            self.ex.meter.status = 499;
            self.log_exchange(Instant::now(), &CloseReason::ClientClosed, End::Cut);
            self.close(CloseReason::ClientClosed);
            return true;
        }
        n > 0
    }

    pub(super) fn read_head(&mut self, ctx: &Ctx) -> bool {
        let mut progressed = false;
        if !self.client_buf.is_empty() && head::may_be_complete(self.client_buf.data(), self.scanned) {
            return self.parse_head(ctx);
        }
        self.scanned = self.client_buf.len();
        if self.client_ready.readable && !self.client_buf.has_space() && !self.client_buf.grow() {
            // Full at MAX_REQUEST_HEAD without a complete head.
            return self.parse_head(ctx);
        }
        let (n, gone) = self.read_client();
        if n > 0 {
            progressed = true;
            self.last_activity = ctx.now;
            self.request_started.get_or_insert(ctx.now);
            if head::may_be_complete(self.client_buf.data(), self.scanned)
                || self.client_buf.len() >= MAX_REQUEST_HEAD
            {
                return self.parse_head(ctx);
            }
            self.scanned = self.client_buf.len();
        }
        if gone {
            let reason =
                if self.client_buf.is_empty() { CloseReason::ClientClosed } else { CloseReason::ClientError };
            self.close(reason);
            return true;
        }
        if self.client_buf.is_empty() {
            self.client_buf.release_if_empty();
            self.upstream_buf.release_if_empty();
        }
        progressed
    }

    pub(super) fn parse_head(&mut self, ctx: &Ctx) -> bool {
        match head::parse_request_into(self.client_buf.data(), &mut self.ex.req) {
            Ok(false) => {
                self.scanned = self.client_buf.len();
                false
            }
            Ok(true) => {
                self.client_buf.consume(self.ex.req.len);
                self.scanned = 0;
                self.start_exchange(ctx);
                true
            }
            Err(e) => {
                warn!("conn {} ({}): bad request: {e}", self.id, self.peer);
                // Nothing of the bad head is logged as the exchange's.
                self.ex.req.method.clear();
                self.ex.req.target.clear();
                self.client_buf.clear();
                self.reply_error(ctx, Answer::BadHead(e));
                true
            }
        }
    }

    /// The head in `ex.req` is whole: admit it, then read its body.
    pub(super) fn start_exchange(&mut self, ctx: &Ctx) {
        let ex = &mut self.ex;
        ex.begin(ctx.now);
        let req = &ex.req;
        if !req.keep_alive || ctx.shutting_down {
            self.close_after = true;
        }
        let policy = Policy {
            listen_port: ctx.listen_port,
            client_token: ctx.config.client_token.as_ref().map(|t| t.as_bytes()),
            allow_origins: &ctx.config.allow_origins,
        };
        // A pipe is written by the stdio front-end only: no browser, no
        // other process, nothing for the guard to keep out.
        let admitted = match self.client {
            super::ClientSock::Pipe(_) => Ok(()),
            super::ClientSock::Tcp(_) => guard::admission(req, &policy),
        };
        if let Err(refusal) = admitted {
            warn!("conn {} ({}): refused: {}", self.id, self.peer, refusal.message());
            self.reply_error(ctx, Answer::Refused(refusal));
            return;
        }
        if let Framing::Length(n) = req.framing {
            // Refused before a byte of it is read.
            if n > MAX_STAMP_BODY as u64 {
                warn!("conn {}: request body of {n} bytes refused", self.id);
                self.reply_error(ctx, Answer::BodyTooLarge);
                return;
            }
        }
        if req.expect_continue && req.framing != Framing::None {
            self.out.own().extend_from_slice(CONTINUE);
        }
        // Every body is read whole before anything goes upstream, so that
        // all of it is scanned (`editor::plan_request` states the rule).
        match Decoder::for_request(req.framing) {
            Some(decoder) => self.set_phase(Phase::ReadBody { decoder }),
            None => self.finish_request_head(ctx),
        }
    }

    /// The request is whole: scan and stamp its body, apply the current
    /// identity and write the upstream head, then go to Connect.
    pub(super) fn finish_request_head(&mut self, ctx: &Ctx) {
        self.request_started = None;
        self.ex.body_read = true;
        self.ex.session_at_request(ctx);
        if let Err(e) = self.ex.plan_upstream(ctx) {
            // Fail closed: never forwarded unstamped.
            warn!("conn {}: request body refused: {e}", self.id);
            self.ex.plan = Plan::default();
            if ctx.observing() {
                self.ex.audit_request(self.id, ctx.agent, ctx.policy);
            }
            self.reply_error(ctx, Answer::BodyRefused(e));
            return;
        }
        if ctx.observing() {
            self.ex.audit_request(self.id, ctx.agent, ctx.policy);
        }
        match self.ex.request_policy(self.id, ctx) {
            Refusal::Forward => {}
            Refusal::Accepted(answer) => return self.queue_answer(ctx, 202, b"", answer),
            Refusal::Reply(answer) => return self.reply_error(ctx, answer),
        }
        self.set_phase(Phase::Connect { attempt: 0, retry_at: None, since: ctx.now });
    }

    pub(super) fn read_body(&mut self, ctx: &Ctx) -> bool {
        let Phase::ReadBody { decoder } = &mut self.phase else {
            return false;
        };
        let mut progressed = false;
        if !self.client_buf.is_empty() {
            match decoder.read_bounded(self.client_buf.data(), &mut self.ex.body, MAX_STAMP_BODY) {
                Ok(n) => {
                    self.client_buf.consume(n);
                    progressed = n > 0;
                }
                Err(e) => {
                    let answer = match e {
                        BodyError::Malformed(e) => {
                            warn!("conn {}: bad chunked request body: {e}", self.id);
                            Answer::MalformedBody
                        }
                        BodyError::TooLarge => {
                            warn!("conn {}: request body over {MAX_STAMP_BODY} bytes refused", self.id);
                            Answer::BodyTooLarge
                        }
                    };
                    self.reply_error(ctx, answer);
                    return true;
                }
            }
        }
        if decoder.is_done() {
            self.finish_request_head(ctx);
            return true;
        }
        let (n, gone) = self.read_client();
        if n > 0 {
            self.last_activity = ctx.now;
            progressed = true;
        }
        if gone && n == 0 {
            self.ex.meter.status = 499;
            self.log_exchange(ctx.now, &CloseReason::ClientClosed, End::Cut);
            self.close(CloseReason::ClientClosed);
            return true;
        }
        progressed
    }

    pub(super) fn send_request(&mut self, ctx: &Ctx) -> bool {
        let Phase::SendRequest { written } = &mut self.phase else {
            return false;
        };
        let Some(u) = self.upstream.sock.as_mut() else {
            return false;
        };
        let mut progressed = false;
        let mut lost = false;
        // [head, body before splice, splice, body after, ...]: one vectored
        // write; the body is never copied.
        let mut parts: smallvec::SmallVec<[&[u8]; 8]> = smallvec::SmallVec::new();
        if let Some(replay) = self.ex.recovery.reopen.as_deref().and_then(|r| r.replay_bytes()) {
            // A request of the proxy's own, during a re-initialisation.
            parts.push(replay);
        } else {
            parts.push(self.ex.head_out.as_slice());
            parts.extend(self.ex.plan.parts(&self.ex.body));
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        // TLS: the records of the last bytes may still wait in rustls; the
        // request is sent once they are out.
        while (*written < total || u.stream.pending_output()) && u.ready.writable {
            let slices = slices_after::<8>(&parts, *written);
            let (n, outcome) = write_vectored(&mut u.stream, &slices);
            *written += n;
            progressed |= n > 0;
            match outcome {
                SocketState::Open => {}
                SocketState::WouldBlock => u.ready.writable = false,
                SocketState::Closed | SocketState::Error(_) => {
                    lost = true;
                    break;
                }
            }
        }
        let done = *written >= total && !u.stream.pending_output();
        drop(parts);
        if lost {
            self.upstream_lost_before_response(ctx);
            return true;
        }
        if progressed {
            self.last_activity = ctx.now;
        }
        if done {
            self.set_phase(Phase::ReadResponseHead { since: ctx.now });
            return true;
        }
        progressed
    }
}

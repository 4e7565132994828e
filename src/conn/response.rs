//! The upstream-to-client direction: read the response head, relay the
//! body (re-framed when it must be), and write the client output queue.

use super::answer::Answer;
use super::client_out::{BodyRewriter, Stage};
use super::filter::audit::End;
use super::filter::policy::{legacy_turn, rewriter_finished};
use super::{editor, CloseReason, Conn, Ctx, Phase};
use crate::buf::Buf;
use crate::http::body::{Decoder, Encoder};
use crate::http::framing::Framing;
use crate::http::head::{self, ResponseHead};
use crate::http::headers::name;
use crate::http::write;
use crate::io::{slices_after, write_vectored, SocketState};
use crate::mcp::initialize::Format;
use crate::mcp::legacy::LegacyStream;
use crate::mcp::sse::EndpointRewriter;
use crate::mcp::tools::ListHandling;
use log::{debug, warn};
use std::time::Instant;

pub(super) use super::client_out::ClientOut;

impl ClientOut {
    /// One vectored write of `own[pos..]` then the passed bytes; returns
    /// (bytes written, of which passed, outcome).
    fn write_to(&mut self, sock: &mut super::ClientSock, upstream: &mut Buf) -> (usize, usize, SocketState) {
        self.check(upstream);
        let (n, outcome) = {
            let own = self.own.get(self.pos..).unwrap_or_default();
            let passed = upstream.data().get(..self.pass).unwrap_or_default();
            let slices = slices_after::<2>(&[own, passed], 0);
            write_vectored(sock, &slices)
        };
        let pass_n = self.written(n);
        if pass_n > 0 {
            upstream.consume(pass_n);
        }
        (n, pass_n, outcome)
    }

    fn check(&self, upstream: &Buf) {
        debug_assert!(self.pos <= self.own.len(), "client output cursor past its bytes");
        debug_assert!(
            self.pass + self.skip <= upstream.len(),
            "client output owes more than the upstream buffer holds"
        );
        debug_assert!(self.pos == 0 || self.pos < self.own.len(), "written proxy bytes not released");
    }
}

impl Conn {
    /// Write the client output queue, one vectored write per round.
    pub(super) fn flush_client(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        while self.out.pending() && self.client_ready.writable {
            let (n, pass_n, outcome) = self.out.write_to(&mut self.client, &mut self.upstream_buf);
            self.ex.meter.bytes_out += pass_n as u64;
            if n > 0 {
                progressed = true;
                self.last_activity = now;
            }
            match outcome {
                SocketState::Open => {}
                SocketState::WouldBlock => self.client_ready.writable = false,
                SocketState::Closed | SocketState::Error(_) => {
                    self.log_exchange(now, &CloseReason::ClientClosed, End::Cut);
                    self.close(CloseReason::ClientClosed);
                    return true;
                }
            }
        }
        let skipped = self.out.settle();
        if skipped > 0 {
            self.upstream_buf.consume(skipped);
        }
        progressed || skipped > 0
    }

    pub(super) fn read_response_head(&mut self, ctx: &Ctx) -> bool {
        if !self.upstream_buf.has_space() {
            self.upstream_buf.grow();
        }
        let (n, eof) = self.upstream.read(&mut self.upstream_buf, &self.out);
        let mut progressed = n > 0;
        if n > 0 {
            self.last_activity = ctx.now;
        }
        loop {
            if self.upstream_buf.is_empty() {
                break;
            }
            let head_request = self.ex.req.method.as_slice() == b"HEAD";
            // Nothing called below borrows it again (`Ctx::response_head`);
            // it is given back before the relay starts.
            let mut resp = ctx.response_head.borrow_mut();
            match head::parse_response_into(self.upstream_buf.data(), head_request, &mut resp) {
                Ok(true) if resp.is_interim() => {
                    // 100 Continue and 103 Early Hints are interim (RFC
                    // 9110 §15.2: the final response follows them) and are
                    // not relayed; 101 cannot happen: Upgrade is never
                    // forwarded.
                    self.upstream_buf.consume(resp.len);
                    if resp.status == 101 {
                        warn!("conn {}: upstream switched protocols unasked", self.id);
                        self.reply_error(ctx, Answer::BadUpstream);
                        return true;
                    }
                    progressed = true;
                }
                Ok(true) => {
                    if ctx.observing {
                        ctx.obs.borrow_mut().health.answered(ctx.now);
                    }
                    if self.reopen_takes(&resp, ctx) {
                        return true;
                    }
                    self.upstream_buf.consume(resp.len);
                    self.start_relay(&mut resp, ctx);
                    drop(resp);
                    // Classify the body bytes already here so that head and
                    // body leave in one write.
                    self.relay(ctx);
                    return true;
                }
                Ok(false) => {
                    if !self.upstream_buf.has_space() && !self.upstream_buf.grow() {
                        warn!("conn {}: upstream response head too large", self.id);
                        self.reply_error(ctx, Answer::BadUpstream);
                        return true;
                    }
                    break;
                }
                Err(e) => {
                    warn!("conn {}: invalid upstream response: {e}", self.id);
                    self.reply_error(ctx, Answer::BadUpstream);
                    return true;
                }
            }
        }
        if eof {
            self.upstream_lost_before_response(ctx);
            return true;
        }
        progressed
    }

    pub(super) fn start_relay(&mut self, resp: &mut ResponseHead, ctx: &Ctx) {
        if self.ex.reattaching() {
            // The client has its head: the new stream continues its body.
            self.reattach_relay(resp, ctx);
            return;
        }
        self.ex.session_at_response(self.id, resp, ctx);
        if ctx.observing() {
            self.ex.audit_session(resp);
        }
        let http10 = self.ex.req.http10;
        let sse = editor::is_event_stream(&resp.headers);
        self.ex.event_stream = sse;
        // Legacy SSE (MCP specification 2024-11-05, Transports, HTTP with
        // SSE): the first event of a GET stream, `endpoint`, may announce an
        // absolute upstream URL. Only bodies that can carry events qualify,
        // and not a streamable HTTP session's GET (it names its session;
        // a legacy one cannot), whose body passes as it came.
        let rewrite = sse
            && self.ex.req.method.as_slice() == b"GET"
            && self.ex.session.id.is_empty()
            && resp.status == 200
            && resp.framing != Framing::None
            && !self.ex.client_host.is_empty();
        if let Some(a) = self.ex.audit.current.as_mut() {
            let format = resp.headers.get_name(name::CONTENT_TYPE).and_then(Format::from_content_type);
            a.answer_format(format.unwrap_or(Format::Json));
        }
        let list = self.ex.list_filter(resp, ctx);
        let batch = self.ex.batch_answer(resp, self.id);
        let input = Decoder::new(resp.framing);
        let out = Encoder::for_response(resp.framing, http10, rewrite || list.is_some() || batch.is_some());
        // The stages of the payload's rewrite, in order: a batch's lists
        // filtered, then its hidden calls' errors added; else a legacy
        // stream's endpoint (and, under a tool policy, what POSTs owe it).
        // Nothing is built when nothing rewrites (most responses).
        let rewriter = (list.is_some() || batch.is_some() || rewrite).then(|| {
            let mut rw = Box::new(BodyRewriter::default());
            rw.push_all(list.map(Stage::List).into_iter().chain(batch.map(Stage::Batch)));
            if rw.is_empty() {
                let authority = ctx.config.upstream.authority.as_bytes();
                let endpoint = EndpointRewriter::for_upstream(
                    ctx.config.upstream.https,
                    authority,
                    &self.ex.client_host,
                );
                // Under a tool policy a legacy stream carries the answers to
                // filter (lists) and to add (refused calls) of POSTs made on
                // other connections.
                let policy = !ctx.policy.allows_all()
                    || ctx.policy.list_handling(ctx.stamps, ctx.stamps.learn_room()) != ListHandling::Relay;
                rw.push_all([match policy {
                    true => Stage::Legacy(Box::new(LegacyStream::new(endpoint))),
                    false => Stage::Endpoint(endpoint),
                }]);
            }
            rw
        });
        self.upstream.reusable = resp.keep_alive;
        if out == Encoder::CloseDelimited {
            self.close_after = true;
        }
        editor::edit_response_from(
            ctx.config.upstream.https,
            &mut resp.headers,
            ctx.config.upstream.authority.as_bytes(),
            &self.ex.client_host,
        );
        let field = out.field(resp.framing, resp.advertised_length);
        write::response_head(
            &mut self.out.own,
            resp.status,
            &resp.reason,
            &resp.headers,
            field,
            self.close_after,
        );
        self.ex.meter.status = resp.status;
        if resp.status == 401 {
            ctx.unauthorized.set(true);
        }
        if let Some(a) = self.ex.audit.current.as_mut() {
            a.relayed(resp.status);
        }
        let input_done = input.is_done();
        if input_done {
            // An empty body: the relay loop never runs, so what a rewriter
            // makes of nothing and the last chunk of a body the proxy
            // frames itself (an empty Content-Length event stream re-framed
            // as chunks for the rewrite) are queued here.
            let (n, finished) = self.out.finish_empty(out, rewriter);
            self.ex.meter.bytes_out += n;
            rewriter_finished(self.id, finished, ctx);
            self.set_phase(Phase::Relay { input, out, input_done, rewriter: None });
        } else {
            self.set_phase(Phase::Relay { input, out, input_done, rewriter });
        }
    }

    pub(super) fn relay(&mut self, ctx: &Ctx) -> bool {
        let Phase::Relay { input_done, .. } = &self.phase else { return false };
        let (mut n, mut eof) = (0, false);
        if !*input_done {
            (n, eof) = self.upstream.read(&mut self.upstream_buf, &self.out);
        }
        let mut progressed = n > 0;
        if n > 0 {
            self.last_activity = ctx.now;
        }
        let Phase::Relay { mut input, out, mut input_done, mut rewriter } = self.take_phase() else {
            return progressed;
        };
        // Why the body was cut short, if it was.
        let mut cut: Option<&'static str> = None;
        // Classify the unread bytes: pass them, copy them re-framed, or drop
        // them (`ClientOut::classify`, the step the tests and the fuzz
        // target drive).
        // What POSTs owe a legacy stream is taken before its bytes are
        // read: a list's id is noted before the list can arrive.
        if rewriter.as_deref_mut().and_then(BodyRewriter::legacy).is_some() {
            legacy_turn(self.id, &mut rewriter, ctx);
        }
        let id = self.id;
        let capture = &mut self.ex.session.capture;
        let audit = &mut self.ex.audit.current;
        let c = self.out.classify(self.upstream_buf.data(), &mut input, out, &mut rewriter, |data| {
            // Copied (never altered): a recorded initialize's answer.
            super::filter::session::feed_capture(capture, Some(data), ctx.sessions, id);
            if let Some(a) = audit.as_mut() {
                a.feed(data);
            }
        });
        if c.consumed > 0 {
            self.upstream_buf.consume(c.consumed);
        }
        self.ex.meter.bytes_out += c.own_payload;
        rewriter_finished(self.id, c.finished, ctx);
        progressed |= c.progressed;
        if rewriter.as_deref_mut().and_then(BodyRewriter::legacy).is_some() {
            legacy_turn(self.id, &mut rewriter, ctx);
            let n = self.out.idle(out, &mut rewriter);
            self.ex.meter.bytes_out += n;
            progressed |= n > 0;
        }
        if let Some(e) = c.error {
            warn!("conn {}: invalid chunked body from upstream: {e}", self.id);
            cut = Some("invalid chunked body from upstream");
        }
        if input.is_done() && !input_done {
            input_done = true;
            super::filter::session::feed_capture(&mut self.ex.session.capture, None, ctx.sessions, self.id);
        }
        if eof {
            self.upstream.spend();
            if input.until_close() && self.upstream_buf.len() == self.out.pass {
                input_done = true;
                let (n, finished) = self.out.finish_until_close(out, &mut rewriter);
                self.ex.meter.bytes_out += n;
                rewriter_finished(self.id, finished, ctx);
                progressed = true;
            } else if !input_done {
                debug!("conn {}: upstream closed mid-body", self.id);
                cut = cut.or(Some("upstream closed mid-body"));
            }
        }
        if eof && input_done {
            // A close-delimited body ends here.
            super::filter::session::feed_capture(&mut self.ex.session.capture, None, ctx.sessions, self.id);
        }
        if let Some(ending) = cut {
            super::filter::session::feed_capture(&mut self.ex.session.capture, None, ctx.sessions, self.id);
            if eof && rewriter.is_none() && self.ex.may_hold_stream(&input, out, ctx) {
                // A session's GET stream whose upstream went away: held
                // open for the upstream to come back (`reattach`).
                self.hold_stream(out, ctx);
                return true;
            }
            // Headers are gone already: the only honest signal left is to
            // flush what arrived and close without a terminating chunk
            // (RFC 9112 §8: a chunked body without its zero-size last chunk
            // is incomplete, so a truncated body is never presented as
            // complete).
            self.upstream.reusable = false;
            self.upstream.spend();
            self.log_exchange(ctx.now, &ending, End::Cut);
            self.put_back(Phase::Relay { input, out, input_done, rewriter });
            self.set_phase(Phase::Reply { close: true, reason: CloseReason::UpstreamTruncated });
            return true;
        }
        self.put_back(Phase::Relay { input, out, input_done, rewriter });
        progressed |= self.flush_client(ctx.now);
        if input_done && !self.out.pending() && self.out.holds_no_upstream_bytes() {
            if let Phase::Relay { .. } = self.phase {
                self.finish_exchange(ctx);
                return true;
            }
        }
        // A quiet stream holds no buffer: memory per open SSE stream is the
        // connection struct, not two 16 KiB buffers (the relay bench holds
        // it to 16 KiB per idle stream).
        let upstream_idle = self.upstream.sock.as_ref().is_some_and(|u| !u.ready.readable);
        if upstream_idle && self.out.holds_no_upstream_bytes() {
            self.upstream_buf.release_if_empty();
        }
        if !self.client_ready.readable {
            self.client_buf.release_if_empty();
        }
        progressed
    }

    #[inline]
    pub(super) fn finish_exchange(&mut self, ctx: &Ctx) {
        self.log_exchange(ctx.now, &"complete", End::Relayed);
        let reusable = self.upstream.reusable && self.upstream_buf.is_empty() && !ctx.shutting_down;
        match self.upstream.sock.as_mut() {
            Some(u) if reusable && !self.close_after => {
                // Keep it for this client's next request.
                u.reused = true;
                u.received = false;
                self.upstream.idle_since = Some(ctx.now);
            }
            Some(_) => self.upstream.hand_back(reusable),
            None => {}
        }
        self.upstream_buf.clear();
        if self.close_after {
            self.linger(ctx.now, CloseReason::Done);
        } else {
            self.next_exchange(ctx.now);
        }
    }
}

//! The upstream socket of an exchange: connect (with retries), attach a
//! fresh or pooled socket, what is handed back to the loop (`Released`),
//! whether an idle one may be reused (`idle_usable`), and what a connect or
//! a connection lost before any answer leads to.

use super::answer::Answer;
use super::{Conn, Ctx, Phase, Ready};
use crate::limits::{CONNECT_RETRIES, CONNECT_RETRY_DELAY, POOL_IDLE_TIMEOUT};
use crate::transport::{Handshake, Transport};
use log::{debug, warn};
use std::time::Instant;

/// An upstream socket handed back to the event loop, and what to do with it.
#[derive(Debug)]
pub enum Released {
    /// Idle, healthy and between exchanges: to the keep-alive pool.
    Reusable(Transport),
    /// Anything else (cut, failed, owed to a dead server): deregister and
    /// close.
    Spent(Transport),
}

/// The one test of whether an idle upstream connection may carry another
/// request: it has idled less than `POOL_IDLE_TIMEOUT` (below uvicorn's
/// 5 s keep-alive, so the upstream rarely closes one about to be used) and
/// has said nothing since its last exchange (`spoke`, asked only for a
/// fresh one: readable or closed, as its readiness or a peek tells; an idle
/// HTTP/1.1 connection has nothing to say, so EOF or data means the
/// upstream closed it or broke framing). Used for the socket a client
/// keeps between its exchanges and for the shared pool alike.
pub fn idle_usable(idle_since: Instant, now: Instant, spoke: impl FnOnce() -> bool) -> bool {
    now.saturating_duration_since(idle_since) < POOL_IDLE_TIMEOUT && !spoke()
}

pub(super) struct UpstreamSock {
    pub(super) stream: Transport,
    pub(super) ready: Ready,
    /// The TCP connect completed (a TLS handshake may still be under way:
    /// the phase stays `Connect` until it is done).
    pub(super) connected: bool,
    /// Taken from the keep-alive pool (may have been closed by the peer).
    pub(super) reused: bool,
    /// Any response byte received on it for this exchange.
    pub(super) received: bool,
}

impl Conn {
    /// Record readiness from an event on the upstream socket.
    pub fn upstream_event(&mut self, readable: bool, writable: bool, hup: bool) {
        if let Some(u) = self.upstream.as_mut() {
            u.ready.readable |= readable;
            u.ready.writable |= writable;
            u.ready.hup |= hup;
        }
    }

    /// The upstream socket the loop must deregister and pool or drop.
    pub fn take_released(&mut self) -> Option<Released> {
        self.released.take()
    }

    /// Index into the upstream's addresses for the next connect.
    pub fn connect_attempt(&self) -> u32 {
        match self.phase {
            Phase::Connect { attempt, .. } => attempt,
            _ => 0,
        }
    }

    /// Whether a pooled connection may be used (not after a stale one failed).
    pub fn may_use_pool(&self) -> bool {
        !self.ex.recovery.retried
            && !self.ex.recovery.reopen.as_deref().is_some_and(|r| r.avoids_pool())
            && !self.ex.reattaching()
    }

    /// Hand over an upstream socket: fresh (connecting) or from the pool.
    pub fn attach_upstream(&mut self, stream: Transport, reused: bool) {
        if !reused {
            // Pooled sockets already have it: one syscall less per request.
            let _ = stream.tcp().set_nodelay(true);
        }
        self.upstream = Some(UpstreamSock {
            stream,
            ready: Ready { readable: reused, writable: reused, hup: false },
            connected: reused,
            reused,
            received: false,
        });
    }

    /// The loop could not even start a connect (e.g. out of descriptors).
    pub fn connect_failed(&mut self, ctx: &Ctx, err: &std::io::Error) {
        debug!("conn {}: upstream connect failed: {}", self.id, err.kind());
        self.upstream_connect_error(ctx);
    }

    /// A TLS connection could not even be set up (rustls refused it).
    pub fn tls_setup_failed(&mut self, ctx: &Ctx, why: &str) {
        if matches!(self.phase, Phase::Connect { .. }) {
            self.upstream_tls_failed(ctx, why);
        }
    }

    pub(super) fn connect_progress(&mut self, ctx: &Ctx) -> bool {
        if self.upstream_idle_since.is_some() {
            // The socket kept from the previous exchange: usable unless the
            // upstream spoke or closed meanwhile, or it idled too long.
            let usable = self.kept_upstream_usable(ctx.now);
            self.upstream_idle_since = None;
            if !usable {
                self.drop_upstream();
                return true;
            }
        }
        let Some(u) = self.upstream.as_mut() else {
            return false;
        };
        if !u.connected {
            if !u.ready.writable && !u.ready.readable {
                return false;
            }
            if let Ok(Some(_)) | Err(_) = u.stream.tcp().take_error() {
                self.upstream_connect_error(ctx);
                return true;
            }
            match u.stream.tcp().peer_addr() {
                Ok(_) => {
                    u.connected = true;
                    if ctx.observing {
                        ctx.obs.borrow_mut().health.reached(ctx.now);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotConnected => {
                    u.ready = Ready::default();
                    return false;
                }
                Err(_) => {
                    self.upstream_connect_error(ctx);
                    return true;
                }
            }
        }
        // TLS: the handshake, within the connect's deadline (a plain
        // socket is done at once).
        match u.stream.handshake(&mut u.ready.readable, &mut u.ready.writable) {
            Handshake::Done => {}
            Handshake::Wait => return false,
            Handshake::Failed => {
                let why = u.stream.tls_failure().unwrap_or_default();
                self.upstream_tls_failed(ctx, &why);
                return true;
            }
        }
        self.last_activity = ctx.now;
        self.set_phase(Phase::SendRequest { written: 0 });
        true
    }

    /// A connect was refused or failed: retry shortly (nothing was sent, so
    /// retrying is safe for every method), then 502.
    pub(super) fn upstream_connect_error(&mut self, ctx: &Ctx) {
        ctx.connect_failed.set(true);
        self.drop_upstream();
        if ctx.observing {
            ctx.obs.borrow_mut().health.unreachable(ctx.now);
        }
        let Phase::Connect { attempt, since, .. } = self.phase else {
            return;
        };
        if self.ex.reattaching() {
            self.reattach_retry(ctx, attempt);
            return;
        }
        let retry_at = ctx.now + CONNECT_RETRY_DELAY;
        // In a recorded session a refused connect is most likely a restart:
        // keep trying for the grace, then answer so the session survives.
        let in_grace = self.ex.session.known && retry_at <= since + ctx.config.restart_grace;
        if attempt < CONNECT_RETRIES || in_grace {
            self.set_phase(Phase::Connect { attempt: attempt + 1, retry_at: Some(retry_at), since });
        } else if self.ex.session.known {
            self.answer_outage(ctx);
        } else {
            warn!("conn {}: upstream unreachable after {} attempts", self.id, attempt + 1);
            self.reply_error(ctx, Answer::UpstreamUnreachable);
        }
    }

    /// A TLS connection to the upstream failed (handshake refused or not
    /// done in time, an alert, a record rustls refused): the answer a
    /// request gets for an unreachable upstream, at once (a bad
    /// certificate does not get better by retrying), with one warn line
    /// naming the reason and the host.
    pub(super) fn upstream_tls_failed(&mut self, ctx: &Ctx, why: &str) {
        let host = ctx.config.upstream.authority.as_str();
        warn!("conn {}: TLS with upstream {host} failed: {why}", self.id);
        ctx.connect_failed.set(true);
        self.drop_upstream();
        if ctx.observing {
            ctx.obs.borrow_mut().health.unreachable(ctx.now);
        }
        if self.ex.session.known {
            self.answer_outage_as(ctx, Answer::UpstreamTls);
        } else {
            self.reply_error(ctx, Answer::UpstreamTls);
        }
    }

    /// The upstream connection failed before any response byte. A stale
    /// pooled connection is replaced once for idempotent requests; a POST
    /// whose bytes were written is never replayed (RFC 9110 §9.2.2: a proxy
    /// must not retry a non-idempotent request automatically).
    pub(super) fn upstream_lost_before_response(&mut self, ctx: &Ctx) {
        if self.ex.reattaching() {
            // Reset before an answer: the upstream is not back yet.
            self.reattach_retry(ctx, 0);
            return;
        }
        if let Some(why) = self.upstream.as_ref().and_then(|u| u.stream.tls_failure()) {
            // An alert after the handshake (TLS 1.3: a refused client
            // certificate shows on the first read) or a refused record.
            self.upstream_tls_failed(ctx, &why);
            return;
        }
        let stale = self.upstream.as_ref().is_some_and(|u| u.reused && !u.received);
        self.drop_upstream();
        if stale && !self.ex.recovery.retried && self.ex.idempotent() {
            debug!("conn {}: pooled upstream connection was stale; reconnecting", self.id);
            self.ex.recovery.retried = true;
            self.upstream_buf.clear();
            self.set_phase(Phase::Connect { attempt: 0, retry_at: None, since: ctx.now });
            return;
        }
        if self.ex.session.known {
            // Reset before any byte of a response: the upstream died under
            // the request. It is not sent again (it may have been
            // processed); the answer keeps the session alive.
            self.answer_outage(ctx);
            return;
        }
        warn!("conn {}: upstream closed the connection before answering", self.id);
        self.reply_error(ctx, Answer::UpstreamClosed);
    }
}

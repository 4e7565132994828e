//! The upstream socket of an exchange: connect (with retries), attach a
//! fresh or pooled socket, what is handed back to the loop (`Released`),
//! whether an idle one may be reused (`idle_usable`), and what a connect or
//! a connection lost before any answer leads to.

use super::answer::Answer;
use super::response::ClientOut;
use super::{fill_from, Conn, Ctx, Phase, Ready};
use crate::buf::Buf;
use crate::limits::{CONNECT_RETRIES, CONNECT_RETRY_DELAY, POOL_IDLE_TIMEOUT};
use crate::transport::{Handshake, ProxyFailure, Transport};
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

/// The upstream side of a connection: the socket of the current exchange
/// (or the one kept idle for this client's next request), and the socket
/// the loop must take back.
#[derive(Default)]
pub struct UpstreamSide {
    pub(super) sock: Option<UpstreamSock>,
    /// An upstream socket the loop must take back (reusable or not).
    released: Option<Released>,
    /// The upstream allows its connection to be reused after this response.
    pub(super) reusable: bool,
    /// The socket is kept, idle, for this client's next request (since
    /// when): no trip through the pool, no epoll_ctl, no probe.
    pub(super) idle_since: Option<Instant>,
}

impl UpstreamSide {
    /// Record readiness from an event on the upstream socket.
    pub fn event(&mut self, readable: bool, writable: bool, hup: bool) {
        if let Some(u) = self.sock.as_mut() {
            u.ready.readable |= readable;
            u.ready.writable |= writable;
            u.ready.hup |= hup;
        }
    }

    /// The upstream socket the loop must deregister and pool or drop.
    pub fn take_released(&mut self) -> Option<Released> {
        self.released.take()
    }

    /// Hand over an upstream socket: fresh (connecting) or from the pool.
    pub fn attach(&mut self, stream: Transport, reused: bool) {
        if !reused {
            // Pooled sockets already have it: one syscall less per request.
            let _ = stream.tcp().set_nodelay(true);
        }
        self.sock = Some(UpstreamSock {
            stream,
            ready: Ready { readable: reused, writable: reused, hup: false },
            connected: reused,
            reused,
            received: false,
        });
    }

    /// A socket is attached (connecting, connected or kept idle).
    pub(super) fn attached(&self) -> bool {
        self.sock.is_some()
    }

    /// The TCP connect of the attached socket completed.
    pub(super) fn connected(&self) -> bool {
        self.sock.as_ref().is_some_and(|u| u.connected)
    }

    /// Connected to the forward proxy, its `CONNECT` not answered yet.
    pub(super) fn in_tunnel_setup(&self) -> bool {
        self.sock.as_ref().is_some_and(|u| u.connected && u.stream.in_tunnel_setup())
    }

    /// The forward proxy's `host:port`, while its tunnel is being opened.
    pub(super) fn proxy_name(&self) -> Option<&str> {
        self.sock.as_ref().and_then(|u| u.stream.proxy_name())
    }

    /// Hands the socket (if any) back to be closed.
    pub(super) fn spend(&mut self) {
        if let Some(u) = self.sock.take() {
            self.released = Some(Released::Spent(u.stream));
        }
    }

    /// Hands the socket back, to the pool when `reusable`.
    pub(super) fn hand_back(&mut self, reusable: bool) {
        if let Some(u) = self.sock.take() {
            self.released =
                Some(if reusable { Released::Reusable(u.stream) } else { Released::Spent(u.stream) });
        }
    }

    /// Whether the socket kept idle from this client's previous exchange
    /// may carry the next one (see `idle_usable`).
    pub(super) fn kept_usable(&mut self, now: Instant) -> bool {
        match (self.idle_since, self.sock.as_mut()) {
            (Some(since), Some(u)) => {
                idle_usable(since, now, || u.stream.idle_spoke(Some(u.ready.readable || u.ready.hup)))
            }
            _ => false,
        }
    }

    /// Hands the socket back to the loop: to the pool if it sits idle and
    /// healthy between exchanges, else to be closed.
    pub(super) fn release(&mut self, now: Instant) {
        let healthy = self.kept_usable(now);
        self.idle_since = None;
        self.hand_back(healthy);
    }

    /// The socket kept idle spoke or closed (a TLS record without data, a
    /// session ticket, that left it drained is not speaking).
    pub(super) fn idle_closed(&mut self) -> bool {
        self.idle_since.is_some()
            && self.sock.as_mut().is_some_and(|u| {
                (u.ready.readable || u.ready.hup) && {
                    let spoke = u.stream.idle_spoke(Some(true));
                    u.ready.readable &= spoke;
                    spoke
                }
            })
    }

    /// Read into `buf`; returns (bytes, eof/error). A read that fills all
    /// the room while nothing waits for the client (`out`) grows the
    /// buffer for the next one (fewer syscalls on busy streams; a quiet
    /// stream gives it back).
    pub(super) fn read(&mut self, buf: &mut Buf, out: &ClientOut) -> (usize, bool) {
        let Some(u) = self.sock.as_mut() else {
            return (0, false);
        };
        if !buf.has_space() && !out.pending() {
            buf.grow();
        }
        let (total, eof) = fill_from(&mut u.stream, &mut u.ready, buf);
        if total > 0 {
            u.received = true;
        }
        (total, eof)
    }
}

impl Conn {
    /// The upstream side, for the loop: readiness, sockets attached and
    /// taken back.
    pub fn upstream(&mut self) -> &mut UpstreamSide {
        &mut self.upstream
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

    pub(super) fn connect_progress(&mut self, ctx: &Ctx) -> bool {
        if self.upstream.idle_since.is_some() {
            // The socket kept from the previous exchange: usable unless the
            // upstream spoke or closed meanwhile, or it idled too long.
            let usable = self.upstream.kept_usable(ctx.now);
            self.upstream.idle_since = None;
            if !usable {
                self.upstream.spend();
                return true;
            }
        }
        let Some(u) = self.upstream.sock.as_mut() else {
            return false;
        };
        if !u.connected {
            if !u.ready.writable && !u.ready.readable {
                return false;
            }
            if let Ok(Some(_)) | Err(_) = u.stream.tcp().take_error() {
                self.connect_failed(ctx, None);
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
                    self.connect_failed(ctx, None);
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
                if let Some((why, proxy)) = u.stream.proxy_failure() {
                    let proxy = proxy.to_string();
                    self.proxy_failed(ctx, why, &proxy);
                    return true;
                }
                let why = u.stream.tls_failure().unwrap_or_default();
                self.tls_failed(ctx, &why);
                return true;
            }
        }
        self.last_activity = ctx.now;
        if ctx.token_expired && !self.ex.recovery.reopen.as_deref().is_some_and(|r| r.replaying()) {
            // Never sent under a token past its expiry: it waits for the
            // renewal in flight (up to --connect-timeout), the connection
            // back in the pool meanwhile.
            if ctx.renewable && self.ex.recovery.reopen.is_none() {
                self.await_renewal(ctx);
                return true;
            }
            warn!("conn {}: the token has expired and was not renewed: the request is not sent", self.id);
            self.upstream.spend();
            self.answer_outage(ctx, Answer::CredentialExpired);
            return true;
        }
        self.set_phase(Phase::SendRequest { written: 0 });
        true
    }

    /// A connect was refused or failed (`err`: the loop could not even
    /// start one, e.g. out of descriptors): retry shortly (nothing was sent, so
    /// retrying is safe for every method), then 502.
    pub fn connect_failed(&mut self, ctx: &Ctx, err: Option<&std::io::Error>) {
        if let Some(err) = err {
            debug!("conn {}: upstream connect failed: {}", self.id, err.kind());
        }
        ctx.connect_failed.set(true);
        self.upstream.spend();
        if ctx.observing {
            ctx.obs.borrow_mut().health.unreachable(ctx.now);
        }
        let Phase::Connect { attempt, since, .. } = self.phase else {
            return;
        };
        if self.connect_again(ctx, attempt, since) {
            return;
        }
        if self.ex.session.known {
            self.answer_outage(ctx, Answer::UpstreamUnavailable);
        } else {
            match ctx.config.upstream.tunnel.as_deref() {
                Some(t) => warn!(
                    "conn {}: forward proxy {} unreachable after {} attempts",
                    self.id,
                    t.proxy,
                    attempt + 1
                ),
                None => warn!("conn {}: upstream unreachable after {} attempts", self.id, attempt + 1),
            }
            self.reply_error(ctx, Answer::UpstreamUnreachable);
        }
    }

    /// After a connect that reached no upstream (attempt `attempt` of an
    /// exchange that began connecting at `since`): `true` when it is tried
    /// again (a reattach's own retry, or a short delay while attempts are
    /// left; in a recorded session a refused connect is most likely a
    /// restart, so for the restart grace), `false` when it is time to answer.
    fn connect_again(&mut self, ctx: &Ctx, attempt: u32, since: Instant) -> bool {
        if self.ex.reattaching() {
            self.reattach_retry(ctx, attempt);
            return true;
        }
        let retry_at = ctx.now + CONNECT_RETRY_DELAY;
        let in_grace = self.ex.session.known && retry_at <= since + ctx.config.restart_grace;
        if attempt < CONNECT_RETRIES || in_grace {
            self.set_phase(Phase::Connect { attempt: attempt + 1, retry_at: Some(retry_at), since });
            return true;
        }
        false
    }

    /// The forward proxy did not open the tunnel (`why`; `proxy`: its
    /// `host:port`). A 502, 503 or 504 says the proxy could not reach the
    /// upstream: retried as a refused connect is (a restart behind the
    /// proxy; in a recorded session for the restart grace). Anything else
    /// (407, 403, a close, a stall, garbage) is answered at once. The
    /// answer is the unreachable-upstream one, with one warn line naming
    /// the proxy and what it did (never a credential).
    pub fn proxy_failed(&mut self, ctx: &Ctx, why: ProxyFailure, proxy: &str) {
        self.upstream.spend();
        if ctx.observing {
            ctx.obs.borrow_mut().health.unreachable(ctx.now);
        }
        let Phase::Connect { attempt, since, .. } = self.phase else {
            return;
        };
        if why.upstream_unreachable() && self.connect_again(ctx, attempt, since) {
            debug!("conn {}: forward proxy {proxy} {why}: retrying", self.id);
            return;
        }
        let upstream = ctx.config.upstream.authority.as_str();
        warn!("conn {}: forward proxy {proxy} {why} (tunnel to upstream {upstream})", self.id);
        if self.ex.session.known {
            self.answer_outage(ctx, Answer::UpstreamProxy);
        } else {
            self.reply_error(ctx, Answer::UpstreamProxy);
        }
    }

    /// A TLS connection to the upstream failed (handshake refused or not
    /// done in time, an alert, a record rustls refused): the answer a
    /// request gets for an unreachable upstream, at once (a bad
    /// certificate does not get better by retrying), with one warn line
    /// naming the reason and the host. The loop calls it when rustls
    /// refuses to set up a connection at all.
    pub fn tls_failed(&mut self, ctx: &Ctx, why: &str) {
        let host = ctx.config.upstream.authority.as_str();
        match ctx.config.upstream.tunnel.as_deref() {
            Some(t) => warn!(
                "conn {}: TLS with upstream {host} through forward proxy {} failed: {why}",
                self.id, t.proxy
            ),
            None => warn!("conn {}: TLS with upstream {host} failed: {why}", self.id),
        }
        ctx.connect_failed.set(true);
        self.upstream.spend();
        if ctx.observing {
            ctx.obs.borrow_mut().health.unreachable(ctx.now);
        }
        if self.ex.session.known {
            self.answer_outage(ctx, Answer::UpstreamTls);
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
        if let Some(why) = self.upstream.sock.as_ref().and_then(|u| u.stream.tls_failure()) {
            // An alert after the handshake (TLS 1.3: a refused client
            // certificate shows on the first read) or a refused record.
            self.tls_failed(ctx, &why);
            return;
        }
        let stale = self.upstream.sock.as_ref().is_some_and(|u| u.reused && !u.received);
        self.upstream.spend();
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
            self.answer_outage(ctx, Answer::UpstreamUnavailable);
            return;
        }
        warn!("conn {}: upstream closed the connection before answering", self.id);
        self.reply_error(ctx, Answer::UpstreamClosed);
    }
}

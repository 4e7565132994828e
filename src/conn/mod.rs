//! One client connection and the upstream connection of its current
//! exchange. `drive` moves bytes in both directions until nothing more can
//! be done and returns a `Verdict`; the event loop owns `Poll`, the pool and
//! the sockets' registration. A failing connection only closes itself.
//!
//! Phases of one exchange, each holding its own data:
//! `ReadHead -> [ReadBody] -> Connect -> SendRequest -> ReadResponseHead ->
//! Relay -> ReadHead | Linger -> Closed`, plus `Reply` for proxy-made answers
//! (and for what arrived of a truncated response), after which the
//! connection goes on (`ReadHead`) or lingers. A session the upstream lost
//! adds `Collect` (an answer read whole instead of relayed) and
//! `AwaitReopen` (another exchange re-initialises the session) between
//! `ReadResponseHead` and `Connect` (`reopen`); a session's GET stream whose
//! upstream went away goes `Relay -> Hold -> Connect -> ... -> Relay`
//! without a second head (`reattach`). Every change goes through
//! `set_phase`, which logs it at `trace`; a phase taken out to be worked on
//! (`take_phase`) leaves `Closed` behind until it is put back.
//!
//! `request` is the client-to-upstream direction, `response` the
//! upstream-to-client one, `upstream` the upstream side (`UpstreamSide`);
//! `filter` the features called at the exchange's fixed points (identity
//! stamping, the tool policy, session bookkeeping, the audit), each
//! returning what the core carries out; `reopen` the re-initialisation of
//! a lost session (a decision type, `Reopen`, applied in one place),
//! `reattach` a GET stream held through an upstream restart. `client_out`
//! (the client output queue and the relay's classification step), `answer`
//! and `editor` decide without a socket.

mod answer;
pub mod client_sock;
mod ctx;
mod exchange;
mod filter;
mod phase;
pub use answer::CloseReason;
pub mod client_out;
pub mod editor;
mod reattach;
mod reopen;
mod request;
mod response;
mod rewrite;
mod upstream;
#[cfg(test)]
mod upstream_invariant;

use crate::buf::Buf;
use crate::config::Config;
use crate::io::{read_into, SocketState};
use crate::limits::{ANSWER_FLUSH_TIMEOUT, MAX_IO_PER_EVENT, MAX_REQUEST_HEAD};
use answer::Answer;
use client_sock::ClientSock;
pub use ctx::Ctx;
use exchange::Exchange;
use log::{debug, info, trace, warn};
use phase::Phase;
pub use phase::{Ready, Verdict};
use response::ClientOut;
use std::fmt;
use std::io::Read;
use std::mem;
use std::net::SocketAddr;
use std::time::Instant;
pub use upstream::{idle_usable, Released, UpstreamSide};

pub struct Conn {
    id: u64,
    peer: SocketAddr,
    client: ClientSock,
    client_ready: Ready,
    upstream: UpstreamSide,
    client_buf: Buf,
    upstream_buf: Buf,
    /// What is owed to the client: proxy-made bytes, then bytes of
    /// `upstream_buf` passed as they are.
    out: ClientOut,
    phase: Phase,
    ex: Exchange,
    /// The client connection closes once the current exchange is done.
    close_after: bool,
    last_activity: Instant,
    /// The first byte of the current request arrived then: its head and body
    /// must be complete by this plus `--request-timeout`.
    request_started: Option<Instant>,
    /// How far `client_buf` was scanned for the end of a head.
    scanned: usize,
    /// Bytes read from the client and written to it by finished exchanges,
    /// not yet counted by the loop.
    traffic: (u64, u64),
}

impl Conn {
    /// A connection with `client` (a TCP socket from `peer`, or the stdio
    /// front-end's pipe: `ClientSock::pipe`).
    pub fn new(id: u64, client: ClientSock, peer: SocketAddr, now: Instant) -> Conn {
        if let ClientSock::Tcp(s) = &client {
            let _ = s.set_nodelay(true);
        }
        Conn {
            id,
            peer,
            client,
            client_ready: Ready::default(),
            upstream: UpstreamSide::default(),
            client_buf: Buf::new(MAX_REQUEST_HEAD),
            upstream_buf: Buf::new(crate::limits::MAX_RELAY_BUF),
            out: ClientOut::default(),
            phase: Phase::ReadHead,
            ex: Exchange::default(),
            close_after: false,
            last_activity: now,
            request_started: None,
            scanned: 0,
            traffic: (0, 0),
        }
    }

    /// Every phase change goes through here.
    fn set_phase(&mut self, next: Phase) {
        trace!("conn {}: {} -> {}", self.id, self.phase.name(), next.name());
        self.phase = next;
    }

    /// Takes the phase out to work on its data, leaving `Closed` behind: a
    /// path that forgets to put it back closes the connection instead of
    /// leaving it in a live phase.
    fn take_phase(&mut self) -> Phase {
        mem::replace(&mut self.phase, Phase::Closed(CloseReason::PhaseLost))
    }

    /// Puts back a phase taken with `take_phase` (no change of phase).
    fn put_back(&mut self, phase: Phase) {
        debug_assert!(
            matches!(self.phase, Phase::Closed(CloseReason::PhaseLost)),
            "phase put back over a live one"
        );
        self.phase = phase;
    }

    /// An event stream is being relayed (or held) on this connection.
    pub fn is_streaming(&self) -> bool {
        self.ex.event_stream && matches!(self.phase, Phase::Relay { .. } | Phase::Hold { .. })
    }

    /// The connection's id (its log name), unique for the process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Why the connection closed, once it has.
    pub fn close_reason(&self) -> Option<CloseReason> {
        match self.phase {
            Phase::Closed(r) => Some(r),
            _ => None,
        }
    }

    /// What the loop's `Observer` takes after each drive: the bytes read
    /// from the client and written to it since the last call, and the
    /// records waiting, read in place (a request record is some 300 bytes:
    /// not moved out) and cleared by the loop once handed over.
    pub fn observed(&mut self) -> ((u64, u64), &mut Vec<crate::obs::audit::Record>) {
        (std::mem::take(&mut self.traffic), &mut self.ex.audit.queue)
    }

    /// Record readiness from an event on the client socket.
    pub fn client_event(&mut self, readable: bool, writable: bool, hup: bool) {
        self.client_ready.readable |= readable;
        self.client_ready.writable |= writable;
        self.client_ready.hup |= hup;
    }

    /// The earliest instant at which `drive` must run even without events.
    pub fn deadline(&self, config: &Config) -> Option<Instant> {
        match &self.phase {
            // A request under way must be whole by its deadline, however
            // its bytes trickle in; before its first byte the connection is
            // an idle keep-alive one.
            Phase::ReadHead | Phase::ReadBody { .. } => Some(match self.request_started {
                Some(t) => t + config.request_timeout,
                None => self.last_activity + config.keepalive_timeout,
            }),
            Phase::Connect { retry_at: Some(t), .. } => Some(*t),
            Phase::Connect { since, .. } => Some(*since + config.connect_timeout),
            Phase::SendRequest { .. } | Phase::ReadResponseHead { .. } => {
                let since = match &self.phase {
                    Phase::ReadResponseHead { since } => *since,
                    _ => self.last_activity,
                };
                Some(since + config.response_timeout)
            }
            Phase::Collect { .. } => Some(self.last_activity + config.response_timeout),
            Phase::Hold { until } => Some(*until),
            Phase::AwaitReopen { until, next_check } => Some((*until).min(*next_check)),
            Phase::Relay { .. } => Some(self.last_activity + config.idle_timeout),
            Phase::Reply { .. } => Some(self.last_activity + ANSWER_FLUSH_TIMEOUT),
            Phase::Linger { until, .. } => Some(*until),
            Phase::Closed(_) => None,
        }
    }

    fn close(&mut self, reason: CloseReason) {
        debug!("conn {} ({}): closed in {}: {reason}", self.id, self.peer, self.phase.name());
        // The clock is read only for a kept idle socket, whose age decides.
        let now = if self.upstream.idle_since.is_some() { Instant::now() } else { self.last_activity };
        self.upstream.release(now);
        self.set_phase(Phase::Closed(reason));
    }

    /// The exchange's one `info` line, saying how it ended.
    fn log_exchange(&mut self, now: Instant, ending: &dyn fmt::Display, end: filter::audit::End) {
        if self.ex.audit.current.is_some() {
            self.ex.audit_end(now, end);
        }
        if let Some(start) = self.ex.meter.start.take() {
            self.traffic.0 += (self.ex.req.len + self.ex.body.len()) as u64;
            self.traffic.1 += self.ex.meter.bytes_out;
            info!(
                "{} {} -> {} {}B {}ms {ending}",
                String::from_utf8_lossy(&self.ex.req.method),
                String::from_utf8_lossy(&self.ex.req.target),
                self.ex.meter.status,
                self.ex.meter.bytes_out,
                now.saturating_duration_since(start).as_millis()
            );
        }
    }

    /// Move bytes until nothing more can be done now.
    pub fn drive(&mut self, ctx: &Ctx) -> Verdict {
        if let Some(d) = self.deadline(ctx.config) {
            if ctx.now >= d {
                self.on_deadline(ctx);
            }
        }
        if ctx.shutting_down {
            self.close_after = true;
            if matches!(self.phase, Phase::ReadHead) && self.client_buf.is_empty() {
                self.close(CloseReason::Shutdown);
            }
        }
        for _ in 0..MAX_IO_PER_EVENT {
            if let Phase::Closed(_) = self.phase {
                return Verdict::Close;
            }
            let progressed = self.step(ctx);
            if let Phase::Connect { retry_at: None, .. } = self.phase {
                if !self.upstream.attached() {
                    return Verdict::NeedUpstream;
                }
            }
            if !progressed {
                if let Phase::Closed(_) = self.phase {
                    return Verdict::Close;
                }
                self.release_empty_buffers();
                return Verdict::Wait;
            }
        }
        Verdict::Again
    }

    /// A connection that waits holds no empty buffer: while its request is
    /// upstream (most of an exchange's life) its client buffer goes back to
    /// the pool, so the pool covers every connection in flight and a
    /// request costs no 16 KiB allocation and zeroing. An empty buffer holds
    /// nothing that is owed (`ClientOut` passes at most `upstream_buf.len()`
    /// bytes), so releasing it loses nothing.
    fn release_empty_buffers(&mut self) {
        self.client_buf.release_if_empty();
        self.upstream_buf.release_if_empty();
    }

    fn on_deadline(&mut self, ctx: &Ctx) {
        let now = ctx.now;
        match self.phase {
            Phase::ReadHead if self.request_started.is_none() => self.close(CloseReason::ClientIdle),
            Phase::ReadHead | Phase::ReadBody { .. } => {
                warn!("conn {}: request head or body not received in time", self.id);
                self.reply_error(ctx, Answer::RequestTimeout);
            }
            Phase::Connect { retry_at: Some(_), .. } => {
                // The retry delay is over: ask the loop for a socket again.
                if let Phase::Connect { retry_at, .. } = &mut self.phase {
                    *retry_at = None;
                }
            }
            // Connected to the forward proxy, its answer to CONNECT stalled.
            Phase::Connect { retry_at: None, .. } if self.upstream.in_tunnel_setup() => {
                let proxy = self.upstream.proxy_name().unwrap_or_default().to_string();
                self.proxy_failed(ctx, crate::transport::ProxyFailure::Stalled, &proxy);
            }
            // Connected, the TLS handshake stalled: a TLS failure.
            Phase::Connect { retry_at: None, .. } if self.upstream.connected() => {
                self.tls_failed(ctx, "the handshake did not complete within --connect-timeout");
            }
            Phase::Connect { attempt, .. } if self.ex.reattaching() => self.reattach_retry(ctx, attempt),
            Phase::Connect { .. } if self.ex.session.known => {
                self.answer_outage(ctx, Answer::UpstreamUnavailable)
            }
            Phase::Connect { .. } => {
                warn!("conn {}: upstream connect timed out", self.id);
                self.reply_error(ctx, Answer::ConnectTimeout);
            }
            Phase::SendRequest { .. } | Phase::ReadResponseHead { .. } => {
                warn!("conn {}: no response head from upstream in time", self.id);
                self.reply_error(ctx, Answer::UpstreamTimeout);
            }
            Phase::Collect { .. } => {
                warn!("conn {}: upstream answer not received in time", self.id);
                self.collect_failed(ctx);
            }
            Phase::Hold { .. } => self.end_held_stream(ctx, &"the hold is over"),
            Phase::AwaitReopen { .. } => {
                self.await_reopen(ctx);
            }
            Phase::Relay { .. } => {
                self.log_exchange(now, &CloseReason::IdleTimeout, filter::audit::End::Cut);
                self.close(CloseReason::IdleTimeout);
            }
            Phase::Reply { .. } => self.close(CloseReason::ClientError),
            Phase::Linger { reason, .. } => self.close(reason),
            Phase::Closed(_) => {}
        }
    }

    /// One round over both sockets; true if anything moved.
    fn step(&mut self, ctx: &Ctx) -> bool {
        let mut progressed = self.flush_client(ctx.now);
        if let Phase::Closed(_) = self.phase {
            return true;
        }
        if matches!(self.phase, Phase::ReadHead) && self.upstream.idle_closed() {
            // The upstream closed (or broke framing on) the idle socket: let
            // it go at once. (Its age is judged by `idle_usable` when it is
            // next used; reading the clock here cost every round.)
            self.upstream.idle_since = None;
            self.upstream.spend();
        }
        progressed |= match self.phase {
            Phase::ReadHead => self.read_head(ctx),
            Phase::ReadBody { .. } => self.read_body(ctx),
            Phase::Connect { .. } => self.connect_progress(ctx),
            Phase::SendRequest { .. } => self.send_request(ctx),
            Phase::ReadResponseHead { .. } => self.read_response_head(ctx),
            Phase::Collect { .. } => self.collect(ctx),
            Phase::Hold { .. } => self.hold(ctx),
            Phase::AwaitReopen { .. } => self.await_reopen(ctx),
            Phase::Relay { .. } => self.relay(ctx),
            Phase::Reply { close, reason } => {
                if self.out.pending() {
                    false
                } else if close {
                    self.linger(ctx.now, reason);
                    true
                } else {
                    self.next_exchange(ctx.now)
                }
            }
            Phase::Linger { .. } => self.drain_client(),
            Phase::Closed(_) => false,
        };
        // Watch the client while the exchange runs: its EOF aborts the
        // exchange (no one is left to read the answer, and the upstream
        // stream must not outlive it), and pipelined requests wait in
        // client_buf.
        if matches!(
            self.phase,
            Phase::Connect { .. }
                | Phase::ReadResponseHead { .. }
                | Phase::Collect { .. }
                | Phase::Hold { .. }
                | Phase::AwaitReopen { .. }
                | Phase::Relay { .. }
        ) {
            progressed |= self.watch_client();
        }
        progressed
    }

    fn next_exchange(&mut self, now: Instant) -> bool {
        self.set_phase(Phase::ReadHead);
        self.scanned = 0;
        // Pipelined bytes already here start the next request's clock.
        self.request_started = if self.client_buf.is_empty() { None } else { Some(now) };
        self.last_activity = now;
        true
    }
}

/// Read into `buf` until the socket is drained or `buf` is full; returns
/// (bytes, eof/error). With edge-triggered readiness (epoll on Linux, kqueue
/// with EV_CLEAR on macOS) a short read means the kernel buffer is empty and
/// a new arrival raises a new event, so it ends the loop without the extra
/// read that would only say WouldBlock, unless the peer's FIN was reported
/// and still has to be read. mio's Windows backend re-arms a socket only
/// after a read returned WouldBlock, so there every loop ends in WouldBlock
/// (else a keep-alive request, a large body or a stream stalls).
pub(super) fn fill_from(stream: &mut impl Read, ready: &mut Ready, buf: &mut Buf) -> (usize, bool) {
    let mut total = 0;
    while ready.readable {
        let space = buf.space();
        let room = space.len();
        if room == 0 {
            break;
        }
        let (n, outcome) = read_into(stream, space);
        buf.fill(n);
        total += n;
        match outcome {
            SocketState::Open if n < room && !ready.hup && cfg!(not(windows)) => ready.readable = false,
            SocketState::Open => {}
            SocketState::WouldBlock => ready.readable = false,
            SocketState::Closed | SocketState::Error(_) => return (total, true),
        }
    }
    (total, false)
}

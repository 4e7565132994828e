//! One client connection and the upstream connection of its current
//! exchange. `drive` moves bytes in both directions until nothing more can
//! be done and returns a `Verdict`; the event loop owns `Poll`, the pool and
//! the sockets' registration. A failing connection only closes itself.
//!
//! Phases of one exchange (`mem::replace` + `match` for every transition):
//! `ReadHead -> [ReadBody] -> Connect -> SendRequest -> ReadResponseHead ->
//! Relay -> ReadHead | Closing`, plus `Reply` for proxy-generated answers.

mod answer;
pub mod editor;
#[cfg(test)]
mod upstream_invariant;

use crate::buf::Buf;
use crate::config::Config;
use crate::http::body::{BodyError, BodyReader};
use crate::http::chunked::{ChunkTracker, Piece};
use crate::http::framing::Framing;
use crate::http::guard::{self, Policy};
use crate::http::head::{self, RequestHead, ResponseHead};
use crate::http::write::{self, BodyField};
use crate::io::{read_into, slices_after, write_vectored, Outcome};
use crate::limits::{
    ANSWER_FLUSH_TIMEOUT, CONNECT_RETRIES, CONNECT_RETRY_DELAY, IO_BUF_SIZE, MAX_IO_PER_EVENT,
    MAX_REQUEST_HEAD, MAX_STAMP_BODY, POOL_IDLE_TIMEOUT,
};
use crate::mcp::sse::EndpointRewriter;
use answer::Answer;
use log::{debug, info, warn};
use mio::net::TcpStream;
use std::fmt;
use std::mem;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What the event loop hands a connection on every drive: configuration,
/// the current identity and the time.
pub struct Ctx<'a> {
    pub config: &'a Config,
    /// `Bearer <token>`, the value set as `authorization` upstream.
    pub bearer: &'a [u8],
    /// The token alone, set as `x-agent-token`.
    pub token: &'a [u8],
    /// The agent name stamped into tools/call arguments.
    pub agent: &'a str,
    pub now: Instant,
    /// The port the proxy listens on (the DNS-rebinding guard's Host check).
    pub listen_port: u16,
    /// SIGINT/SIGTERM received: finish the current exchange, then close.
    pub shutting_down: bool,
}

/// What the loop must do after a drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Wait for readiness or the deadline.
    Wait,
    /// Progress was cut short by the per-event bound: drive again soon.
    Again,
    /// Give this connection an upstream socket (`attach_upstream`).
    NeedUpstream,
    /// Drop the connection (its reason has been logged).
    Close,
}

/// Why a connection ended; logged once at debug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    ClientClosed,
    ClientError,
    ClientIdle,
    RequestTimeout,
    BadRequest,
    UpstreamFailed,
    UpstreamTruncated,
    UpstreamTimeout,
    IdleTimeout,
    Done,
    Shutdown,
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CloseReason::ClientClosed => "client closed",
            CloseReason::ClientError => "client socket error",
            CloseReason::ClientIdle => "idle keep-alive timeout",
            CloseReason::RequestTimeout => "request head or body not received in time",
            CloseReason::BadRequest => "bad request answered",
            CloseReason::UpstreamFailed => "upstream failed",
            CloseReason::UpstreamTruncated => "upstream closed mid-body",
            CloseReason::UpstreamTimeout => "upstream timeout",
            CloseReason::IdleTimeout => "exchange idle timeout",
            CloseReason::Done => "exchange done, connection not reusable",
            CloseReason::Shutdown => "shutting down",
        })
    }
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

struct UpstreamSock {
    stream: TcpStream,
    ready: Ready,
    connected: bool,
    /// Taken from the keep-alive pool (may have been closed by the peer).
    reused: bool,
    /// Any response byte received on it for this exchange.
    received: bool,
}

/// How the response body is written to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutMode {
    /// No body.
    None,
    /// Bytes pass through unchanged (Content-Length, or chunked with
    /// trailers dropped).
    Same,
    /// Payload re-framed as chunks by the proxy (close-delimited upstream
    /// body to an HTTP/1.1 client).
    Chunk,
    /// Payload only, close-delimited (HTTP/1.0 client).
    Raw,
}

/// How the upstream body ends.
#[derive(Clone, Debug)]
enum InFraming {
    None,
    Length { remaining: u64 },
    Chunked(ChunkTracker),
    UntilClose,
}

enum Phase {
    ReadHead,
    ReadBody {
        reader: BodyReader,
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
    Relay {
        input: InFraming,
        out: OutMode,
        input_done: bool,
        /// Legacy SSE: rewrites an absolute upstream URL in the first
        /// `endpoint` event; dropped once it is done (R25).
        rewriter: Option<Box<EndpointRewriter>>,
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
    fn name(&self) -> &'static str {
        match self {
            Phase::ReadHead => "read-head",
            Phase::ReadBody { .. } => "read-body",
            Phase::Connect { .. } => "connect",
            Phase::SendRequest { .. } => "send-request",
            Phase::ReadResponseHead { .. } => "read-response-head",
            Phase::Relay { .. } => "relay",
            Phase::Reply { .. } => "reply",
            Phase::Linger { .. } => "linger",
            Phase::Closed(_) => "closed",
        }
    }
}

/// The current request/response pair. Its vectors are reused across
/// exchanges on one connection.
#[derive(Default)]
struct Exchange {
    method: smallvec::SmallVec<[u8; 16]>,
    target: smallvec::SmallVec<[u8; 64]>,
    /// The Host the client used (for `Location` rewriting).
    client_host: smallvec::SmallVec<[u8; 32]>,
    http10: bool,
    /// The rewritten request head for the upstream.
    head_out: Vec<u8>,
    /// The whole request body (de-chunked), read before anything is sent.
    body: Vec<u8>,
    /// The client delimited a body (Content-Length or chunked).
    framed: bool,
    /// End-to-end request fields as they go upstream.
    headers: crate::http::headers::HeaderList,
    start: Option<Instant>,
    status: u16,
    bytes_out: u64,
    /// A stale pooled connection was already replaced once.
    retried: bool,
    /// Splices that put the agent's name into the body.
    plan: crate::mcp::stamp::Plan,
}

impl Exchange {
    /// May be sent again after a stale pooled connection failed (RFC 9110
    /// §9.2.2).
    fn idempotent(&self) -> bool {
        matches!(self.method.as_slice(), b"GET" | b"HEAD" | b"OPTIONS" | b"DELETE" | b"PUT")
    }
}

pub struct Conn {
    id: u64,
    peer: SocketAddr,
    client: TcpStream,
    client_ready: Ready,
    upstream: Option<UpstreamSock>,
    /// An upstream socket the loop must take back (reusable or not).
    released: Option<(TcpStream, bool)>,
    client_buf: Buf,
    upstream_buf: Buf,
    /// Proxy-made bytes for the client (heads, 100 Continue, re-framed
    /// chunks, canned replies), written before `pass` bytes.
    to_client: Vec<u8>,
    to_client_pos: usize,
    /// Bytes at the front of `upstream_buf` to pass to the client as they are.
    pass: usize,
    /// Bytes right after `pass` to drop once `pass` is written (trailers,
    /// chunk framing for HTTP/1.0 clients).
    skip: usize,
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
    /// The upstream allows its connection to be reused after this response.
    upstream_reusable: bool,
    /// The upstream socket is kept, idle, for this client's next request
    /// (since when): no trip through the pool, no epoll_ctl, no probe.
    upstream_idle_since: Option<Instant>,
    /// Output of the SSE endpoint rewriter before it is framed.
    scratch: Vec<u8>,
}

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

impl Conn {
    pub fn new(id: u64, client: TcpStream, peer: SocketAddr, now: Instant) -> Conn {
        let _ = client.set_nodelay(true);
        Conn {
            id,
            peer,
            client,
            client_ready: Ready::default(),
            upstream: None,
            released: None,
            client_buf: Buf::new(MAX_REQUEST_HEAD),
            upstream_buf: Buf::new(crate::limits::MAX_RELAY_BUF),
            to_client: Vec::new(),
            to_client_pos: 0,
            pass: 0,
            skip: 0,
            phase: Phase::ReadHead,
            ex: Exchange::default(),
            close_after: false,
            last_activity: now,
            request_started: None,
            scanned: 0,
            upstream_reusable: false,
            upstream_idle_since: None,
            scratch: Vec::new(),
        }
    }

    /// Why the connection closed, once it has.
    pub fn close_reason(&self) -> Option<CloseReason> {
        match self.phase {
            Phase::Closed(r) => Some(r),
            _ => None,
        }
    }

    pub fn client(&mut self) -> &mut TcpStream {
        &mut self.client
    }

    /// Record readiness from an event on the client socket.
    pub fn client_event(&mut self, readable: bool, writable: bool, hup: bool) {
        self.client_ready.readable |= readable;
        self.client_ready.writable |= writable;
        self.client_ready.hup |= hup;
    }

    /// Record readiness from an event on the upstream socket.
    pub fn upstream_event(&mut self, readable: bool, writable: bool, hup: bool) {
        if let Some(u) = self.upstream.as_mut() {
            u.ready.readable |= readable;
            u.ready.writable |= writable;
            u.ready.hup |= hup;
        }
    }

    /// The upstream socket the loop must deregister and pool or drop.
    pub fn take_released(&mut self) -> Option<(TcpStream, bool)> {
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
        !self.ex.retried
    }

    /// Hand over an upstream socket: fresh (connecting) or from the pool.
    pub fn attach_upstream(&mut self, stream: TcpStream, reused: bool) {
        if !reused {
            // Pooled sockets already have it: one syscall less per request.
            let _ = stream.set_nodelay(true);
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
            Phase::Relay { .. } => Some(self.last_activity + config.idle_timeout),
            Phase::Reply { .. } => Some(self.last_activity + ANSWER_FLUSH_TIMEOUT),
            Phase::Linger { until, .. } => Some(*until),
            Phase::Closed(_) => None,
        }
    }

    fn close(&mut self, reason: CloseReason) {
        debug!("conn {} ({}): closed in {}: {reason}", self.id, self.peer, self.phase.name());
        self.release_upstream();
        self.phase = Phase::Closed(reason);
    }

    /// Hand the upstream socket back to the loop: to the pool if it sits idle
    /// and healthy between exchanges, else to be closed.
    fn release_upstream(&mut self) {
        let idle = self.upstream_idle_since.take().is_some();
        if let Some(u) = self.upstream.take() {
            let healthy = idle && !u.ready.readable && !u.ready.hup;
            self.released = Some((u.stream, healthy));
        }
    }

    /// The exchange's one `info` line, saying how it ended.
    fn log_exchange(&mut self, now: Instant, ending: &dyn fmt::Display) {
        if let Some(start) = self.ex.start.take() {
            info!(
                "{} {} -> {} {}B {}ms {ending}",
                String::from_utf8_lossy(&self.ex.method),
                String::from_utf8_lossy(&self.ex.target),
                self.ex.status,
                self.ex.bytes_out,
                now.saturating_duration_since(start).as_millis()
            );
        }
    }

    /// Queue a proxy-made response and stop the exchange.
    fn reply_error(&mut self, now: Instant, answer: Answer) {
        self.release_upstream();
        let close = answer.closes() || self.close_after || self.ex.http10;
        let mut body = Vec::new();
        let len = answer.write(close, &mut body, &mut self.to_client);
        self.ex.status = answer.status();
        self.ex.bytes_out = len as u64;
        if self.ex.start.is_none() {
            self.ex.start = Some(now);
        }
        self.log_exchange(now, &answer);
        self.pass = 0;
        self.skip = 0;
        self.upstream_buf.clear();
        self.phase = Phase::Reply { close, reason: answer.close_reason() };
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
                if self.upstream.is_none() {
                    return Verdict::NeedUpstream;
                }
            }
            if !progressed {
                return match self.phase {
                    Phase::Closed(_) => Verdict::Close,
                    _ => Verdict::Wait,
                };
            }
        }
        Verdict::Again
    }

    fn on_deadline(&mut self, ctx: &Ctx) {
        let now = ctx.now;
        match mem::replace(&mut self.phase, Phase::ReadHead) {
            Phase::ReadHead if self.request_started.is_none() => {
                self.phase = Phase::ReadHead;
                self.close(CloseReason::ClientIdle);
            }
            Phase::ReadHead | Phase::ReadBody { .. } => {
                warn!("conn {}: request head or body not received in time", self.id);
                self.reply_error(now, Answer::RequestTimeout);
            }
            Phase::Connect { attempt, retry_at: Some(_), since } => {
                self.phase = Phase::Connect { attempt, retry_at: None, since };
            }
            Phase::Connect { .. } => {
                warn!("conn {}: upstream connect timed out", self.id);
                self.reply_error(now, Answer::ConnectTimeout);
            }
            Phase::SendRequest { .. } | Phase::ReadResponseHead { .. } => {
                warn!("conn {}: no response head from upstream in time", self.id);
                self.reply_error(now, Answer::UpstreamTimeout);
            }
            Phase::Relay { .. } => {
                self.log_exchange(now, &CloseReason::IdleTimeout);
                self.close(CloseReason::IdleTimeout);
            }
            Phase::Reply { .. } => self.close(CloseReason::ClientError),
            Phase::Linger { reason, .. } => self.close(reason),
            closed @ Phase::Closed(_) => self.phase = closed,
        }
    }

    /// One round over both sockets; true if anything moved.
    fn step(&mut self, ctx: &Ctx) -> bool {
        let mut progressed = self.flush_client(ctx.now);
        if let Phase::Closed(_) = self.phase {
            return true;
        }
        if self.upstream_idle_since.is_some()
            && matches!(self.phase, Phase::ReadHead)
            && self.upstream.as_ref().is_some_and(|u| u.ready.readable || u.ready.hup)
        {
            // The upstream closed (or broke framing on) the idle socket.
            self.upstream_idle_since = None;
            if let Some(u) = self.upstream.take() {
                self.released = Some((u.stream, false));
            }
        }
        progressed |= match self.phase {
            Phase::ReadHead => self.read_head(ctx),
            Phase::ReadBody { .. } => self.read_body(ctx),
            Phase::Connect { .. } => self.connect_progress(ctx),
            Phase::SendRequest { .. } => self.send_request(ctx),
            Phase::ReadResponseHead { .. } => self.read_response_head(ctx),
            Phase::Relay { .. } => self.relay(ctx),
            Phase::Reply { close, reason } => {
                if self.client_output_pending() {
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
        // exchange (R16), and pipelined requests wait in client_buf.
        if matches!(self.phase, Phase::Connect { .. } | Phase::ReadResponseHead { .. } | Phase::Relay { .. })
        {
            progressed |= self.watch_client();
        }
        progressed
    }

    fn client_output_pending(&self) -> bool {
        self.to_client_pos < self.to_client.len() || self.pass > 0
    }

    /// Write queued bytes to the client: `to_client`, then `pass` bytes of
    /// `upstream_buf`, in one vectored write per round.
    fn flush_client(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        while self.client_output_pending() && self.client_ready.writable {
            let own_len = self.to_client.len() - self.to_client_pos;
            let (n, outcome) = {
                let own = &self.to_client[self.to_client_pos..];
                let passed = &self.upstream_buf.data()[..self.pass];
                let slices = slices_after::<2>(&[own, passed], 0);
                write_vectored(&mut self.client, &slices)
            };
            let own_n = n.min(own_len);
            self.to_client_pos += own_n;
            let pass_n = n - own_n;
            if pass_n > 0 {
                self.upstream_buf.consume(pass_n);
                self.pass -= pass_n;
                self.ex.bytes_out += pass_n as u64;
            }
            if self.to_client_pos == self.to_client.len() {
                self.to_client.clear();
                self.to_client_pos = 0;
            }
            if n > 0 {
                progressed = true;
                self.last_activity = now;
            }
            match outcome {
                Outcome::Open => {}
                Outcome::WouldBlock => self.client_ready.writable = false,
                Outcome::Closed | Outcome::Error(_) => {
                    self.log_exchange(now, &CloseReason::ClientClosed);
                    self.close(CloseReason::ClientClosed);
                    return true;
                }
            }
        }
        if self.pass == 0 && self.skip > 0 {
            self.upstream_buf.consume(self.skip);
            self.skip = 0;
            progressed = true;
        }
        progressed
    }

    /// Read from the client into `client_buf`; returns (bytes, eof/error).
    fn read_client(&mut self) -> (usize, bool) {
        fill_from(&mut self.client, &mut self.client_ready, &mut self.client_buf)
    }

    /// During connect/response phases: notice a client that went away.
    fn watch_client(&mut self) -> bool {
        if !self.client_ready.readable || !self.client_buf.has_space() {
            return false;
        }
        let (n, gone) = self.read_client();
        if gone {
            debug!("conn {}: client went away mid-exchange", self.id);
            self.ex.status = 499;
            self.log_exchange(Instant::now(), &CloseReason::ClientClosed);
            self.close(CloseReason::ClientClosed);
            return true;
        }
        n > 0
    }

    fn read_head(&mut self, ctx: &Ctx) -> bool {
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

    fn parse_head(&mut self, ctx: &Ctx) -> bool {
        match head::parse_request(self.client_buf.data()) {
            Ok(None) => {
                self.scanned = self.client_buf.len();
                false
            }
            Ok(Some(req)) => {
                self.client_buf.consume(req.len);
                self.scanned = 0;
                self.start_exchange(req, ctx);
                true
            }
            Err(e) => {
                warn!("conn {} ({}): bad request: {e}", self.id, self.peer);
                self.ex.method.clear();
                self.ex.target.clear();
                self.client_buf.clear();
                self.reply_error(ctx.now, Answer::BadHead(e));
                true
            }
        }
    }

    fn start_exchange(&mut self, req: RequestHead, ctx: &Ctx) {
        let ex = &mut self.ex;
        ex.method = req.method.clone();
        ex.target = req.target.clone();
        ex.client_host = req.headers.get(b"host").map(smallvec::SmallVec::from_slice).unwrap_or_default();
        ex.http10 = req.http10;
        ex.start = Some(ctx.now);
        ex.status = 0;
        ex.bytes_out = 0;
        ex.retried = false;
        ex.body.clear();
        ex.framed = req.framing != Framing::None;
        if !req.keep_alive || ctx.shutting_down {
            self.close_after = true;
        }
        let policy = Policy {
            listen_port: ctx.listen_port,
            client_token: ctx.config.client_token.as_ref().map(|t| t.as_bytes()),
            allow_origins: &ctx.config.allow_origins,
        };
        if let Err(refusal) = guard::admission(&req, &policy) {
            warn!("conn {} ({}): refused: {}", self.id, self.peer, refusal.message());
            self.reply_error(ctx.now, Answer::Refused(refusal));
            return;
        }
        if let Framing::Length(n) = req.framing {
            // Refused before a byte of it is read.
            if n > MAX_STAMP_BODY as u64 {
                warn!("conn {}: request body of {n} bytes refused", self.id);
                self.reply_error(ctx.now, Answer::BodyTooLarge);
                return;
            }
        }
        if req.expect_continue && req.framing != Framing::None {
            self.to_client.extend_from_slice(CONTINUE);
        }
        self.ex.headers = req.headers;
        // Every body is read whole before anything goes upstream, so that
        // all of it is scanned (`editor::plan_request` states the rule).
        match BodyReader::new(req.framing, MAX_STAMP_BODY) {
            Some(reader) => self.phase = Phase::ReadBody { reader },
            None => self.finish_request_head(ctx),
        }
    }

    /// The request is whole: scan and stamp its body, apply the current
    /// identity and write the upstream head, then go to Connect.
    fn finish_request_head(&mut self, ctx: &Ctx) {
        self.request_started = None;
        let ex = &mut self.ex;
        let req = editor::Outgoing { method: &ex.method, target: &ex.target, framed: ex.framed };
        let who = editor::Credentials { agent: ctx.agent, bearer: ctx.bearer, token: ctx.token };
        let route =
            editor::Route { authority: ctx.config.upstream.authority.as_bytes(), stamps: &ctx.config.stamps };
        match editor::plan_request(&req, &mut ex.headers, &ex.body, &who, &route, &mut ex.head_out) {
            Ok(plan) => ex.plan = plan,
            Err(e) => {
                // Fail closed: never forwarded unstamped.
                warn!("conn {}: request body refused: {e}", self.id);
                self.reply_error(ctx.now, Answer::BodyRefused(e));
                return;
            }
        }
        self.phase = Phase::Connect { attempt: 0, retry_at: None, since: ctx.now };
    }

    fn read_body(&mut self, ctx: &Ctx) -> bool {
        let Phase::ReadBody { reader } = &mut self.phase else {
            return false;
        };
        let mut progressed = false;
        if !self.client_buf.is_empty() {
            match reader.feed(self.client_buf.data(), &mut self.ex.body) {
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
                    self.reply_error(ctx.now, answer);
                    return true;
                }
            }
        }
        if reader.is_done() {
            self.finish_request_head(ctx);
            return true;
        }
        let (n, gone) = self.read_client();
        if n > 0 {
            self.last_activity = ctx.now;
            progressed = true;
        }
        if gone && n == 0 {
            self.ex.status = 499;
            self.log_exchange(ctx.now, &CloseReason::ClientClosed);
            self.close(CloseReason::ClientClosed);
            return true;
        }
        progressed
    }

    fn connect_progress(&mut self, ctx: &Ctx) -> bool {
        if let Some(since) = self.upstream_idle_since.take() {
            // The socket kept from the previous exchange: usable unless the
            // upstream spoke or closed meanwhile, or it idled too long
            // (uvicorn closes after 5 s).
            let fresh = ctx.now.saturating_duration_since(since) < POOL_IDLE_TIMEOUT;
            let quiet = self.upstream.as_ref().is_some_and(|u| !u.ready.readable && !u.ready.hup);
            if !(fresh && quiet) {
                if let Some(u) = self.upstream.take() {
                    self.released = Some((u.stream, false));
                }
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
            if let Ok(Some(_)) | Err(_) = u.stream.take_error() {
                self.upstream_connect_error(ctx);
                return true;
            }
            match u.stream.peer_addr() {
                Ok(_) => u.connected = true,
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
        self.last_activity = ctx.now;
        self.phase = Phase::SendRequest { written: 0 };
        true
    }

    /// A connect was refused or failed: retry shortly (nothing was sent, so
    /// this is safe for every method, R35), then 502.
    fn upstream_connect_error(&mut self, ctx: &Ctx) {
        if let Some(u) = self.upstream.take() {
            self.released = Some((u.stream, false));
        }
        let Phase::Connect { attempt, since, .. } = self.phase else {
            return;
        };
        if attempt < CONNECT_RETRIES {
            self.phase =
                Phase::Connect { attempt: attempt + 1, retry_at: Some(ctx.now + CONNECT_RETRY_DELAY), since };
        } else {
            warn!("conn {}: upstream unreachable after {} attempts", self.id, attempt + 1);
            self.reply_error(ctx.now, Answer::UpstreamUnreachable);
        }
    }

    /// The upstream connection failed before any response byte. A stale
    /// pooled connection is replaced once for idempotent requests; a POST
    /// whose bytes were written is never replayed (R35).
    fn upstream_lost_before_response(&mut self, ctx: &Ctx) {
        let stale = self.upstream.as_ref().is_some_and(|u| u.reused && !u.received);
        if let Some(u) = self.upstream.take() {
            self.released = Some((u.stream, false));
        }
        if stale && !self.ex.retried && self.ex.idempotent() {
            debug!("conn {}: pooled upstream connection was stale; reconnecting", self.id);
            self.ex.retried = true;
            self.upstream_buf.clear();
            self.phase = Phase::Connect { attempt: 0, retry_at: None, since: ctx.now };
            return;
        }
        warn!("conn {}: upstream closed the connection before answering", self.id);
        self.reply_error(ctx.now, Answer::UpstreamClosed);
    }

    fn send_request(&mut self, ctx: &Ctx) -> bool {
        let Phase::SendRequest { written } = &mut self.phase else {
            return false;
        };
        let Some(u) = self.upstream.as_mut() else {
            return false;
        };
        let mut progressed = false;
        let mut lost = false;
        // [head, body before splice, splice, body after, ...]: one vectored
        // write; the body is never copied.
        let mut parts: smallvec::SmallVec<[&[u8]; 8]> = smallvec::smallvec![self.ex.head_out.as_slice()];
        let body = self.ex.body.as_slice();
        let mut at = 0;
        for splice in self.ex.plan.splices() {
            parts.push(body.get(at..splice.start).unwrap_or_default());
            parts.push(&splice.insert);
            at = splice.end;
        }
        parts.push(body.get(at..).unwrap_or_default());
        let total: usize = parts.iter().map(|p| p.len()).sum();
        while *written < total && u.ready.writable {
            let slices = slices_after::<8>(&parts, *written);
            let (n, outcome) = write_vectored(&mut u.stream, &slices);
            *written += n;
            progressed |= n > 0;
            match outcome {
                Outcome::Open => {}
                Outcome::WouldBlock => u.ready.writable = false,
                Outcome::Closed | Outcome::Error(_) => {
                    lost = true;
                    break;
                }
            }
        }
        let done = *written >= total;
        drop(parts);
        if lost {
            self.upstream_lost_before_response(ctx);
            return true;
        }
        if progressed {
            self.last_activity = ctx.now;
        }
        if done {
            self.phase = Phase::ReadResponseHead { since: ctx.now };
            return true;
        }
        progressed
    }

    /// Read from the upstream into `upstream_buf`; returns (bytes, eof/error).
    /// A read that fills all the room while nothing waits for the client
    /// grows the buffer for the next one (fewer syscalls on busy streams; a
    /// quiet stream gives it back).
    fn read_upstream(&mut self) -> (usize, bool) {
        let Some(u) = self.upstream.as_mut() else {
            return (0, false);
        };
        if !self.upstream_buf.has_space() && self.pass == 0 && self.to_client.is_empty() {
            self.upstream_buf.grow();
        }
        let (total, eof) = fill_from(&mut u.stream, &mut u.ready, &mut self.upstream_buf);
        if total > 0 {
            u.received = true;
        }
        (total, eof)
    }

    fn read_response_head(&mut self, ctx: &Ctx) -> bool {
        if !self.upstream_buf.has_space() {
            self.upstream_buf.grow();
        }
        let (n, eof) = self.read_upstream();
        let mut progressed = n > 0;
        if n > 0 {
            self.last_activity = ctx.now;
        }
        loop {
            if self.upstream_buf.is_empty() {
                break;
            }
            match head::parse_response(self.upstream_buf.data(), self.ex.method.as_slice() == b"HEAD") {
                Ok(Some(resp)) if resp.is_interim() => {
                    // 100 Continue and 103 Early Hints are not relayed as
                    // final answers (R32); 101 cannot happen: Upgrade is
                    // never forwarded.
                    self.upstream_buf.consume(resp.len);
                    if resp.status == 101 {
                        warn!("conn {}: upstream switched protocols unasked", self.id);
                        self.reply_error(ctx.now, Answer::BadUpstream);
                        return true;
                    }
                    progressed = true;
                }
                Ok(Some(resp)) => {
                    self.upstream_buf.consume(resp.len);
                    self.start_relay(resp, ctx);
                    // Classify the body bytes already here so that head and
                    // body leave in one write.
                    self.relay(ctx);
                    return true;
                }
                Ok(None) => {
                    if !self.upstream_buf.has_space() && !self.upstream_buf.grow() {
                        warn!("conn {}: upstream response head too large", self.id);
                        self.reply_error(ctx.now, Answer::BadUpstream);
                        return true;
                    }
                    break;
                }
                Err(e) => {
                    warn!("conn {}: invalid upstream response: {e}", self.id);
                    self.reply_error(ctx.now, Answer::BadUpstream);
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

    fn start_relay(&mut self, mut resp: ResponseHead, ctx: &Ctx) {
        let http10 = self.ex.http10;
        let sse = resp
            .headers
            .get(b"content-type")
            .is_some_and(|v| v.len() >= 17 && v[..17].eq_ignore_ascii_case(b"text/event-stream"));
        // Legacy SSE (R25): the first event of a GET stream may announce an
        // absolute upstream URL. Only bodies that can carry events qualify.
        let rewrite = sse
            && self.ex.method.as_slice() == b"GET"
            && resp.status == 200
            && resp.framing != Framing::None
            && !self.ex.client_host.is_empty();
        let (input, out) = match resp.framing {
            Framing::None => (InFraming::None, OutMode::None),
            _ if http10 => (in_framing(resp.framing), OutMode::Raw),
            Framing::Length(_) if rewrite => (in_framing(resp.framing), OutMode::Chunk),
            Framing::Length(_) | Framing::Chunked => (in_framing(resp.framing), OutMode::Same),
            Framing::UntilClose => (InFraming::UntilClose, OutMode::Chunk),
        };
        let rewriter = rewrite.then(|| {
            Box::new(EndpointRewriter::new(ctx.config.upstream.authority.as_bytes(), &self.ex.client_host))
        });
        self.upstream_reusable = resp.keep_alive;
        if out == OutMode::Raw {
            self.close_after = true;
        }
        if let Some(loc) = resp.headers.get(b"location") {
            let upstream = ctx.config.upstream.authority.as_bytes();
            if let Some(new) = crate::mcp::sse::rewrite_location(loc, upstream, &self.ex.client_host) {
                let _ = resp.headers.set(b"location", &new);
            }
        }
        if sse && resp.headers.get(b"x-accel-buffering").is_none() {
            // R15: tell any buffering intermediary after us to stream.
            let _ = resp.headers.set(b"x-accel-buffering", b"no");
        }
        let field = match (out, resp.framing) {
            (OutMode::Same, Framing::Length(n)) => BodyField::Length(n),
            (OutMode::Same | OutMode::Chunk, _) => BodyField::Chunked,
            (OutMode::None, _) => resp.advertised_length.map_or(BodyField::Omitted, BodyField::Length),
            (OutMode::Raw, _) => BodyField::Omitted,
        };
        write::response_head(
            &mut self.to_client,
            resp.status,
            &resp.reason,
            &resp.headers,
            field,
            self.close_after,
        );
        self.ex.status = resp.status;
        let input_done = matches!(input, InFraming::None | InFraming::Length { remaining: 0 });
        self.phase = Phase::Relay { input, out, input_done, rewriter };
        if input_done {
            // An empty body: nothing for the rewriter to see.
            if let Phase::Relay { rewriter, .. } = &mut self.phase {
                *rewriter = None;
            }
        }
    }

    /// Queue payload bytes made by the proxy (rewritten SSE), framed as one
    /// chunk unless the client reads a close-delimited body.
    fn emit_payload(&mut self, out: OutMode) {
        if self.scratch.is_empty() {
            return;
        }
        if out == OutMode::Raw {
            self.to_client.extend_from_slice(&self.scratch);
        } else {
            write::push_hex(&mut self.to_client, self.scratch.len() as u64);
            self.to_client.extend_from_slice(b"\r\n");
            self.to_client.extend_from_slice(&self.scratch);
            self.to_client.extend_from_slice(b"\r\n");
        }
        self.ex.bytes_out += self.scratch.len() as u64;
        self.scratch.clear();
    }

    fn relay(&mut self, ctx: &Ctx) -> bool {
        let Phase::Relay { input_done, .. } = &self.phase else { return false };
        let (mut n, mut eof) = (0, false);
        if !*input_done {
            (n, eof) = self.read_upstream();
        }
        let mut progressed = n > 0;
        if n > 0 {
            self.last_activity = ctx.now;
        }
        let Phase::Relay { mut input, out, mut input_done, mut rewriter } =
            mem::replace(&mut self.phase, Phase::ReadHead)
        else {
            return progressed;
        };
        // Why the body was cut short, if it was.
        let mut cut: Option<&'static str> = None;
        // Classify the unread bytes: pass them, copy them re-framed, or drop
        // them. Dropping needs the bytes before them written first.
        while self.skip == 0 && !input_done {
            let avail = &self.upstream_buf.data()[self.pass..];
            let copying = out == OutMode::Chunk || rewriter.is_some();
            if avail.is_empty() || (copying && self.to_client.len() > IO_BUF_SIZE) {
                break;
            }
            let (len, piece) = match &mut input {
                InFraming::None => break,
                InFraming::Length { remaining } => {
                    let n = (*remaining).min(avail.len() as u64);
                    *remaining -= n;
                    input_done = *remaining == 0;
                    (n as usize, Piece::Data)
                }
                InFraming::Chunked(t) => match t.step(avail) {
                    Ok(Some(step)) => {
                        input_done = t.is_done();
                        (step.len, step.piece)
                    }
                    Ok(None) => break,
                    Err(e) => {
                        warn!("conn {}: invalid chunked body from upstream: {e}", self.id);
                        cut = Some("invalid chunked body from upstream");
                        break;
                    }
                },
                InFraming::UntilClose => (avail.len(), Piece::Data),
            };
            progressed = true;
            if let Some(rw) = rewriter.as_mut() {
                // Nothing is passed while rewriting (pass == 0): payload goes
                // through the rewriter, upstream framing is replaced by ours.
                if piece == Piece::Data {
                    rw.feed(&avail[..len], &mut self.scratch);
                }
                self.upstream_buf.consume(len);
                if input_done {
                    rw.finish(&mut self.scratch);
                }
                self.emit_payload(out);
                let boundary = match &input {
                    InFraming::Chunked(t) => t.at_chunk_boundary(),
                    _ => true,
                };
                if input_done && out != OutMode::Raw {
                    // Ours: the upstream's last chunk (if any) was dropped
                    // with its framing.
                    self.to_client.extend_from_slice(b"0\r\n\r\n");
                }
                if input_done || (rw.is_done() && boundary) {
                    rewriter = None;
                }
                continue;
            }
            match (out, piece) {
                (OutMode::Same, Piece::Data | Piece::Framing) | (OutMode::Raw, Piece::Data) => {
                    self.pass += len
                }
                (OutMode::Chunk, Piece::Data) => {
                    self.scratch.extend_from_slice(&avail[..len]);
                    self.upstream_buf.consume(len);
                    self.emit_payload(out);
                    if input_done {
                        // A Content-Length body re-framed after a rewrite.
                        self.to_client.extend_from_slice(b"0\r\n\r\n");
                    }
                }
                _ if self.pass == 0 => self.upstream_buf.consume(len),
                _ => self.skip = len,
            }
        }
        if eof {
            if let Some(u) = self.upstream.take() {
                self.released = Some((u.stream, false));
            }
            if matches!(input, InFraming::UntilClose) && self.upstream_buf.len() == self.pass {
                input_done = true;
                if let Some(mut rw) = rewriter.take() {
                    rw.finish(&mut self.scratch);
                    self.emit_payload(out);
                }
                if out == OutMode::Chunk {
                    self.to_client.extend_from_slice(b"0\r\n\r\n");
                }
                progressed = true;
            } else if !input_done {
                debug!("conn {}: upstream closed mid-body", self.id);
                cut = cut.or(Some("upstream closed mid-body"));
            }
        }
        if let Some(ending) = cut {
            // Headers are gone already: the only honest signal left is to
            // flush what arrived and close without a terminating chunk
            // (R31: a truncated body is never presented as complete).
            self.upstream_reusable = false;
            if let Some(u) = self.upstream.take() {
                self.released = Some((u.stream, false));
            }
            self.log_exchange(ctx.now, &ending);
            self.phase = Phase::Reply { close: true, reason: CloseReason::UpstreamTruncated };
            return true;
        }
        self.phase = Phase::Relay { input, out, input_done, rewriter };
        progressed |= self.flush_client(ctx.now);
        if input_done && !self.client_output_pending() && self.skip == 0 {
            if let Phase::Relay { .. } = self.phase {
                self.finish_exchange(ctx);
                return true;
            }
        }
        // A quiet stream holds no buffer: memory per open SSE stream is the
        // connection struct, not two 16 KiB buffers (DESIGN.md §9).
        let upstream_idle = self.upstream.as_ref().is_some_and(|u| !u.ready.readable);
        if upstream_idle && self.pass == 0 && self.skip == 0 {
            self.upstream_buf.release_if_empty();
        }
        if !self.client_ready.readable {
            self.client_buf.release_if_empty();
        }
        progressed
    }

    fn finish_exchange(&mut self, ctx: &Ctx) {
        self.log_exchange(ctx.now, &"complete");
        let reusable = self.upstream_reusable && self.upstream_buf.is_empty() && !ctx.shutting_down;
        match self.upstream.as_mut() {
            Some(u) if reusable && !self.close_after => {
                // Keep it for this client's next request.
                u.reused = true;
                u.received = false;
                self.upstream_idle_since = Some(ctx.now);
            }
            Some(_) => {
                if let Some(u) = self.upstream.take() {
                    self.released = Some((u.stream, reusable));
                }
            }
            None => {}
        }
        self.upstream_buf.clear();
        if self.close_after {
            self.linger(ctx.now, CloseReason::Done);
        } else {
            self.next_exchange(ctx.now);
        }
    }

    fn next_exchange(&mut self, now: Instant) -> bool {
        self.phase = Phase::ReadHead;
        self.scanned = 0;
        // Pipelined bytes already here start the next request's clock.
        self.request_started = if self.client_buf.is_empty() { None } else { Some(now) };
        self.last_activity = now;
        true
    }

    /// Shut our sending side and drain the client for a moment before the
    /// socket is dropped.
    fn linger(&mut self, now: Instant, reason: CloseReason) {
        self.release_upstream();
        let _ = self.client.shutdown(std::net::Shutdown::Write);
        self.client_buf.clear();
        self.phase = Phase::Linger { until: now + LINGER, reason };
    }

    fn drain_client(&mut self) -> bool {
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
}

fn in_framing(f: Framing) -> InFraming {
    match f {
        Framing::None => InFraming::None,
        Framing::Length(n) => InFraming::Length { remaining: n },
        Framing::Chunked => InFraming::Chunked(ChunkTracker::new()),
        Framing::UntilClose => InFraming::UntilClose,
    }
}

/// How long a closing connection drains unread client bytes.
const LINGER: Duration = Duration::from_secs(2);

/// Read into `buf` until the socket is drained or `buf` is full; returns
/// (bytes, eof/error). With edge-triggered readiness a short read means the
/// kernel buffer is empty (a new arrival raises a new event), so it ends the
/// loop without the extra read that would only say WouldBlock, unless the
/// peer's FIN was reported and still has to be read.
fn fill_from(stream: &mut TcpStream, ready: &mut Ready, buf: &mut Buf) -> (usize, bool) {
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
            Outcome::Open if n < room && !ready.hup => ready.readable = false,
            Outcome::Open => {}
            Outcome::WouldBlock => ready.readable = false,
            Outcome::Closed | Outcome::Error(_) => return (total, true),
        }
    }
    (total, false)
}

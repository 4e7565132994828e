//! One client connection and the upstream connection of its current
//! exchange. `drive` moves bytes in both directions until nothing more can
//! be done and returns a `Verdict`; the event loop owns `Poll`, the pool and
//! the sockets' registration. A failing connection only closes itself.
//!
//! Phases of one exchange (`mem::replace` + `match` for every transition):
//! `ReadHead -> [ReadBody] -> Connect -> SendRequest -> ReadResponseHead ->
//! Relay -> ReadHead | Closing`, plus `Reply` for proxy-generated answers.

pub mod editor;
#[cfg(test)]
mod upstream_invariant;

use crate::buf::Buf;
use crate::config::Config;
use crate::http::body::{BodyError, BodyReader};
use crate::http::chunked::{ChunkTracker, Piece};
use crate::http::framing::Framing;
use crate::http::guard;
use crate::http::head::{self, RequestHead, ResponseHead};
use crate::io::{read_into, slices_after, write_vectored, Outcome};
use crate::limits::{
    ANSWER_FLUSH_TIMEOUT, CONNECT_RETRIES, CONNECT_RETRY_DELAY, IO_BUF_SIZE, MAX_IO_PER_EVENT,
    MAX_REQUEST_HEAD, MAX_STAMP_BODY, POOL_IDLE_TIMEOUT,
};
use crate::mcp::rpc;
use crate::mcp::session::SessionTable;
use crate::mcp::sse::EndpointRewriter;
use log::{debug, info, warn};
use mio::net::TcpStream;
use std::fmt;
use std::io::Write as _;
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
    /// The MCP sessions seen created through this proxy (one thread: the
    /// cell is never borrowed across a call that could borrow it again).
    pub sessions: &'a std::cell::RefCell<SessionTable>,
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
    /// The whole body has been read (so its ids can be read).
    body_read: bool,
    /// The client's `Mcp-Session-Id`, as sent (empty: none).
    session_id: smallvec::SmallVec<[u8; 64]>,
    /// `session_id` names a session this proxy saw created.
    in_session: bool,
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

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

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

    fn log_exchange(&mut self, now: Instant) {
        if let Some(start) = self.ex.start.take() {
            info!(
                "{} {} -> {} {}B {}ms",
                String::from_utf8_lossy(&self.ex.method),
                String::from_utf8_lossy(&self.ex.target),
                self.ex.status,
                self.ex.bytes_out,
                now.saturating_duration_since(start).as_millis()
            );
        }
    }

    /// Queue a proxy-made JSON-RPC error response and stop the exchange.
    /// JSON-RPC 2.0 §5: the error carries the `id` of each request it
    /// answers (an array of errors for a batch), null only when the id
    /// cannot be read: the body was not read whole, or is not JSON. rmcp
    /// clients (Codex) wait forever for an answer to their id and ignore an
    /// error without it.
    fn reply_error(&mut self, now: Instant, status: u16, code: i32, message: &str, close: bool) {
        let mut body = Vec::new();
        {
            let parsed = if self.ex.body_read { rpc::parse(&self.ex.body).ok() } else { None };
            if rpc::write_error(&mut body, parsed.as_ref(), code, message) == 0 {
                // Only notifications or responses: nothing has an id to
                // carry, but an HTTP error still needs a body that says what
                // happened.
                rpc::write_error(&mut body, None, code, message);
            }
        }
        self.queue_answer(now, status, &body, close);
    }

    /// The upstream cannot be reached for a request in a recorded MCP
    /// session: it is restarting, and the client's session must survive the
    /// answer. Python SDK 1.x sessions die on any 5xx, even to a
    /// notification; a 200 carrying a JSON-RPC error with the request's id
    /// fails only that call, for every client. Never 404: that would tell the
    /// client its session is gone (MCP Session Management).
    fn answer_outage(&mut self, now: Instant) {
        const MESSAGE: &str = "upstream unavailable";
        warn!("conn {}: upstream unavailable for a request in a recorded session", self.id);
        let mut body = Vec::new();
        let written = match rpc::parse(&self.ex.body) {
            Ok(parsed) if self.ex.method.as_slice() == b"POST" => {
                Some(rpc::write_error(&mut body, Some(&parsed), rpc::SERVER_ERROR, MESSAGE))
            }
            _ => None,
        };
        let status = match written {
            Some(0) => {
                // Notifications only: accepted, and dropped.
                warn!("conn {}: notification dropped: upstream unavailable", self.id);
                202
            }
            Some(_) => 200,
            None => {
                self.reply_error(now, 502, rpc::SERVER_ERROR, MESSAGE, false);
                return;
            }
        };
        self.queue_answer(now, status, &body, false);
    }

    /// Queue a proxy-made response with a JSON body (possibly empty) and
    /// stop the exchange.
    fn queue_answer(&mut self, now: Instant, status: u16, body: &[u8], close: bool) {
        self.release_upstream();
        let close = close || self.close_after || self.ex.http10;
        let _ = write!(
            self.to_client,
            "HTTP/1.1 {status} {}\r\n{}content-length: {}\r\n{}\r\n",
            reason_phrase(status),
            if body.is_empty() { "" } else { "content-type: application/json\r\n" },
            body.len(),
            if close { "connection: close\r\n" } else { "" }
        );
        self.to_client.extend_from_slice(body);
        self.ex.status = status;
        self.ex.bytes_out = body.len() as u64;
        if self.ex.start.is_none() {
            self.ex.start = Some(now);
        }
        self.log_exchange(now);
        self.pass = 0;
        self.skip = 0;
        self.upstream_buf.clear();
        let reason = match status {
            408 => CloseReason::RequestTimeout,
            200..=299 | 502 => CloseReason::UpstreamFailed,
            504 => CloseReason::UpstreamTimeout,
            _ => CloseReason::BadRequest,
        };
        self.phase = Phase::Reply { close, reason };
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
                self.reply_error(now, 408, -32600, "request not received in time", true);
            }
            Phase::Connect { attempt, retry_at: Some(_), since } => {
                self.phase = Phase::Connect { attempt, retry_at: None, since };
            }
            Phase::Connect { .. } if self.ex.in_session => self.answer_outage(now),
            Phase::Connect { .. } => {
                warn!("conn {}: upstream connect timed out", self.id);
                self.reply_error(now, 504, -32000, "upstream connect timed out", false);
            }
            Phase::SendRequest { .. } | Phase::ReadResponseHead { .. } => {
                warn!("conn {}: no response head from upstream in time", self.id);
                self.reply_error(now, 504, -32000, "upstream did not answer in time", false);
            }
            Phase::Relay { .. } => {
                self.log_exchange(now);
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
                    self.log_exchange(now);
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
            self.log_exchange(Instant::now());
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
                let status = e.client_status();
                self.reply_error(ctx.now, status, -32600, &e.to_string(), true);
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
        ex.body_read = false;
        ex.in_session = false;
        ex.session_id =
            req.headers.get(b"mcp-session-id").map(smallvec::SmallVec::from_slice).unwrap_or_default();
        ex.framed = req.framing != Framing::None;
        if !req.keep_alive || ctx.shutting_down {
            self.close_after = true;
        }
        if let Some((status, message)) = admission(&req, ctx) {
            warn!("conn {} ({}): refused: {message}", self.id, self.peer);
            self.reply_error(ctx.now, status, -32600, message, true);
            return;
        }
        if let Framing::Length(n) = req.framing {
            // Refused before a byte of it is read.
            if n > MAX_STAMP_BODY as u64 {
                warn!("conn {}: request body of {n} bytes refused", self.id);
                self.reply_error(ctx.now, 413, -32600, "request body too large", true);
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
        ex.body_read = true;
        ex.in_session = !ex.session_id.is_empty() && ctx.sessions.borrow_mut().touch(&ex.session_id, ctx.now);
        let req = editor::Outgoing { method: &ex.method, target: &ex.target, framed: ex.framed };
        let who = editor::Credentials { agent: ctx.agent, bearer: ctx.bearer, token: ctx.token };
        let route =
            editor::Route { authority: ctx.config.upstream.authority.as_bytes(), stamps: &ctx.config.stamps };
        match editor::plan_request(&req, &mut ex.headers, &ex.body, &who, &route, &mut ex.head_out) {
            Ok(plan) => ex.plan = plan,
            Err(e) => {
                // Fail closed: never forwarded unstamped.
                warn!("conn {}: request body refused: {e}", self.id);
                self.reply_error(ctx.now, 400, e.jsonrpc_code(), &e.to_string(), false);
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
                    let (status, message) = match e {
                        BodyError::Malformed(e) => {
                            warn!("conn {}: bad chunked request body: {e}", self.id);
                            (400, "malformed chunked body")
                        }
                        BodyError::TooLarge => {
                            warn!("conn {}: request body over {MAX_STAMP_BODY} bytes refused", self.id);
                            (413, "request body too large")
                        }
                    };
                    self.reply_error(ctx.now, status, -32600, message, true);
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
            self.log_exchange(ctx.now);
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
        let retry_at = ctx.now + CONNECT_RETRY_DELAY;
        // In a recorded session a refused connect is most likely a restart:
        // keep trying for the grace, then answer so the session survives.
        let in_grace = self.ex.in_session && retry_at <= since + ctx.config.restart_grace;
        if attempt < CONNECT_RETRIES || in_grace {
            self.phase = Phase::Connect { attempt: attempt + 1, retry_at: Some(retry_at), since };
        } else if self.ex.in_session {
            self.answer_outage(ctx.now);
        } else {
            warn!("conn {}: upstream unreachable after {} attempts", self.id, attempt + 1);
            self.reply_error(ctx.now, 502, -32000, "upstream unreachable", false);
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
        if self.ex.in_session {
            // Reset before any byte of a response: the upstream died under
            // the request. It is not sent again (it may have been
            // processed); the answer keeps the session alive.
            self.answer_outage(ctx.now);
            return;
        }
        warn!("conn {}: upstream closed the connection before answering", self.id);
        self.reply_error(ctx.now, 502, -32000, "upstream closed the connection without a response", false);
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
                        self.reply_error(ctx.now, 502, -32000, "invalid upstream response", false);
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
                        self.reply_error(ctx.now, 502, -32000, "invalid upstream response", false);
                        return true;
                    }
                    break;
                }
                Err(e) => {
                    warn!("conn {}: invalid upstream response: {e}", self.id);
                    self.reply_error(ctx.now, 502, -32000, "invalid upstream response", false);
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

    /// Session bookkeeping on a response head (MCP Session Management): a
    /// session is created by a 200 to an `initialize` POST without a session
    /// id that carries one `Mcp-Session-Id` (a second, different one is
    /// refused by the parser); the client's DELETE is the only signal that a
    /// session really ended, whatever the upstream answered.
    fn note_session(&self, resp: &ResponseHead, ctx: &Ctx) {
        let ex = &self.ex;
        let mut table = ctx.sessions.borrow_mut();
        match ex.method.as_slice() {
            b"DELETE" if !ex.session_id.is_empty() => {
                table.forget(&ex.session_id);
            }
            b"POST" if ex.session_id.is_empty() && resp.status == 200 => {
                let Some(id) = resp.headers.get(b"mcp-session-id") else { return };
                let Ok(body) = rpc::parse(&ex.body) else { return };
                if !body.single().is_some_and(|m| m.is_method(rpc::INITIALIZE)) {
                    return;
                }
                // What a replay needs: end-to-end fields without the
                // credentials (the identity current at replay time is used).
                let fields = ex.headers.iter().map(|h| (h.name(), h.value())).filter(|(name, _)| {
                    !matches!(*name, b"authorization" | b"x-agent-token" | b"host" | b"content-length")
                });
                table.expire(ctx.now);
                match table.record(id, &ex.body, fields, "", ctx.now) {
                    Ok(()) => debug!("conn {}: MCP session recorded", self.id),
                    Err(why) => debug!("conn {}: MCP session not tracked: {why:?}", self.id),
                }
            }
            b"POST"
                if ex.in_session
                    && rpc::parse(&ex.body).is_ok_and(|b| b.find_method(rpc::INITIALIZED).is_some()) =>
            {
                table.note_initialized(&ex.session_id, ctx.now);
            }
            _ => {}
        }
    }

    fn start_relay(&mut self, mut resp: ResponseHead, ctx: &Ctx) {
        self.note_session(&resp, ctx);
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
        let t = &mut self.to_client;
        t.extend_from_slice(b"HTTP/1.1 ");
        let _ = write!(t, "{} ", resp.status);
        t.extend_from_slice(&resp.reason);
        t.extend_from_slice(b"\r\n");
        resp.headers.write_to(t);
        match (out, resp.framing) {
            (OutMode::Same, Framing::Length(n)) => {
                let _ = write!(t, "content-length: {n}\r\n");
            }
            (OutMode::Same | OutMode::Chunk, _) => t.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            (OutMode::None, _) => {
                if let Some(n) = resp.advertised_length {
                    let _ = write!(t, "content-length: {n}\r\n");
                }
            }
            (OutMode::Raw, _) => {}
        }
        if self.close_after {
            t.extend_from_slice(b"connection: close\r\n");
        }
        t.extend_from_slice(b"\r\n");
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
            let _ = write!(self.to_client, "{:x}\r\n", self.scratch.len());
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
        let mut bad_chunk = false;
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
                        bad_chunk = true;
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
                bad_chunk = true;
            }
        }
        if bad_chunk {
            // Headers are gone already: the only honest signal left is to
            // flush what arrived and close without a terminating chunk
            // (R31: a truncated body is never presented as complete).
            self.upstream_reusable = false;
            if let Some(u) = self.upstream.take() {
                self.released = Some((u.stream, false));
            }
            self.log_exchange(ctx.now);
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
        self.log_exchange(ctx.now);
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
/// (bytes, eof/error). With edge-triggered readiness (epoll on Linux, kqueue
/// with EV_CLEAR on macOS) a short read means the kernel buffer is empty and
/// a new arrival raises a new event, so it ends the loop without the extra
/// read that would only say WouldBlock, unless the peer's FIN was reported
/// and still has to be read. mio's Windows backend re-arms a socket only
/// after a read returned WouldBlock, so there every loop ends in WouldBlock
/// (else a keep-alive request, a large body or a stream stalls).
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
            Outcome::Open if n < room && !ready.hup && cfg!(not(windows)) => ready.readable = false,
            Outcome::Open => {}
            Outcome::WouldBlock => ready.readable = false,
            Outcome::Closed | Outcome::Error(_) => return (total, true),
        }
    }
    (total, false)
}

/// Who may use the proxy (R26, R27): before any upstream contact, the
/// request must name the proxy by a loopback Host (a DNS-rebound name cannot)
/// or carry the client token, and any Origin must be a loopback or listed
/// one. Only origin-form targets are relayed: an absolute-form target would
/// name an authority other than the one checked.
fn admission(req: &RequestHead, ctx: &Ctx) -> Option<(u16, &'static str)> {
    let target = req.target.as_slice();
    if !(target.starts_with(b"/") || (target == b"*" && req.is_method(b"OPTIONS"))) {
        return Some((400, "request target must be a path"));
    }
    match &ctx.config.client_token {
        None => {
            let host = req.headers.get(b"host").unwrap_or_default();
            if !guard::host_allowed(host, ctx.listen_port) {
                return Some((403, "Host not allowed"));
            }
        }
        Some(secret) => {
            let presented = req.headers.get(b"authorization").unwrap_or_default();
            if !guard::bearer_matches(presented, secret.as_bytes()) {
                return Some((401, "client token required"));
            }
        }
    }
    if let Some(origin) = req.headers.get(b"origin") {
        let extra: smallvec::SmallVec<[&[u8]; 4]> =
            ctx.config.allow_origins.iter().map(|o| o.as_bytes()).collect();
        if !guard::origin_allowed(origin, &extra) {
            return Some((403, "Origin not allowed"));
        }
    }
    None
}

//! `--stdio`: the host spawns the proxy as its MCP server and speaks
//! JSON-RPC over stdin and stdout, one message per line. The front-end is
//! an MCP client of the upstream that reaches it through the proxy's own
//! exchange: each message becomes an HTTP/1.1 request written into an
//! in-memory pipe (`conn::client_sock::Pipe`) of a connection like any
//! other, so stamping, tool policy, audit, metrics and session recovery
//! apply exactly as they do to a TCP client, and no port is opened.
//!
//! - stdin: lines read as they come (`StdinChannel`, the `--control-stdin`
//!   reader); one that is not JSON-RPC is answered here (parse error, id
//!   null). Each message (or batch) is POSTed on a connection of its own
//!   (at most `MAX_IN_FLIGHT` at once, reused while idle): a long call never
//!   holds back another.
//! - stdout: every message of every answer, JSON or event stream, on one
//!   line (`reader`), whole lines only (`out`); logs go to stderr.
//! - The session: `Mcp-Session-Id` from the `initialize` answer and
//!   `MCP-Protocol-Version` from its result go on every later request; the
//!   GET stream opens after `notifications/initialized` (none on 405); stdin's
//!   end lets answers in flight finish (up to `DRAIN`), DELETEs the session
//!   and exits.
//! - Legacy SSE (2024-11-05): when the upstream path ends in `/sse`, or when
//!   `initialize` gets a 4xx and a GET of the same URL offers an `endpoint`
//!   event (the MCP spec's backwards-compatibility fallback), the stream is
//!   opened first and messages are POSTed to its endpoint.
//!
//! Memory is bounded whatever the host does: while stdout is full
//! (`out::OUT_CAP`), nothing more is read from the pipes, each pipe fills
//! (`PIPE_CAP`), and its connection stops reading the upstream.

pub mod out;
pub mod reader;

use crate::conn::client_sock::Pipe;
use crate::mcp::json;
use crate::mcp::rpc::{self, IdKey};
use log::{debug, info, warn};
use out::Stdout;
use reader::{Event, Head, Reader};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Messages (or batches) in flight at once; later ones wait in order.
pub const MAX_IN_FLIGHT: usize = 32;
/// Lines read from stdin and not yet sent, past which stdin is not read.
const MAX_QUEUED: usize = 64;
/// A stdin line longer than this is answered with a parse error unread
/// (the exchange's own bound on a body it reads is `MAX_STAMP_BODY`).
const MAX_LINE: usize = crate::limits::MAX_STAMP_BODY + 1024;
/// After stdin ends: how long answers in flight may take.
const DRAIN: Duration = Duration::from_secs(5);
/// How long the session's DELETE may take at the end.
const DELETE_WAIT: Duration = Duration::from_secs(2);
/// After the end: how long queued stdout may take to leave.
const FLUSH_WAIT: Duration = Duration::from_secs(2);
/// A GET stream that ended, or failed, is opened again after this.
const REOPEN: Duration = Duration::from_secs(1);
const REOPEN_FAILED: Duration = Duration::from_secs(5);
/// A `ping` that cannot be sent this long (the connections in flight are
/// all busy) is answered by the front-end itself (MCP lets either side
/// answer a ping).
const PING_WAIT: Duration = Duration::from_secs(1);
/// An idle connection older than this is closed instead of reused (the
/// exchange closes idle ones after `--keepalive-timeout`, 75 s at least
/// by default).
const IDLE_REUSE: Duration = Duration::from_secs(30);

/// What the front-end needs from the event loop: connections whose client
/// is a pipe.
pub trait Core {
    /// Opens a connection; its id.
    fn open(&mut self) -> Option<u64>;
    /// The pipe of live connection `id`.
    fn pipe(&mut self, id: u64) -> Option<&mut Pipe>;
    /// Connection `id` has bytes to read or room to write.
    fn wake(&mut self, id: u64);
    /// The pipe connection `id` left when it closed.
    fn closed(&mut self, id: u64) -> Option<Pipe>;
}

/// A line from stdin, read.
#[derive(Clone, Debug, Default)]
struct Outgoing {
    line: Vec<u8>,
    /// The ids (JSON text) of its requests: each is owed an answer.
    owed: Vec<Vec<u8>>,
    /// It is one request (not a batch): its id.
    single: Option<Vec<u8>>,
    initialize: bool,
    initialized: bool,
    /// A replay of the host's `initialize` for a new legacy stream: its
    /// answer is not the host's.
    replay: bool,
    /// It is one `ping`.
    ping: bool,
    /// When it was read (a replay: when it was made).
    queued_at: Option<Instant>,
}

#[derive(Debug)]
enum Job {
    Idle,
    Post(Box<Outgoing>),
    /// The streamable transport's GET stream.
    Get,
    /// The legacy transport's `GET /sse` stream.
    Stream,
    Delete,
}

struct VConn {
    id: u64,
    job: Job,
    reader: Reader,
    head: Option<Head>,
    /// The connection closed; what it wrote last is here.
    closed: Option<Pipe>,
    /// A whole message waiting for the stdout line.
    held: Option<Vec<u8>>,
    idle_since: Instant,
    /// It served an exchange before this one.
    reused: bool,
    /// The answer to a fallback `initialize` is kept, not written.
    fallback: bool,
    fallback_answer: Vec<Vec<u8>>,
    /// The start of a body that was not a message (for the error).
    dropped: String,
    done: bool,
}

#[derive(Debug)]
enum Transport {
    Streamable,
    /// `initialize` got a 4xx: is there a legacy stream at the same URL?
    /// The line and the answer it got wait for the verdict.
    Probing {
        line: Box<Outgoing>,
        answer: Vec<Vec<u8>>,
        status: u16,
    },
    Legacy {
        endpoint: Option<String>,
        stream_open: bool,
        retry_at: Option<Instant>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GetStream {
    /// Not before `notifications/initialized`.
    NotYet,
    Due(Instant),
    Open,
    /// 405, or no session: the server offers none.
    Never,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Running,
    /// stdin ended: answers in flight until then.
    Draining(Instant),
    Deleting(Instant),
    Done(Instant),
}

pub struct Bridge {
    path: String,
    host: String,
    client_token: Option<String>,
    /// Bytes read from stdin, not yet taken as lines: lines are taken only
    /// while the queue has room, so what the host writes waits in its pipe.
    stdin_buf: Vec<u8>,
    /// `stdin_buf` holds a whole line (one that did not fit the queue).
    line_waiting: bool,
    /// The session is ending: every line left is taken (and answered).
    closing: bool,
    stdin_eof: bool,
    /// A line longer than `MAX_LINE` is being skipped.
    discarding: bool,
    out: Stdout,
    queue: VecDeque<Outgoing>,
    /// Lines the front-end answers itself, waiting for the stdout line.
    local: VecDeque<Vec<u8>>,
    vconns: Vec<VConn>,
    session: Option<String>,
    protocol: Option<String>,
    transport: Transport,
    /// The host's `initialize` and whether `notifications/initialized`
    /// followed: replayed on a new legacy stream.
    init: Option<Outgoing>,
    initialized: bool,
    get: GetStream,
    stop: Stop,
    /// SIGTERM: no wait for answers in flight.
    hurry: bool,
    /// Legacy: ids of requests POSTed whose answers come on the stream.
    legacy_owed: Vec<Vec<u8>>,
    /// Ids of replayed requests whose answers the host never sees.
    swallow: Vec<Vec<u8>>,
    /// `--connect-timeout`: how long a request waits for a legacy stream
    /// that has not named its endpoint.
    connect_timeout: Duration,
}

impl Bridge {
    /// `path`: the upstream URL's path; `listen_port`: what the exchange
    /// checks `Host` against (0: there is no listener).
    /// `connect_timeout`: how long a request may wait for the legacy stream.
    pub fn new(
        path: &str,
        listen_port: u16,
        client_token: Option<String>,
        connect_timeout: Duration,
        out: Stdout,
    ) -> Bridge {
        let legacy = path.trim_end_matches('/').ends_with("/sse");
        Bridge {
            path: path.to_string(),
            host: format!("127.0.0.1:{listen_port}"),
            client_token,
            stdin_buf: Vec::new(),
            line_waiting: false,
            closing: false,
            stdin_eof: false,
            discarding: false,
            out,
            queue: VecDeque::new(),
            local: VecDeque::new(),
            vconns: Vec::new(),
            session: None,
            protocol: None,
            transport: match legacy {
                true => Transport::Legacy { endpoint: None, stream_open: false, retry_at: None },
                false => Transport::Streamable,
            },
            init: None,
            initialized: false,
            get: GetStream::NotYet,
            stop: Stop::Running,
            hurry: false,
            legacy_owed: Vec::new(),
            swallow: Vec::new(),
            connect_timeout,
        }
    }

    /// Whether stdin should be read now: not at its end, and only while
    /// the queue (and the front-end's own answers) have room and no whole
    /// line waits for it: the host's writes block instead.
    pub fn wants_input(&self) -> bool {
        !self.stdin_eof && self.has_room() && !self.line_waiting
    }

    fn has_room(&self) -> bool {
        self.closing || (self.queue.len() < MAX_QUEUED && self.local.len() < MAX_QUEUED)
    }

    /// Reads stdin: `read` appends some of what is available (a bounded
    /// amount) to the buffer it is given and says whether stdin ended.
    pub fn input(&mut self, read: impl FnOnce(&mut Vec<u8>) -> bool, now: Instant) {
        if !self.wants_input() {
            return;
        }
        let eof = read(&mut self.stdin_buf);
        if eof {
            info!("stdio: stdin closed");
            self.stdin_eof = true;
            if self.stop == Stop::Running {
                self.stop = Stop::Draining(now);
            }
        }
        self.take_lines(now);
    }

    /// One round: answers read and written, lines taken and sent, waits
    /// that ran out answered.
    pub fn turn(&mut self, core: &mut impl Core, now: Instant) {
        self.pump(core, now);
        // Sending makes room in the queue for lines still buffered.
        self.take_lines(now);
        self.send_queued(core, now);
        self.take_lines(now);
        self.send_queued(core, now);
        self.expire_waits(now);
        self.open_streams(core, now);
        self.advance_stop(core, now);
        self.flush_local();
        self.out.flush();
    }

    /// SIGTERM: the session is DELETEd at once and the process exits.
    pub fn terminate(&mut self, now: Instant) {
        if matches!(self.stop, Stop::Running | Stop::Draining(_)) {
            info!("stdio: terminating");
            self.stdin_eof = true;
            self.hurry = true;
            self.stop = Stop::Draining(now);
        }
    }

    /// The stdout line, for a caller that waits for its writer
    /// (`Stdout::join`).
    pub fn into_stdout(self) -> Stdout {
        self.out
    }

    /// The front-end is over and stdout has left (or cannot).
    pub fn finished(&self, now: Instant) -> bool {
        match self.stop {
            Stop::Done(at) => self.out.is_idle() || self.out.failed() || now >= at + FLUSH_WAIT,
            _ => false,
        }
    }

    /// When the loop must turn even without events.
    pub fn deadline(&self) -> Option<Instant> {
        let stop = match self.stop {
            Stop::Running => None,
            Stop::Draining(t) => Some(t + DRAIN),
            Stop::Deleting(t) => Some(t + DELETE_WAIT),
            Stop::Done(t) => Some(t + FLUSH_WAIT),
        };
        let get = match self.get {
            GetStream::Due(t) => Some(t),
            _ => None,
        };
        let legacy = match self.transport {
            Transport::Legacy { retry_at, .. } => retry_at,
            _ => None,
        };
        [stop, get, legacy, self.wait_ends()].into_iter().flatten().min()
    }

    /// When the first wait in the queue runs out (`expire_waits`).
    fn wait_ends(&self) -> Option<Instant> {
        let waiting = self.waiting_for_stream();
        self.queue
            .iter()
            .filter_map(|o| {
                let at = o.queued_at?;
                match (o.ping, waiting && !o.replay && !o.owed.is_empty()) {
                    (true, _) => Some(at + PING_WAIT),
                    (false, true) => Some(at + self.connect_timeout),
                    (false, false) => None,
                }
            })
            .min()
    }

    /// Lines wait for a legacy stream that has not named its endpoint.
    fn waiting_for_stream(&self) -> bool {
        matches!(self.transport, Transport::Legacy { endpoint: None, .. })
    }

    /// Waits that ran out: a request that waited `connect_timeout` for a
    /// legacy stream gets the outage error (and a stream that never named
    /// its endpoint is given up: the next request opens another); a `ping`
    /// that waited `PING_WAIT` behind calls in flight is answered here.
    fn expire_waits(&mut self, now: Instant) {
        let waiting = self.waiting_for_stream();
        let timeout = self.connect_timeout;
        let mut expired = Vec::new();
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for o in std::mem::take(&mut self.queue) {
            let waited = o.queued_at.map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
            if o.ping && waited >= PING_WAIT {
                expired.push((o, true));
            } else if waiting && !o.replay && !o.owed.is_empty() && waited >= timeout {
                expired.push((o, false));
            } else {
                kept.push_back(o);
            }
        }
        self.queue = kept;
        let mut outage = false;
        for (o, ping) in expired {
            let Some(id) = o.owed.first() else { continue };
            if ping {
                debug!("stdio: a ping waited {PING_WAIT:?} behind calls in flight; answered here");
                let mut line = b"{\"jsonrpc\":\"2.0\",\"id\":".to_vec();
                line.extend_from_slice(id);
                line.extend_from_slice(b",\"result\":{}}");
                self.local.push_back(line);
                continue;
            }
            outage = true;
            for id in &o.owed {
                let cause = format!("the upstream's legacy SSE stream did not start within {timeout:?}");
                self.reply_local(id, rpc::INTERNAL_ERROR, &cause);
            }
        }
        if outage {
            warn!("stdio: the legacy SSE stream did not start within {timeout:?}; requests waiting for it answered");
            // A stream that is open but never named its endpoint is of no
            // use: closed, and the next request opens another.
            for v in &mut self.vconns {
                if matches!(v.job, Job::Stream) {
                    v.job = Job::Idle;
                    v.done = true;
                }
            }
            if let Transport::Legacy { stream_open, retry_at, .. } = &mut self.transport {
                *stream_open = false;
                *retry_at = Some(now + REOPEN_FAILED);
            }
        }
    }

    // ------------------------------------------------------------------
    // stdin

    /// Takes the whole lines of `stdin_buf` while the queue has room (the
    /// rest wait there, and stdin is not read meanwhile); at stdin's end,
    /// the last line even without its newline.
    fn take_lines(&mut self, now: Instant) {
        let mut start = 0;
        self.line_waiting = false;
        while let Some(nl) = memchr::memchr(b'\n', self.stdin_buf.get(start..).unwrap_or_default()) {
            if !self.has_room() {
                self.line_waiting = true;
                break;
            }
            let end = start + nl;
            if !std::mem::take(&mut self.discarding) {
                let line = self.stdin_buf.get(start..end).unwrap_or_default().to_vec();
                self.take_line(&line, now);
            }
            start = end + 1;
        }
        self.stdin_buf.drain(..start);
        if self.line_waiting {
            return;
        }
        if self.stdin_buf.len() > MAX_LINE && !self.discarding {
            warn!("stdio: a line longer than {MAX_LINE} bytes; answered with a parse error");
            self.reply_local(b"null", rpc::PARSE_ERROR, "Parse error: line too long");
            self.stdin_buf.clear();
            self.discarding = true;
        } else if self.discarding {
            self.stdin_buf.clear();
        }
        if self.stdin_eof && !self.stdin_buf.is_empty() {
            if !self.has_room() {
                self.line_waiting = true;
                return;
            }
            let line = std::mem::take(&mut self.stdin_buf);
            self.take_line(&line, now);
        }
    }

    fn take_line(&mut self, line: &[u8], now: Instant) {
        let line = trim_ws(line);
        if line.is_empty() {
            return;
        }
        let body = match rpc::parse(line) {
            Ok(b) => b,
            Err(e) => {
                warn!("stdio: a line that is not JSON: {e}");
                self.reply_local(b"null", rpc::PARSE_ERROR, &format!("Parse error: {e}"));
                return;
            }
        };
        let invalid = match body.is_batch() {
            true => body.messages().is_empty(),
            false => body.messages().iter().any(|m| m.role() == rpc::Role::Invalid),
        };
        if invalid {
            self.reply_local(b"null", rpc::INVALID_REQUEST, "Invalid Request: not a JSON-RPC message");
            return;
        }
        let refused = |m: &rpc::Message| m.role() == rpc::Role::Request && m.id() == rpc::Id::Refused;
        if body.messages().iter().any(refused) {
            // An id no answer could carry (an object, an array, a boolean,
            // a lone surrogate, 1e400): answered here once, never sent (the
            // upstream's answer could not be matched to it).
            warn!(
                "stdio: a request whose id is not a string, a number or null; answered with Invalid Request"
            );
            let message = "Invalid Request: the id must be a string, a number or null";
            if !body.is_batch() {
                self.reply_local(b"null", rpc::INVALID_REQUEST, message);
                return;
            }
            let mut rest = b"[".to_vec();
            if let Ok(top) = json::parse_value(line) {
                let _ = json::for_each_element(line, &top, |v| {
                    let element = v.bytes(line);
                    let keep =
                        rpc::parse(element).map(|b| !b.messages().iter().any(&refused)).unwrap_or(true);
                    if !keep {
                        self.reply_local(b"null", rpc::INVALID_REQUEST, message);
                    } else {
                        if rest.len() > 1 {
                            rest.push(b',');
                        }
                        rest.extend_from_slice(element);
                    }
                    Ok::<(), json::ScanError>(())
                });
            }
            rest.push(b']');
            if rest.len() > 2 {
                self.take_line(&rest, now);
            }
            return;
        }
        let requests = body.messages().iter().filter(|m| m.role() == rpc::Role::Request);
        let owed: Vec<Vec<u8>> = requests.map(|m| m.id().json().to_vec()).collect();
        let is = |name| body.messages().iter().any(|m| m.is_method(name));
        let single = match (body.is_batch(), owed.as_slice()) {
            (false, [id]) => Some(id.clone()),
            _ => None,
        };
        let o = Outgoing {
            line: line.to_vec(),
            initialize: is("initialize") && single.is_some(),
            initialized: is("notifications/initialized"),
            ping: is("ping") && single.is_some(),
            owed,
            single,
            replay: false,
            queued_at: Some(now),
        };
        if o.initialize {
            self.init = Some(o.clone());
        }
        // A request is worth a new try at a legacy stream that failed.
        if let Transport::Legacy { stream_open: false, retry_at, .. } = &mut self.transport {
            if !o.owed.is_empty() && retry_at.take().is_some() {
                debug!("stdio: a request; opening the legacy SSE stream again now");
            }
        }
        self.queue.push_back(o);
    }

    /// An error answer of the front-end's own.
    fn reply_local(&mut self, id: &[u8], code: i32, message: &str) {
        let mut line = Vec::new();
        rpc::write_error_for(&mut line, id, code, message);
        self.local.push_back(line);
    }

    // ------------------------------------------------------------------
    // Answers

    /// The front-end's own answers, onto the stdout line while it is free.
    fn flush_local(&mut self) {
        while let Some(line) = self.local.front() {
            if !self.out.try_line(line) {
                break;
            }
            self.local.pop_front();
        }
    }

    fn pump(&mut self, core: &mut impl Core, now: Instant) {
        self.flush_local();
        for i in 0..self.vconns.len() {
            self.pump_one(core, i, now);
        }
        let (keep, gone): (Vec<VConn>, Vec<VConn>) =
            std::mem::take(&mut self.vconns).into_iter().partition(|v| !v.done);
        self.vconns = keep;
        for v in gone {
            if v.closed.is_none() {
                if let Some(p) = core.pipe(v.id) {
                    p.close();
                    core.wake(v.id);
                }
            }
        }
    }

    fn pump_one(&mut self, core: &mut impl Core, i: usize, now: Instant) {
        loop {
            let Some(v) = self.vconns.get_mut(i) else { return };
            if v.done {
                return;
            }
            if let Some(held) = &v.held {
                if !self.out.emit(v.id).line(held) {
                    return;
                }
                v.held = None;
            }
            // stdout is full: the pipe is left as it is, so its connection
            // stops reading the upstream (the writer wakes the loop).
            if !self.out.has_room() {
                return;
            }
            let mut emit = self.out.emit(v.id);
            let (used, event) = match v.closed.as_mut() {
                Some(pipe) => {
                    let r = v.reader.closed(pipe.received(), &mut emit);
                    pipe.consume(r.0);
                    r
                }
                None => match core.pipe(v.id) {
                    Some(pipe) if pipe.conn_done() => {
                        // The connection shut its sending side and lingers,
                        // reading until our side closes: what it wrote is all
                        // there will be, and our side closes now.
                        let last = std::mem::take(pipe);
                        pipe.close();
                        core.wake(v.id);
                        v.closed = Some(last);
                        continue;
                    }
                    Some(pipe) => {
                        let r = v.reader.pump(pipe.received(), &mut emit);
                        pipe.consume(r.0);
                        r
                    }
                    None => {
                        v.closed = Some(core.closed(v.id).unwrap_or_default());
                        continue;
                    }
                },
            };
            if used > 0 && v.closed.is_none() {
                core.wake(v.id);
            }
            match event {
                Some(e) => self.on_event(i, e, now),
                None => {
                    if v_closed_and_stuck(self.vconns.get(i)) {
                        // Closed with nothing more to say (an idle one).
                        if let Some(v) = self.vconns.get_mut(i) {
                            v.done = true;
                        }
                    }
                    return;
                }
            }
        }
    }

    fn on_event(&mut self, i: usize, event: Event, now: Instant) {
        let Some(v) = self.vconns.get_mut(i) else { return };
        match event {
            Event::Head(head) => self.on_head(i, head),
            Event::Message(m) => self.on_message(i, m),
            Event::Streamed => {
                // Too large to read for ids: taken as the answer it
                // almost surely is (a tool's result, a batch's array).
                if let Job::Post(o) = &mut v.job {
                    o.owed.clear();
                }
            }
            Event::Endpoint(data) => self.on_endpoint(&data),
            Event::End { text } => {
                let keep = v.head.as_ref().is_some_and(|h| h.keep_alive) && v.closed.is_none();
                self.on_end(i, None, &text, now);
                if let Some(v) = self.vconns.get_mut(i) {
                    if keep && !matches!(v.job, Job::Delete) {
                        v.job = Job::Idle;
                        v.reader = Reader::default();
                        v.head = None;
                        v.fallback = false;
                        v.dropped.clear();
                        v.reused = true;
                        v.idle_since = now;
                    } else {
                        v.done = true;
                    }
                }
            }
            Event::Broken(why) => {
                let retry = match &v.job {
                    Job::Post(o) if v.reused && v.head.is_none() => Some(o.as_ref().clone()),
                    _ => None,
                };
                v.done = true;
                match retry {
                    // A reused connection the exchange closed as the
                    // request went in: sent again on a new one.
                    Some(o) => {
                        debug!("stdio: connection {} closed before answering; sending again", v.id);
                        v.job = Job::Idle;
                        self.queue.push_front(o);
                    }
                    None if matches!(v.job, Job::Idle) => {}
                    None => {
                        warn!("stdio: {why}");
                        self.on_end(i, Some(&why), "", now);
                    }
                }
            }
        }
    }

    fn on_head(&mut self, i: usize, head: Head) {
        let Some(v) = self.vconns.get_mut(i) else { return };
        match &v.job {
            Job::Post(o) if o.initialize && !o.replay => {
                if (200..300).contains(&head.status) {
                    if let Some(s) = &head.session {
                        self.session = Some(s.clone());
                    }
                } else if (400..500).contains(&head.status)
                    && matches!(self.transport, Transport::Streamable)
                    && head.status != 401
                    && head.status != 403
                {
                    // Perhaps a legacy server: its answer is kept until
                    // the GET of the same URL says.
                    v.fallback = true;
                }
            }
            Job::Get if head.status == 405 || (head.status == 200 && !head.event_stream) => {
                debug!("stdio: the server offers no GET stream (HTTP {}, no event stream)", head.status);
                self.get = GetStream::Never;
            }
            Job::Stream if head.status != 200 || !head.event_stream => {
                warn!("stdio: the legacy SSE stream was refused: HTTP {} {}", head.status, head.reason);
            }
            _ => {}
        }
        v.head = Some(head);
    }

    fn on_message(&mut self, i: usize, mut m: Vec<u8>) {
        let Some(v) = self.vconns.get_mut(i) else { return };
        let status = v.head.as_ref().map_or(200, |h| h.status);
        let stream = matches!(v.job, Job::Get | Job::Stream);
        if !is_jsonrpc(&m) || (stream && status != 200) {
            // stdout carries JSON-RPC only: a body that is not (an OAuth
            // error, a framework's 404 page, a refused stream's error) is
            // logged; a request it should have answered gets an error
            // naming the status at the end of the answer.
            warn!(
                "stdio: {} bytes from the upstream (HTTP {status}) that are not a message for the host",
                m.len()
            );
            if v.dropped.is_empty() {
                // The start of it names the cause in the error (an OAuth
                // `invalid_token`, a framework's `Not Found`).
                v.dropped = String::from_utf8_lossy(m.get(..200).unwrap_or(&m)).into_owned();
            }
            return;
        }
        if v.fallback {
            v.fallback_answer.push(m);
            return;
        }
        let answers = answered_ids(&m);
        let is_legacy_stream = matches!(v.job, Job::Stream);
        match &mut v.job {
            Job::Post(o) => {
                if let Some(id) = &o.single {
                    // A stdio host matches by id only: an error to the one
                    // request is its answer, whatever id it carries.
                    if let Some((answer_id, true)) = answers.first().map(|(id, e)| (id.clone(), *e)) {
                        if !same_id(&answer_id, id) && answers.len() == 1 {
                            if let Some(fixed) = with_id(&m, id) {
                                debug!("stdio: an error answer (HTTP {status}) took the request's id");
                                m = fixed;
                            }
                        }
                        o.owed.clear();
                    }
                } else if let Some(fixed) = batch_error(&m, &answers, &o.owed) {
                    // One error to a whole batch under an id none of its
                    // requests has (a 404's `"server-error"`): each request
                    // gets it under its own id, as the batch's answer.
                    debug!("stdio: an error answer (HTTP {status}) to a batch took its requests' ids");
                    m = fixed;
                    o.owed.clear();
                }
                for (id, _) in &answers {
                    o.owed.retain(|owed| !same_id(owed, id));
                }
                if o.initialize {
                    self.protocol = protocol_of(&m).or(self.protocol.take());
                }
                if o.replay {
                    return;
                }
            }
            Job::Stream | Job::Get => {}
            Job::Idle | Job::Delete => return,
        }
        if is_legacy_stream || matches!(self.transport, Transport::Legacy { .. }) {
            for (id, _) in &answers {
                self.legacy_owed.retain(|owed| !same_id(owed, id));
                if let Some(at) = self.swallow.iter().position(|s| same_id(s, id)) {
                    self.swallow.remove(at);
                    self.protocol = protocol_of(&m).or(self.protocol.take());
                    debug!("stdio: the replayed initialize was answered");
                    return;
                }
            }
            if self.protocol.is_none() {
                self.protocol = protocol_of(&m);
            }
        }
        let Some(v) = self.vconns.get_mut(i) else { return };
        if !self.out.emit(v.id).line(&m) {
            v.held = Some(m);
        }
    }

    fn on_endpoint(&mut self, data: &[u8]) {
        let Some(endpoint) = resolve_endpoint(&self.path, data) else {
            warn!("stdio: an endpoint event with no usable URL");
            return;
        };
        info!("stdio: legacy SSE transport; messages go to {endpoint}");
        let probed = match std::mem::replace(
            &mut self.transport,
            Transport::Legacy { endpoint: Some(endpoint), stream_open: true, retry_at: None },
        ) {
            Transport::Probing { line, .. } => Some(*line),
            Transport::Legacy { endpoint: Some(_), .. } => None,
            Transport::Legacy { endpoint: None, .. } | Transport::Streamable => None,
        };
        if let Some(line) = probed {
            self.queue.push_front(line);
            return;
        }
        // A new stream after one was lost: the host's session is set up
        // again, its answer kept from the host.
        if let Some(init) = self.init.clone() {
            let waiting_init = self.queue.iter().any(|o| o.initialize);
            if !waiting_init && self.vconns.iter().all(|v| !is_init_post(&v.job)) {
                if self.initialized {
                    self.queue.push_front(Outgoing {
                        line: br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec(),
                        initialized: true,
                        ..Outgoing::default()
                    });
                }
                let mut replay = init;
                replay.replay = true;
                self.swallow.extend(replay.owed.iter().cloned());
                replay.owed.clear();
                self.queue.push_front(replay);
            }
        }
    }

    /// The end of an exchange (`why`: it broke).
    fn on_end(&mut self, i: usize, why: Option<&str>, text: &str, now: Instant) {
        let Some(v) = self.vconns.get_mut(i) else { return };
        let (status, reason) = v.head.as_ref().map_or((0, String::new()), |h| (h.status, h.reason.clone()));
        let ok = (200..300).contains(&status) && why.is_none();
        let job = std::mem::replace(&mut v.job, Job::Idle);
        let fallback = std::mem::take(&mut v.fallback);
        match job {
            Job::Post(o) if fallback => {
                let answer = std::mem::take(&mut v.fallback_answer);
                info!("stdio: initialize got HTTP {status}; trying the legacy SSE transport at the same URL");
                self.transport = Transport::Probing { line: o, answer, status };
            }
            Job::Post(o) => {
                let legacy = matches!(self.transport, Transport::Legacy { .. });
                if legacy {
                    // Its answers come on the stream, owed since it was sent
                    // (one may come before this POST's own answer): if the
                    // POST failed, those still owed get the error.
                    if !ok && !o.replay {
                        let cause = failure(status, &reason, why, text);
                        for id in &o.owed {
                            if let Some(at) = self.legacy_owed.iter().position(|x| same_id(x, id)) {
                                self.legacy_owed.remove(at);
                                self.reply_local(id, rpc::INTERNAL_ERROR, &cause);
                            }
                        }
                    }
                } else if !o.owed.is_empty() && !o.replay {
                    let text = if text.trim().is_empty() { v.dropped.as_str() } else { text };
                    let cause = failure(status, &reason, why, text);
                    for id in &o.owed {
                        self.reply_local(id, rpc::INTERNAL_ERROR, &cause);
                    }
                }
                if o.initialized && ok {
                    self.initialized = true;
                    if matches!(self.transport, Transport::Streamable) && self.get == GetStream::NotYet {
                        self.get = match self.session {
                            Some(_) => GetStream::Due(now),
                            None => GetStream::Never,
                        };
                    }
                }
            }
            Job::Get => {
                if self.get == GetStream::Open {
                    self.get = match (status, self.stop) {
                        (_, Stop::Running) if status == 200 => GetStream::Due(now + REOPEN),
                        (405, _) | (_, Stop::Draining(_) | Stop::Deleting(_) | Stop::Done(_)) => {
                            GetStream::Never
                        }
                        _ => GetStream::Due(now + REOPEN_FAILED),
                    };
                }
            }
            Job::Stream => self.stream_lost(status, now),
            Job::Delete => {
                debug!("stdio: session deleted (HTTP {status})");
                if let Stop::Deleting(_) = self.stop {
                    self.stop = Stop::Done(now);
                }
            }
            Job::Idle => {}
        }
    }

    /// The legacy stream ended (or was refused).
    fn stream_lost(&mut self, status: u16, now: Instant) {
        let probing = matches!(self.transport, Transport::Probing { .. });
        if probing {
            // No legacy stream either: the host gets initialize's answer.
            if let Transport::Probing { line, answer, status: init_status } =
                std::mem::replace(&mut self.transport, Transport::Streamable)
            {
                warn!("stdio: no legacy SSE stream at the URL either (HTTP {status})");
                if answer.is_empty() {
                    if let Some(id) = &line.single {
                        let cause = format!("the upstream refused initialize (HTTP {init_status})");
                        self.reply_local(id, rpc::INTERNAL_ERROR, &cause);
                    }
                }
                for mut m in answer {
                    if let (Some(id), Some((aid, true))) = (&line.single, answered_ids(&m).first().cloned()) {
                        if !same_id(&aid, id) {
                            m = with_id(&m, id).unwrap_or(m);
                        }
                    }
                    self.local.push_back(m);
                }
            }
            return;
        }
        let owed = std::mem::take(&mut self.legacy_owed);
        for id in &owed {
            self.reply_local(id, rpc::INTERNAL_ERROR, "the upstream's SSE stream ended before the answer");
        }
        if let Transport::Legacy { endpoint, stream_open, retry_at } = &mut self.transport {
            warn!("stdio: the legacy SSE stream ended (HTTP {status}); opening it again");
            *endpoint = None;
            *stream_open = false;
            *retry_at = Some(now + if status == 200 { REOPEN } else { REOPEN_FAILED });
        }
    }

    // ------------------------------------------------------------------
    // Requests

    fn in_flight(&self) -> usize {
        self.vconns.iter().filter(|v| matches!(v.job, Job::Post(_))).count()
    }

    fn send_queued(&mut self, core: &mut impl Core, now: Instant) {
        while let Some(front) = self.queue.front() {
            let target = match &self.transport {
                Transport::Streamable => self.path.clone(),
                Transport::Legacy { endpoint: Some(e), .. } => e.clone(),
                Transport::Legacy { endpoint: None, .. } | Transport::Probing { .. } => return,
            };
            // Nothing overtakes an initialize (later requests need its
            // session) or its `notifications/initialized` (a server may
            // refuse requests before it: MCP lifecycle, initialization).
            if self.vconns.iter().any(|v| is_handshake_post(&v.job)) || self.in_flight() >= MAX_IN_FLIGHT {
                return;
            }
            if front.initialize && !front.replay && matches!(self.transport, Transport::Streamable) {
                self.session = None;
                self.protocol = None;
            }
            let Some(o) = self.queue.pop_front() else { return };
            let legacy = matches!(self.transport, Transport::Legacy { .. });
            if legacy {
                self.legacy_owed.extend(o.owed.iter().cloned());
            }
            let request = self.request("POST", &target, Some(&o.line), !legacy);
            match self.send(core, request, Job::Post(Box::new(o)), now) {
                Ok(()) => {}
                Err(job) => {
                    if let Job::Post(o) = job {
                        let cause = "the proxy could not open a connection for the request";
                        self.legacy_owed.retain(|x| !o.owed.iter().any(|id| same_id(x, id)));
                        for id in &o.owed {
                            self.reply_local(id, rpc::INTERNAL_ERROR, cause);
                        }
                    }
                    return;
                }
            }
        }
    }

    fn open_streams(&mut self, core: &mut impl Core, now: Instant) {
        if let GetStream::Due(t) = self.get {
            if now >= t && self.session.is_some() && self.stop == Stop::Running {
                self.get = GetStream::Open;
                let request = self.request("GET", &self.path.clone(), None, true);
                if self.send(core, request, Job::Get, now).is_err() {
                    self.get = GetStream::Due(now + REOPEN_FAILED);
                }
            }
        }
        // A legacy stream carries answers owed: opened while draining too.
        if !matches!(self.stop, Stop::Running | Stop::Draining(_)) {
            return;
        }
        let due = match &self.transport {
            Transport::Legacy { stream_open: false, retry_at, .. } => retry_at.map_or(true, |t| now >= t),
            Transport::Probing { .. } => true,
            _ => false,
        };
        if due && !self.stream_busy() {
            if let Transport::Legacy { stream_open, retry_at, .. } = &mut self.transport {
                *stream_open = true;
                *retry_at = None;
            }
            let request = self.request("GET", &self.path.clone(), None, false);
            if self.send(core, request, Job::Stream, now).is_err() {
                self.stream_lost(0, now);
            }
        }
    }

    fn stream_busy(&self) -> bool {
        self.vconns.iter().any(|v| matches!(v.job, Job::Stream))
    }

    fn advance_stop(&mut self, core: &mut impl Core, now: Instant) {
        if self.out.failed() && matches!(self.stop, Stop::Running) {
            warn!("stdio: stdout closed; ending");
            self.stdin_eof = true;
            self.stop = Stop::Draining(now);
        }
        if let Stop::Draining(since) = self.stop {
            // Owed: lines not sent, answers not read, a legacy answer
            // still to come on the stream, an initialize whose transport
            // is being probed.
            let idle = self.queue.is_empty()
                && self.stdin_buf.is_empty()
                && self.in_flight() == 0
                && self.local.is_empty()
                && self.legacy_owed.is_empty()
                && !matches!(self.transport, Transport::Probing { .. });
            if idle || self.hurry || now >= since + DRAIN {
                if !idle {
                    let cause = match self.hurry {
                        true => "the proxy is ending (SIGTERM) before the upstream answered".to_string(),
                        false => format!("stdin ended and the upstream did not answer within {DRAIN:?}"),
                    };
                    warn!("stdio: answers still owed after {DRAIN:?} or at SIGTERM; each gets an error");
                    self.answer_owed(&cause, now);
                }
                self.stop = Stop::Done(now);
                if self.session.is_some() && matches!(self.transport, Transport::Streamable) {
                    let request = self.request("DELETE", &self.path.clone(), None, true);
                    if self.send(core, request, Job::Delete, now).is_ok() {
                        self.stop = Stop::Deleting(now);
                    }
                }
            }
        }
        if let Stop::Deleting(since) = self.stop {
            if now >= since + DELETE_WAIT {
                warn!("stdio: the session's DELETE got no answer in {DELETE_WAIT:?}");
                self.stop = Stop::Done(now);
            }
        }
        if let Stop::Done(_) = self.stop {
            self.flush_local();
            self.out.close();
        }
    }

    /// The session ends with answers owed: each request still owed one
    /// (unread on stdin, queued, in flight, probing) gets an error with its
    /// id, so no host waits for ever.
    fn answer_owed(&mut self, cause: &str, now: Instant) {
        self.closing = true;
        let mut owed: Vec<Vec<u8>> = Vec::new();
        loop {
            self.take_lines(now);
            if self.queue.is_empty() {
                break;
            }
            for o in std::mem::take(&mut self.queue) {
                if !o.replay {
                    owed.extend(o.owed);
                }
            }
        }
        let legacy = matches!(self.transport, Transport::Legacy { .. });
        for v in &mut self.vconns {
            if let Job::Post(o) = &mut v.job {
                if !o.replay && !legacy {
                    owed.append(&mut o.owed);
                }
            }
            // Whatever they would still say comes too late: closed.
            if matches!(v.job, Job::Post(_) | Job::Stream) {
                v.job = Job::Idle;
                v.done = true;
            }
        }
        owed.append(&mut self.legacy_owed);
        if let Transport::Probing { line, .. } = &mut self.transport {
            owed.extend(line.single.take());
        }
        for id in owed {
            self.reply_local(&id, rpc::INTERNAL_ERROR, cause);
        }
    }

    /// The request's bytes: `session`: with the session's headers.
    fn request(&self, method: &str, target: &str, body: Option<&[u8]>, session: bool) -> Vec<u8> {
        let accept = match body {
            Some(_) => "application/json, text/event-stream",
            None => "text/event-stream",
        };
        let mut r = format!("{method} {target} HTTP/1.1\r\nHost: {}\r\nAccept: {accept}\r\n", self.host);
        if let Some(b) = body {
            r.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
        }
        if session {
            if let Some(s) = &self.session {
                r.push_str(&format!("Mcp-Session-Id: {s}\r\n"));
            }
            if let Some(p) = &self.protocol {
                r.push_str(&format!("MCP-Protocol-Version: {p}\r\n"));
            }
        }
        if let Some(t) = &self.client_token {
            r.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        r.push_str("\r\n");
        let mut bytes = r.into_bytes();
        bytes.extend_from_slice(body.unwrap_or_default());
        bytes
    }

    /// Writes `request` on an idle connection, or a new one.
    fn send(&mut self, core: &mut impl Core, request: Vec<u8>, job: Job, now: Instant) -> Result<(), Job> {
        let reusable = self.vconns.iter().position(|v| {
            matches!(v.job, Job::Idle)
                && !v.done
                && v.closed.is_none()
                && now.saturating_duration_since(v.idle_since) < IDLE_REUSE
        });
        let i = match reusable {
            Some(i) => i,
            None => {
                let Some(id) = core.open() else {
                    warn!("stdio: no connection could be opened");
                    return Err(job);
                };
                self.vconns.push(VConn {
                    id,
                    job: Job::Idle,
                    reader: Reader::default(),
                    head: None,
                    closed: None,
                    held: None,
                    idle_since: now,
                    reused: false,
                    fallback: false,
                    fallback_answer: Vec::new(),
                    dropped: String::new(),
                    done: false,
                });
                self.vconns.len() - 1
            }
        };
        let Some(v) = self.vconns.get_mut(i) else { return Err(job) };
        let Some(pipe) = core.pipe(v.id) else {
            v.done = true;
            return Err(job);
        };
        pipe.send(&request);
        v.job = job;
        core.wake(v.id);
        Ok(())
    }
}

fn v_closed_and_stuck(v: Option<&VConn>) -> bool {
    v.is_some_and(|v| v.closed.is_some() && v.reader.is_done() && v.held.is_none())
}

fn is_init_post(job: &Job) -> bool {
    matches!(job, Job::Post(o) if o.initialize)
}

fn is_handshake_post(job: &Job) -> bool {
    matches!(job, Job::Post(o) if o.initialize || o.initialized)
}

/// Why requests got no answer, for their error.
fn failure(status: u16, reason: &str, why: Option<&str>, text: &str) -> String {
    let mut cause = match (why, status) {
        (Some(w), 0) => format!("no answer from the upstream: {w}"),
        (Some(w), _) => format!("the upstream's answer (HTTP {status} {reason}) was cut: {w}"),
        (None, s) if (200..300).contains(&s) => {
            format!("the upstream's answer (HTTP {status} {reason}) held no response to this request")
        }
        (None, _) => format!("the upstream answered HTTP {status} {reason}"),
    };
    let text = text.trim();
    if !text.is_empty() {
        let excerpt: String = text.chars().filter(|c| !c.is_control()).take(200).collect();
        cause.push_str(": ");
        cause.push_str(&excerpt);
    }
    cause
}

fn trim_ws(mut line: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = line {
        if !json::is_ws(*first) {
            break;
        }
        line = rest;
    }
    while let [rest @ .., last] = line {
        if !json::is_ws(*last) {
            break;
        }
        line = rest;
    }
    line
}

/// The responses in `m` (an object or a batch): each one's id text and
/// whether it is an error.
fn answered_ids(m: &[u8]) -> Vec<(Vec<u8>, bool)> {
    let Ok(top) = json::parse_value(m) else { return Vec::new() };
    let mut out = Vec::new();
    let mut one = |v: json::Value| {
        let (Ok(method), Ok(id), Ok(error)) = (
            json::find_member(m, &v, "method"),
            json::find_member(m, &v, "id"),
            json::find_member(m, &v, "error"),
        ) else {
            return;
        };
        if method.value.is_some() {
            return;
        }
        let id = id.value.map_or(&b"null"[..], |v| v.bytes(m));
        out.push((id.to_vec(), error.value.is_some()));
    };
    match top.kind {
        json::Kind::Array => {
            let _ = json::for_each_element(m, &top, |v| {
                if matches!(v.kind, json::Kind::Object { .. }) {
                    one(v);
                }
                Ok::<(), json::ScanError>(())
            });
        }
        json::Kind::Object { .. } => one(top),
        _ => {}
    }
    out
}

/// `m` is a JSON-RPC 2.0 message, or a batch of them: each an object with
/// `"jsonrpc": "2.0"` and a `method`, a `result` or an `error`.
fn is_jsonrpc(m: &[u8]) -> bool {
    let Ok(top) = json::parse_value(m) else { return false };
    let one = |v: &json::Value| {
        let member = |k| json::find_member(m, v, k).ok().and_then(|l| l.value);
        matches!(v.kind, json::Kind::Object { .. })
            && member("jsonrpc").is_some_and(|j| j.is_str(m, "2.0"))
            && (member("method").is_some() || member("result").is_some() || member("error").is_some())
    };
    match top.kind {
        json::Kind::Array => {
            let mut all = true;
            let mut any = false;
            let _ = json::for_each_element(m, &top, |v| {
                any = true;
                all &= one(&v);
                Ok::<(), json::ScanError>(())
            });
            any && all
        }
        _ => one(&top),
    }
}

fn same_id(a: &[u8], b: &[u8]) -> bool {
    a == b || IdKey::of(a).is_some_and(|k| Some(k) == IdKey::of(b))
}

/// The answer to a batch whose requests are `owed` when `m` is one error
/// object under an id none of them has: an array of that error, once under
/// each request's id.
fn batch_error(m: &[u8], answers: &[(Vec<u8>, bool)], owed: &[Vec<u8>]) -> Option<Vec<u8>> {
    let [(id, true)] = answers else { return None };
    if owed.is_empty() || m.first() != Some(&b'{') || owed.iter().any(|o| same_id(o, id)) {
        return None;
    }
    let mut out = b"[".to_vec();
    for (n, owed) in owed.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&with_id(m, owed)?);
    }
    out.push(b']');
    Some(out)
}

/// `m` (one response object) with its `id` replaced by `id`.
fn with_id(m: &[u8], id: &[u8]) -> Option<Vec<u8>> {
    let top = json::parse_value(m).ok()?;
    let v = json::find_member(m, &top, "id").ok()?.value?;
    let mut out = Vec::with_capacity(m.len() + id.len());
    out.extend_from_slice(m.get(..v.start)?);
    out.extend_from_slice(id);
    out.extend_from_slice(m.get(v.end..)?);
    Some(out)
}

/// `result.protocolVersion` of an `initialize` answer.
fn protocol_of(m: &[u8]) -> Option<String> {
    let top = json::parse_value(m).ok()?;
    let result = json::find_member(m, &top, "result").ok()?.value?;
    let v = json::find_member(m, &result, "protocolVersion").ok()?.value?;
    let s = v.decode_str(m)?;
    // Only a token goes into a header.
    s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)).then_some(s)
}

/// The POST target an `endpoint` event names, as a path and query: an
/// absolute URL's authority is the proxy's (the exchange rewrites it), so
/// only its path counts; a relative one resolves against the stream's path.
fn resolve_endpoint(stream_path: &str, data: &[u8]) -> Option<String> {
    let data = std::str::from_utf8(trim_ws(data)).ok()?;
    if data.is_empty() || data.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return None;
    }
    let lower = data.to_ascii_lowercase();
    let path = if data.starts_with('?') {
        format!("{stream_path}{data}")
    } else if lower.starts_with("http://") || lower.starts_with("https://") {
        let after = data.get(data.find("://")? + 3..)?;
        match after.find(['/', '?']) {
            Some(at) => after.get(at..)?.to_string(),
            None => "/".to_string(),
        }
    } else if data.starts_with('/') {
        data.to_string()
    } else {
        let dir = stream_path.rfind('/').map_or("/", |at| stream_path.get(..=at).unwrap_or("/"));
        format!("{dir}{data}")
    };
    Some(path)
}

#[cfg(test)]
mod tests;

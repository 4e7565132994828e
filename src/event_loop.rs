//! The only owner of `mio::Poll`: the listener, a slab of `Conn`s addressed
//! by token, deadlines, accept backpressure, the upstream keep-alive pool and
//! signals. One thread; nothing here can stop the process except shutdown.

use crate::config::{read_identity_file, Config};
use crate::conn::{Conn, Ctx, Verdict};
use crate::limits::{IDENTITY_POLL, MAX_CONTROL_LINE};
use crate::limits::{MAX_CONNECTIONS, MAX_POOLED_UPSTREAM, POOL_IDLE_TIMEOUT, RESERVED_FDS, SHUTDOWN_GRACE};
use crate::mcp::identity::{self, Identity};
use crate::sys::{self, FileStamp, Signals, StdinChannel, StdinRead};
use log::{debug, error, info, warn};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const LISTENER: Token = Token(usize::MAX);
const SIGNALS: Token = Token(usize::MAX - 1);
const STDIN: Token = Token(usize::MAX - 2);
const WAKER: Token = Token(usize::MAX - 3);
const IDENTITY_FILE: Token = Token(usize::MAX - 4);

/// Token of a connection's client (`side` 0) or upstream (`side` 1) socket.
fn token(slot: usize, side: usize) -> Token {
    Token(slot << 1 | side)
}

/// How long accepting pauses after the process ran out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The bound proxy, ready to `run`.
pub struct Proxy {
    poll: Poll,
    listener: Option<TcpListener>,
    local_addr: SocketAddr,
    config: Config,
    live: Live,
    watch: Option<IdentityWatch>,
    control: Option<ControlStdin>,
    signals: Signals,
    /// Connections accepted at most: `MAX_CONNECTIONS` or what the
    /// descriptor limit allows, so accept never runs into EMFILE.
    max_conns: usize,
    stop: ShutdownHandle,
    /// MCP sessions seen created through this proxy, keyed by the id the
    /// client holds.
    sessions: std::cell::RefCell<crate::mcp::session::SessionTable>,
}

/// Asks a running `Proxy` to shut down gracefully, as SIGTERM does; for
/// programs and tests that run the proxy in-process.
#[derive(Clone)]
pub struct ShutdownHandle {
    waker: std::sync::Arc<mio::Waker>,
    requested: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.requested.store(true, Ordering::SeqCst);
        if let Err(e) = self.waker.wake() {
            warn!("cannot wake the event loop for shutdown: {e}");
        }
    }
}

/// The connection cap: `MAX_CONNECTIONS`, or what the descriptor limit
/// (raised to the hard limit first) allows at two descriptors per
/// connection (client and upstream). Windows has no such limit.
fn connection_cap() -> usize {
    let Some(soft) = sys::raise_descriptor_limit() else {
        return if cfg!(unix) { 512 } else { MAX_CONNECTIONS };
    };
    let by_fds = soft.saturating_sub(RESERVED_FDS) / 2;
    usize::try_from(by_fds).unwrap_or(usize::MAX).clamp(1, MAX_CONNECTIONS)
}

/// The identity in force: applied to each request when its head is built,
/// so a change reaches the next request and never half of one (R23).
struct Live {
    identity: Identity,
    /// `Bearer <token>`, built once per identity.
    bearer: Vec<u8>,
}

impl Live {
    fn new(identity: Identity) -> Live {
        let bearer = [b"Bearer ".as_slice(), identity.token.as_bytes()].concat();
        Live { identity, bearer }
    }

    fn update(&mut self, identity: Identity, source: &str) {
        if identity == self.identity {
            debug!("identity from {source} unchanged");
            return;
        }
        let token_changed = identity.token != self.identity.token;
        info!(
            "identity updated from {source}: agent {:?}{}",
            identity.agent,
            if token_changed { ", new token" } else { "" }
        );
        *self = Live::new(identity);
    }
}

/// Watches `--identity-file`: through a change notification where the OS
/// has one wired (inotify on the file's directory, Linux), so an idle proxy
/// never wakes up; else by a stat every `IDENTITY_POLL`.
struct IdentityWatch {
    path: std::path::PathBuf,
    seen: Option<FileStamp>,
    next_check: Instant,
    notify: Option<sys::FileWatch>,
    /// The watch reported something about the file since the last check.
    notified: bool,
}

impl IdentityWatch {
    fn stamp(&self) -> Option<FileStamp> {
        sys::file_stamp(&self.path)
    }

    /// When the loop must wake up to poll (never when notified).
    fn wake_at(&self) -> Option<Instant> {
        match self.notify {
            Some(_) => None,
            None => Some(self.next_check),
        }
    }

    /// The watch's descriptor was readable.
    fn on_event(&mut self, registry: &mio::Registry) {
        let Some(w) = self.notify.as_mut() else { return };
        let seen = w.drain();
        self.notified |= seen.changed;
        if seen.lost {
            // The directory itself went away: the watch is dead.
            warn!("identity file directory no longer watched; polling the file instead");
            if let Some(w) = self.notify.take() {
                w.close(registry);
            }
            self.notified = true;
        }
    }

    /// A new identity when the file changed (or `force`, on SIGHUP).
    fn check(&mut self, now: Instant, force: bool) -> Option<Identity> {
        let due = match self.notify {
            Some(_) => self.notified,
            None => now >= self.next_check,
        };
        if !force && !due {
            return None;
        }
        self.notified = false;
        self.next_check = now + IDENTITY_POLL;
        let stamp = self.stamp();
        if !force && stamp == self.seen {
            return None;
        }
        self.seen = stamp;
        match read_identity_file(&self.path) {
            Ok(identity) => Some(identity),
            Err(e) => {
                // The message names the path and the reason, never a value.
                warn!("{e}; keeping the current identity");
                None
            }
        }
    }
}

/// `--control-stdin`: identity objects, one per line; EOF means the wrapper
/// is gone.
struct ControlStdin {
    channel: StdinChannel,
    pending: Vec<u8>,
    /// A line longer than `MAX_CONTROL_LINE` is being skipped.
    discarding: bool,
}

impl ControlStdin {
    fn open(poll: &Poll, waker: &std::sync::Arc<mio::Waker>) -> io::Result<ControlStdin> {
        let channel = StdinChannel::open(poll.registry(), STDIN, waker)?;
        Ok(ControlStdin { channel, pending: Vec::new(), discarding: false })
    }

    /// Read what is there; returns the identities of complete lines and
    /// whether stdin reached EOF.
    fn read(&mut self) -> (Vec<Identity>, bool) {
        let mut out = Vec::new();
        let eof = self.channel.read(&mut self.pending) == StdinRead::Eof;
        while let Some(nl) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=nl).collect();
            if std::mem::take(&mut self.discarding) {
                continue;
            }
            Self::take_line(&line, &mut out);
        }
        if self.pending.len() > MAX_CONTROL_LINE {
            warn!("control stdin: line longer than {MAX_CONTROL_LINE} bytes ignored");
            self.pending.clear();
            self.discarding = true;
        }
        if eof && !self.pending.is_empty() && !self.discarding {
            let line = std::mem::take(&mut self.pending);
            Self::take_line(&line, &mut out);
        }
        (out, eof)
    }

    fn take_line(line: &[u8], out: &mut Vec<Identity>) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match identity::parse(line) {
            Ok(identity) => out.push(identity),
            Err(e) => warn!("control stdin: {e}; keeping the current identity"),
        }
    }
}

struct Slab {
    entries: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Slots freed during the current events batch: they rejoin `free` only
    /// after it, so a stale event can never reach a reused slot.
    freed: Vec<usize>,
    live: usize,
}

impl Slab {
    fn insert(&mut self, conn: Conn) -> usize {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.entries[i] = Some(conn);
                i
            }
            None => {
                self.entries.push(Some(conn));
                self.entries.len() - 1
            }
        }
    }

    fn remove(&mut self, slot: usize) -> Option<Conn> {
        let conn = self.entries.get_mut(slot)?.take()?;
        self.live -= 1;
        self.freed.push(slot);
        Some(conn)
    }

    fn end_batch(&mut self) {
        self.free.append(&mut self.freed);
    }
}

/// Why `Proxy::bind` failed: the listen address (exit 3) or the setup
/// around it (exit 2 for --control-stdin on a file, 1 otherwise).
#[derive(Debug)]
pub enum BindError {
    /// The listener could not be bound.
    Listen(io::Error),
    /// `--control-stdin` needs a pipe, socket or terminal (a console on
    /// Windows), never a regular file or a null device.
    ControlStdin(io::Error),
    /// The poll instance or the signal pipe could not be set up.
    Setup(io::Error),
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindError::Listen(e) => write!(f, "cannot listen: {e}"),
            BindError::ControlStdin(e) => {
                let kinds = if cfg!(windows) { "a pipe or console" } else { "a pipe, socket or terminal" };
                write!(f, "--control-stdin: stdin must be {kinds} ({e})")
            }
            BindError::Setup(e) => write!(f, "cannot set up the event loop: {e}"),
        }
    }
}

impl std::error::Error for BindError {}

impl From<BindError> for io::Error {
    fn from(e: BindError) -> io::Error {
        match e {
            BindError::Listen(e) | BindError::ControlStdin(e) | BindError::Setup(e) => e,
        }
    }
}

impl Proxy {
    /// Bind the listener and install signal handlers.
    pub fn bind(config: Config) -> Result<Proxy, BindError> {
        let poll = Poll::new().map_err(BindError::Setup)?;
        let mut listener = sys::listen(config.listen).map_err(BindError::Listen)?;
        let local_addr = listener.local_addr().map_err(BindError::Listen)?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE).map_err(BindError::Listen)?;
        // mio allows one Waker per Poll: it carries shutdown requests, and
        // signals and stdin where the OS cannot poll them (Windows).
        let waker = std::sync::Arc::new(mio::Waker::new(poll.registry(), WAKER).map_err(BindError::Setup)?);
        let signals = Signals::install(poll.registry(), SIGNALS, &waker).map_err(BindError::Setup)?;
        let live = Live::new(config.identity.clone());
        let watch = config.identity_file.as_ref().map(|path| {
            // Nothing seen yet: the first check (at once) reads the file if it
            // exists, so one created or changed since `config::parse` counts.
            let notify = match sys::FileWatch::new(path, poll.registry(), IDENTITY_FILE) {
                Ok(w) => Some(w),
                Err(e) => {
                    debug!("identity file: no change notification ({e}); polling every {IDENTITY_POLL:?}");
                    None
                }
            };
            let w = IdentityWatch { path: path.clone(), seen: None, next_check: Instant::now(), notify, notified: true };
            if w.stamp().is_none() {
                info!(
                    "identity file {} does not exist yet: waiting for it; until then agent {:?} from the flags",
                    path.display(),
                    config.identity.agent
                );
            }
            w
        });
        let control = if config.control_stdin {
            Some(ControlStdin::open(&poll, &waker).map_err(BindError::ControlStdin)?)
        } else {
            None
        };
        let stop = ShutdownHandle { waker, requested: Default::default() };
        let max_conns = connection_cap();
        debug!("accepting at most {max_conns} connections");
        Ok(Proxy {
            poll,
            listener: Some(listener),
            local_addr,
            config,
            live,
            watch,
            control,
            signals,
            max_conns,
            stop,
            sessions: Default::default(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A handle that stops `run` gracefully from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.stop.clone()
    }

    /// Serve until SIGINT/SIGTERM, then let in-flight exchanges finish for
    /// up to `SHUTDOWN_GRACE`.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut slab = Slab { entries: Vec::new(), free: Vec::new(), freed: Vec::new(), live: 0 };
        let mut pool: Vec<(TcpStream, Instant)> = Vec::new();
        let mut touched: Vec<usize> = Vec::new();
        let mut again: Vec<usize> = Vec::new();
        let mut next_id: u64 = 0;
        let mut accept_paused_until: Option<Instant> = None;
        let mut listener_registered = true;
        let mut shutdown_at: Option<Instant> = None;

        loop {
            let now = Instant::now();
            // The poll timeout is the earliest deadline (a linear scan is fine
            // at MAX_CONNECTIONS; measure before adding a timer wheel).
            // Deadlines change only when a connection is driven, so the
            // earliest one found here also tells, after the poll, whether
            // any has passed.
            let conn_wake = slab.entries.iter().flatten().filter_map(|c| c.deadline(&self.config)).min();
            let mut wake: Option<Instant> = shutdown_at.map(|t| t + SHUTDOWN_GRACE);
            let mut earliest = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));
            if let Some(d) = conn_wake {
                earliest(d);
            }
            if let Some((_, since)) = pool.first() {
                earliest(*since + POOL_IDLE_TIMEOUT);
            }
            if let Some(t) = accept_paused_until {
                earliest(t);
            }
            if let Some(t) = self.watch.as_ref().and_then(IdentityWatch::wake_at) {
                earliest(t);
            }
            let timeout = if again.is_empty() {
                wake.map(|w| w.saturating_duration_since(now))
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let now = Instant::now();
            touched.clear();
            touched.append(&mut again);
            let mut accept_ready = false;
            let mut stop_requested = false;
            let (mut stdin_ready, mut signals_ready) = (false, false);
            for event in events.iter() {
                match event.token() {
                    LISTENER => accept_ready = true,
                    WAKER => {
                        stop_requested |= self.stop.requested.load(Ordering::SeqCst);
                        // Windows delivers console events and stdin through
                        // the waker; elsewhere both reads find nothing.
                        (stdin_ready, signals_ready) = (true, true);
                    }
                    STDIN => stdin_ready = true,
                    SIGNALS => signals_ready = true,
                    IDENTITY_FILE => {
                        if let Some(w) = self.watch.as_mut() {
                            w.on_event(self.poll.registry());
                        }
                    }
                    Token(t) => {
                        let (slot, side) = (t >> 1, t & 1);
                        let Some(Some(conn)) = slab.entries.get_mut(slot) else {
                            continue; // sporadic event for a closed slot
                        };
                        let hup = event.is_read_closed() || event.is_error();
                        let readable = event.is_readable() || hup;
                        let writable = event.is_writable() || event.is_write_closed() || event.is_error();
                        if side == 0 {
                            conn.client_event(readable, writable, hup);
                        } else {
                            conn.upstream_event(readable, writable, hup);
                        }
                        touched.push(slot);
                    }
                }
            }
            if let Some(control) = self.control.as_mut().filter(|_| stdin_ready) {
                let (identities, eof) = control.read();
                for identity in identities {
                    self.live.update(identity, "control stdin");
                }
                if eof {
                    info!("control stdin closed");
                    control.channel.close(self.poll.registry());
                    self.control = None;
                    stop_requested = true;
                }
            }
            if signals_ready {
                let seen = self.signals.drain();
                if seen.hangup {
                    match self.watch.as_mut() {
                        Some(w) => {
                            if let Some(identity) = w.check(now, true) {
                                self.live.update(identity, "identity file (SIGHUP)");
                            }
                        }
                        None => info!("SIGHUP ignored: no --identity-file"),
                    }
                }
                stop_requested |= seen.terminate;
            }
            if stop_requested && shutdown_at.is_none() {
                info!("shutting down: no new connections, {} open", slab.live);
                shutdown_at = Some(now);
                if let Some(mut l) = self.listener.take() {
                    let _ = self.poll.registry().deregister(&mut l);
                }
                // Every connection learns about it on its next drive.
                touched.extend((0..slab.entries.len()).filter(|i| slab.entries[*i].is_some()));
            }
            if let Some(w) = self.watch.as_mut() {
                if let Some(identity) = w.check(now, false) {
                    self.live.update(identity, "identity file");
                }
            }
            if accept_paused_until.is_some_and(|t| now >= t) {
                accept_paused_until = None;
                accept_ready = true;
            }
            if !listener_registered && slab.live < self.max_conns && accept_paused_until.is_none() {
                if let Some(l) = self.listener.as_mut() {
                    if self.poll.registry().register(l, LISTENER, Interest::READABLE).is_ok() {
                        listener_registered = true;
                        accept_ready = true;
                    }
                }
            }
            if accept_ready && listener_registered {
                while let Some(l) = self.listener.as_mut() {
                    if slab.live >= self.max_conns {
                        warn!("{} connections open: accepting paused", self.max_conns);
                        let _ = self.poll.registry().deregister(l);
                        listener_registered = false;
                        break;
                    }
                    match l.accept() {
                        Ok((mut stream, peer)) => {
                            next_id += 1;
                            let slot = slab.free.last().copied().unwrap_or(slab.entries.len());
                            if let Err(e) = self.poll.registry().register(
                                &mut stream,
                                token(slot, 0),
                                Interest::READABLE | Interest::WRITABLE,
                            ) {
                                warn!("cannot register client connection: {e}");
                                continue;
                            }
                            debug!("conn {next_id}: accepted from {peer}");
                            let got = slab.insert(Conn::new(next_id, stream, peer, now));
                            debug_assert_eq!(got, slot, "slot chosen before insert");
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            // EMFILE/ENFILE and friends: back off instead of spinning.
                            warn!("accept failed: {e}; pausing for {ACCEPT_BACKOFF:?}");
                            let _ = self.poll.registry().deregister(l);
                            listener_registered = false;
                            accept_paused_until = Some(now + ACCEPT_BACKOFF);
                            break;
                        }
                    }
                }
            }
            // Connections whose deadline passed (a second scan only when the
            // earliest one has).
            if conn_wake.is_some_and(|d| now >= d) {
                for (i, c) in slab.entries.iter().enumerate() {
                    if c.as_ref().and_then(|c| c.deadline(&self.config)).is_some_and(|d| now >= d) {
                        touched.push(i);
                    }
                }
            }
            touched.sort_unstable();
            touched.dedup();
            let ctx = Ctx {
                config: &self.config,
                bearer: &self.live.bearer,
                token: self.live.identity.token.as_bytes(),
                agent: &self.live.identity.agent,
                now,
                listen_port: self.local_addr.port(),
                shutting_down: shutdown_at.is_some(),
                sessions: &self.sessions,
            };
            for &slot in &touched {
                drive_slot(&self.poll, &mut slab, &mut pool, &mut again, slot, &ctx);
            }
            slab.end_batch();
            // Expire idle pooled upstream connections.
            pool.retain(|(_, since)| now.saturating_duration_since(*since) < POOL_IDLE_TIMEOUT);
            if let Some(t) = shutdown_at {
                if slab.live == 0 {
                    info!("shutdown complete");
                    return Ok(());
                }
                if now >= t + SHUTDOWN_GRACE {
                    warn!("shutdown grace over; closing {} connections", slab.live);
                    return Ok(());
                }
            }
        }
    }
}

/// Drive one connection until it waits, handing it upstream sockets as it
/// asks for them.
fn drive_slot(
    poll: &Poll,
    slab: &mut Slab,
    pool: &mut Vec<(TcpStream, Instant)>,
    again: &mut Vec<usize>,
    slot: usize,
    ctx: &Ctx,
) {
    // Bounded: each NeedUpstream round either attaches a socket or fails.
    for _ in 0..8 {
        let Some(Some(conn)) = slab.entries.get_mut(slot) else {
            return;
        };
        let verdict = conn.drive(ctx);
        if let Some((mut stream, reusable)) = conn.take_released() {
            let _ = poll.registry().deregister(&mut stream);
            if reusable && pool.len() < MAX_POOLED_UPSTREAM {
                pool.push((stream, ctx.now));
            }
        }
        match verdict {
            Verdict::Wait => return,
            Verdict::Again => {
                again.push(slot);
                return;
            }
            Verdict::Close => {
                if let Some(mut conn) = slab.remove(slot) {
                    debug_assert!(conn.close_reason().is_some(), "closed with a reason");
                    let _ = poll.registry().deregister(conn.client());
                }
                return;
            }
            Verdict::NeedUpstream => {
                let pooled = if conn.may_use_pool() { take_pooled(pool, ctx.now) } else { None };
                let (mut stream, reused) = match pooled {
                    Some(s) => (s, true),
                    None => {
                        let addrs = &ctx.config.upstream.addrs;
                        let addr = addrs[conn.connect_attempt() as usize % addrs.len()];
                        match sys::connect(addr) {
                            Ok(s) => (s, false),
                            Err(e) => {
                                conn.connect_failed(ctx, &e);
                                continue;
                            }
                        }
                    }
                };
                if let Err(e) = poll.registry().register(
                    &mut stream,
                    token(slot, 1),
                    Interest::READABLE | Interest::WRITABLE,
                ) {
                    error!("cannot register upstream connection: {e}");
                    conn.connect_failed(ctx, &e);
                    continue;
                }
                conn.attach_upstream(stream, reused);
            }
        }
    }
    again.push(slot);
}

/// The most recently pooled connection that is still open and silent.
fn take_pooled(pool: &mut Vec<(TcpStream, Instant)>, now: Instant) -> Option<TcpStream> {
    while let Some((stream, since)) = pool.pop() {
        if now.saturating_duration_since(since) >= POOL_IDLE_TIMEOUT {
            continue;
        }
        // An idle HTTP/1.1 connection has nothing to say: EOF or data means
        // the upstream closed it or broke framing.
        let mut probe = [0u8; 1];
        match stream.peek(&mut probe) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(stream),
            _ => continue,
        }
    }
    None
}

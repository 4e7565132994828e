//! The only owner of `mio::Poll`: the listener, a slab of `Conn`s addressed
//! by token, deadlines, accept backpressure, the upstream keep-alive pool,
//! the identity sources, the session table and signals. One thread; nothing
//! here can stop the process except shutdown. `run` is a loop of named
//! steps; the state they share lives in `Proxy`.

mod audit_file;
mod credential;
#[cfg(feature = "tls")]
mod dpop;
mod identity;
mod metrics;
mod pool;
#[cfg(feature = "dns-refresh")]
mod resolve;
mod slab;
mod stdio;
mod timers;

use crate::config::Config;
use crate::conn::client_sock::ClientSock;
use crate::conn::{Conn, Ctx, Released, Verdict};
use crate::limits::{
    ACCEPT_BACKOFF, EVENT_CAPACITY, FALLBACK_CONNECTIONS, MAX_CONNECTIONS, MAX_UPSTREAM_ROUNDS, RESERVED_FDS,
    SHUTDOWN_GRACE,
};
use crate::mcp::legacy::Routes;
use crate::mcp::session::SessionTable;
use crate::mcp::stamp::StampMap;
use crate::mcp::tools::Learned;
use crate::obs::audit::Record;
use crate::obs::metrics::Gauges;
use crate::obs::serve::View;
use crate::obs::Observer;
use crate::sys::{self, Signals};
use crate::transport::Transport;
use audit_file::AuditFile;
use identity::{ControlStdin, IdentityWatch, Live};
use log::{debug, error, info, warn};
use metrics::MetricsServer;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use pool::Pool;
use slab::Slab;
use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use timers::Timers;

const LISTENER: Token = Token(usize::MAX);
const SIGNALS: Token = Token(usize::MAX - 1);
const STDIN: Token = Token(usize::MAX - 2);
const WAKER: Token = Token(usize::MAX - 3);
const IDENTITY_FILE: Token = Token(usize::MAX - 4);
const METRICS_LISTENER: Token = Token(usize::MAX - 5);
const HEALTH_PROBE: Token = Token(usize::MAX - 6);
/// The metrics listener's connection `slot` has token `METRICS_CONNS - slot`.
const METRICS_CONNS: usize = usize::MAX - 7;

/// Token of a connection's client (`side` 0) or upstream (`side` 1) socket.
fn token(slot: usize, side: usize) -> Token {
    Token(slot << 1 | side)
}

/// The bound proxy, ready to `run`.
pub struct Proxy {
    poll: Poll,
    listener: Option<TcpListener>,
    /// The listener is registered with the poll (not paused).
    listening: bool,
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
    sessions: RefCell<SessionTable>,
    /// The response head being read, one for all connections (see
    /// `Ctx::response_head`).
    response_head: RefCell<crate::http::head::ResponseHead>,
    /// The stamp map in force: the configured one plus what `tools/list`
    /// answers taught (`learned`, applied after each round).
    stamps: StampMap,
    learned: RefCell<Vec<Learned>>,
    /// The legacy SSE streams relayed, by session (`mcp::legacy`).
    legacy: RefCell<Routes>,
    /// Counters, health, and audit records not yet written.
    obs: RefCell<Observer>,
    audit: Option<AuditFile>,
    metrics: Option<MetricsServer>,
    slab: Slab,
    /// Every connection's deadline.
    timers: Timers,
    pool: Pool,
    /// The upstream host looked up again off the loop (a remote host only).
    #[cfg(feature = "dns-refresh")]
    resolver: Option<resolve::Resolver>,
    /// A connect to the upstream failed this round (`Ctx::connect_failed`).
    connect_failed: std::cell::Cell<bool>,
    /// The upstream answered 401 this round (`Ctx::unauthorized`).
    unauthorized: std::cell::Cell<bool>,
    /// Slots to drive in this round (events, deadlines, shutdown).
    touched: Vec<usize>,
    /// Per slot: already in `touched` this round (all false between rounds).
    touched_marks: Vec<bool>,
    /// Slots cut short by the per-event bound: driven again at once.
    again: Vec<usize>,
    next_id: u64,
    accept_paused_until: Option<Instant>,
    shutdown_at: Option<Instant>,
    /// `--stdio`: the front-end on stdin and stdout (no listener then).
    stdio: Option<(crate::stdio::Bridge, StdioInput)>,
    /// `--token-command`: its runs, and when the next is due.
    credential: Option<credential::Renewer>,
    /// `--dpop`: the proofs of the token in force.
    #[cfg(feature = "tls")]
    dpop: Option<dpop::Signer>,
    /// A `DPoP-Nonce` an upstream answer carried this round.
    dpop_nonce: std::cell::RefCell<Option<Vec<u8>>>,
    /// The scope a 403 `insufficient_scope` asked for this round.
    step_up: std::cell::RefCell<Option<String>>,
    /// Pipes of `--stdio` connections closed this round, with their last
    /// bytes, until the front-end reads them.
    closed_pipes: Vec<(u64, crate::conn::client_sock::Pipe)>,
}

/// What one read of `--stdio`'s stdin may take: what the host writes beyond
/// it waits in the pipe (the host's write blocks) until the front-end has
/// sent what it read.
const STDIN_READ: usize = 64 * 1024;

/// `--stdio`'s stdin: read when the front-end has room (edge-triggered:
/// `ready` remembers an event not yet read to its end).
struct StdioInput {
    channel: sys::StdinChannel,
    ready: bool,
    open: bool,
}

/// What one batch of events asked for besides connection readiness.
#[derive(Default)]
struct Woken {
    accept: bool,
    metrics_accept: bool,
    probe: bool,
    metrics_slots: Vec<usize>,
    stdin: bool,
    signals: bool,
    stop: bool,
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
        return if cfg!(unix) { FALLBACK_CONNECTIONS } else { MAX_CONNECTIONS };
    };
    let by_fds = soft.saturating_sub(RESERVED_FDS) / 2;
    usize::try_from(by_fds).unwrap_or(usize::MAX).clamp(1, MAX_CONNECTIONS)
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
    /// `--audit-log` cannot be opened for appending.
    AuditLog(io::Error),
    /// `--metrics-listen` cannot be bound.
    Metrics(io::Error),
    /// The renewed source (`--token-command`, OAuth; named) gave no token
    /// at its first run (why; never its output).
    FirstToken(&'static str, String),
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
            BindError::AuditLog(e) => write!(f, "cannot open --audit-log: {e}"),
            BindError::Metrics(e) => write!(f, "cannot listen on --metrics-listen: {e}"),
            BindError::FirstToken(source, why) if !cfg!(feature = "tls") || *source == "token-command" => {
                write!(f, "--token-command gave no token at start: {why}")
            }
            BindError::FirstToken(source, why) => {
                write!(f, "the OAuth client ({source}) got no token at start: {why}")
            }
        }
    }
}

impl std::error::Error for BindError {}

impl From<BindError> for io::Error {
    fn from(e: BindError) -> io::Error {
        match e {
            BindError::Listen(e)
            | BindError::ControlStdin(e)
            | BindError::Setup(e)
            | BindError::AuditLog(e)
            | BindError::Metrics(e) => e,
            e @ BindError::FirstToken(..) => io::Error::other(e.to_string()),
        }
    }
}

impl Proxy {
    /// Bind the listener and install signal handlers.
    pub fn bind(mut config: Config) -> Result<Proxy, BindError> {
        // The command's first token, before anything serves: with none,
        // there is nothing to serve with.
        let mut credential = None;
        let mut first_token = None;
        let source = match (&config.token_command, &config.oauth) {
            (Some(argv), _) => Some(credential::Source::Command(argv.clone())),
            #[cfg(feature = "tls")]
            (None, Some(client)) => Some(credential::Source::OAuth(client.clone())),
            _ => None,
        };
        if let Some(source) = source {
            let url = upstream_url(&config);
            let mut c = credential::Renewer::new(source, &url, &config.identity.agent);
            let token = c.first().map_err(|why| BindError::FirstToken(c.source(), why))?;
            c.log_outcome(&credential::Outcome::Renewed {
                token: token.clone(),
                reason: credential::Reason::Start,
            });
            config.identity.token = token.secret.expose().to_string();
            credential = Some(c);
            first_token = Some(token);
        }
        let poll = Poll::new().map_err(BindError::Setup)?;
        let (listener, local_addr) = match config.stdio {
            true => (None, SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0))),
            false => {
                let mut listener = sys::listen(config.listen).map_err(BindError::Listen)?;
                let local_addr = listener.local_addr().map_err(BindError::Listen)?;
                poll.registry()
                    .register(&mut listener, LISTENER, Interest::READABLE)
                    .map_err(BindError::Listen)?;
                (Some(listener), local_addr)
            }
        };
        // mio allows one Waker per Poll: it carries shutdown requests, and
        // signals and stdin where the OS cannot poll them (Windows).
        let waker = std::sync::Arc::new(mio::Waker::new(poll.registry(), WAKER).map_err(BindError::Setup)?);
        let stdio = match config.stdio {
            true => {
                let stdin = sys::StdinChannel::open(poll.registry(), STDIN, &waker)
                    .map_err(BindError::ControlStdin)?;
                let stdin = StdioInput { channel: stdin, ready: true, open: true };
                let wake = waker.clone();
                let out = crate::stdio::out::Stdout::start(std::io::stdout(), move || {
                    let _ = wake.wake();
                })
                .map_err(BindError::Setup)?;
                let client_token = config.client_token.clone();
                let bridge = crate::stdio::Bridge::new(
                    &config.upstream.path,
                    0,
                    client_token,
                    config.connect_timeout,
                    out,
                );
                Some((bridge, stdin))
            }
            false => None,
        };
        let signals = Signals::install(poll.registry(), SIGNALS, &waker).map_err(BindError::Setup)?;
        let mut live = Live::new(config.identity.clone(), &config.tools);
        #[cfg(feature = "tls")]
        let mut dpop = config
            .oauth
            .as_ref()
            .and_then(|c| c.dpop_key().map(|key| dpop::Signer::new(key.clone(), c.upstream_origin())));
        if let Some(token) = &first_token {
            if token.scheme != crate::credentials::Scheme::Bearer {
                live.set_token(token.secret.expose(), token.scheme);
            }
            #[cfg(feature = "tls")]
            if let Some(d) = dpop.as_mut() {
                d.set_token(dpop_bound(token));
            }
        }
        let watch = config
            .identity_file
            .as_ref()
            .map(|path| IdentityWatch::new(path, &poll, IDENTITY_FILE, &config.identity.agent));
        let control = if config.control_stdin {
            Some(ControlStdin::open(&poll, &waker).map_err(BindError::ControlStdin)?)
        } else {
            None
        };
        let audit =
            config.audit_log.as_ref().map(AuditFile::open).transpose().map_err(BindError::AuditLog)?;
        let metrics = match config.metrics_listen {
            Some(addr) => Some(
                MetricsServer::bind(addr, poll.registry(), METRICS_LISTENER).map_err(BindError::Metrics)?,
            ),
            None => None,
        };
        let obs = RefCell::new(Observer::new(audit.is_some()));
        if let (Some(c), Some(token)) = (credential.as_mut(), first_token) {
            c.set_waker(waker.clone());
            let record = Record::CredentialRenewed {
                source: c.source(),
                reason: credential::Reason::Start.as_str(),
                expires_at: token.expires_at,
            };
            obs.borrow_mut().record(epoch_now(), &config.identity.agent, &record);
        }
        for warning in &config.upstream.route_warnings {
            warn!("{warning}");
        }
        info!("upstream {}: {}", config.upstream.authority, config.upstream.route);
        // The host connected to is looked up again: the proxy's, through one.
        #[cfg(feature = "dns-refresh")]
        let resolver = match config.upstream.connect_host() {
            (host, port) if resolve::is_remote(&host) => {
                let wake = waker.clone();
                let wake = move || {
                    let _ = wake.wake();
                };
                Some(resolve::Resolver::start(&host, port, wake, Instant::now()))
            }
            _ => None,
        };
        let stop = ShutdownHandle { waker, requested: Default::default() };
        let max_conns = connection_cap();
        debug!("accepting at most {max_conns} connections");
        let stamps = config.stamps.clone();
        Ok(Proxy {
            poll,
            listening: listener.is_some(),
            listener,
            local_addr,
            config,
            live,
            watch,
            control,
            signals,
            max_conns,
            stop,
            sessions: Default::default(),
            response_head: Default::default(),
            stamps,
            learned: Default::default(),
            legacy: Default::default(),
            obs,
            audit,
            metrics,
            slab: Slab::default(),
            pool: Pool::default(),
            #[cfg(feature = "dns-refresh")]
            resolver,
            connect_failed: Default::default(),
            unauthorized: Default::default(),
            touched: Vec::new(),
            touched_marks: Vec::new(),
            timers: Timers::default(),
            again: Vec::new(),
            next_id: 0,
            accept_paused_until: None,
            shutdown_at: None,
            stdio,
            credential,
            #[cfg(feature = "tls")]
            dpop,
            dpop_nonce: Default::default(),
            step_up: Default::default(),
            closed_pipes: Vec::new(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The metrics listener's address (`--metrics-listen`).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.addr)
    }

    /// A handle that stops `run` gracefully from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.stop.clone()
    }

    /// Serve until SIGINT/SIGTERM (or stdin EOF, or a `ShutdownHandle`),
    /// then let in-flight exchanges finish for up to `SHUTDOWN_GRACE`.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(EVENT_CAPACITY);
        loop {
            let conn_deadline = self.timers.earliest();
            let timeout = self.poll_timeout(conn_deadline, Instant::now());
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let now = Instant::now();
            let mut woken = self.dispatch(&events);
            woken.stop |= self.read_control_stdin(woken.stdin);
            woken.stop |= self.handle_signals(woken.signals, now);
            if woken.stop {
                match self.stdio.as_mut() {
                    Some((bridge, _)) => bridge.terminate(now),
                    None => self.begin_shutdown(now),
                }
            }
            self.check_identity_file(now);
            self.credential_turn(now);
            self.stdio_turn(woken.stdin, now, false);
            self.accept(woken.accept, now);
            self.timers.expired(now, &mut self.touched);
            self.drive_touched(now);
            self.stdio_turn(false, now, true);
            // A 401 seen this round starts its run now, not at the next event.
            if self.unauthorized.get() || self.step_up.borrow().is_some() {
                self.credential_turn(now);
            }
            if self.metrics.is_some() {
                self.serve_metrics(&mut woken, now);
            }
            self.pool.expire(now);
            #[cfg(feature = "dns-refresh")]
            if let Some(r) = self.resolver.as_mut() {
                let failed = self.connect_failed.replace(false);
                if let Some(addrs) = r.turn(now, failed, &self.config.upstream.addrs) {
                    self.config.upstream.addrs = addrs;
                }
            }
            if self.audit.is_some() {
                self.write_audit();
            }
            if self.stdio.as_ref().is_some_and(|(b, _)| b.finished(now)) {
                info!("stdio: done");
                return Ok(());
            }
            if self.shutdown_finished(now) {
                return Ok(());
            }
        }
    }

    /// The `--stdio` front-end's turn, before the connections are driven
    /// (what it wakes is driven this round) and after (the next round,
    /// at once).
    fn stdio_turn(&mut self, stdin: bool, now: Instant, after_drive: bool) {
        let Some((bridge, input)) = self.stdio.as_mut() else { return };
        input.ready |= stdin;
        if input.open && input.ready && bridge.wants_input() {
            let channel = &mut input.channel;
            let mut got = sys::StdinRead::Pending;
            bridge.input(
                |buf| {
                    got = channel.read(buf, STDIN_READ);
                    got == sys::StdinRead::Eof
                },
                now,
            );
            // `Pending`: read to WouldBlock, so the next event says when
            // there is more; `More`: some is left unread (no new event will
            // say so), read when the front-end has room again.
            input.ready = got == sys::StdinRead::More;
            if got == sys::StdinRead::Eof {
                input.open = false;
                input.channel.close(self.poll.registry());
            }
        }
        let wakes = if after_drive { &mut self.again } else { &mut self.touched };
        let mut core = stdio::PipeConns {
            slab: &mut self.slab,
            wakes,
            next_id: &mut self.next_id,
            closed: &mut self.closed_pipes,
            now,
        };
        bridge.turn(&mut core, now);
        if after_drive {
            self.closed_pipes.clear();
        }
    }

    /// How long the poll may sleep: until the earliest of the deadlines, the
    /// pool's next expiry, the accept back-off, the identity poll (where the
    /// file is polled) and the shutdown grace; not at all while some
    /// connection has work left; for ever when nothing is due.
    fn poll_timeout(&self, conn_deadline: Option<Instant>, now: Instant) -> Option<Duration> {
        if !self.again.is_empty()
            || self.stdio.as_ref().is_some_and(|(b, i)| i.open && i.ready && b.wants_input())
        {
            return Some(Duration::ZERO);
        }
        [
            conn_deadline,
            self.metrics.as_ref().and_then(MetricsServer::deadline),
            self.pool.next_expiry(),
            self.accept_paused_until,
            self.watch.as_ref().and_then(IdentityWatch::wake_at),
            self.shutdown_at.map(|t| t + SHUTDOWN_GRACE),
            self.stdio.as_ref().and_then(|(b, _)| b.deadline()),
            self.credential.as_ref().and_then(credential::Renewer::deadline),
            #[cfg(feature = "dns-refresh")]
            self.resolver.as_ref().and_then(resolve::Resolver::due_at),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|wake| wake.saturating_duration_since(now))
    }

    /// Sort one batch of events: connection readiness is recorded on its
    /// `Conn` and the slot marked for driving; the rest is returned.
    fn dispatch(&mut self, events: &Events) -> Woken {
        let mut woken = Woken::default();
        self.touched.clear();
        self.touched.append(&mut self.again);
        for event in events.iter() {
            match event.token() {
                LISTENER => woken.accept = true,
                METRICS_LISTENER => woken.metrics_accept = true,
                HEALTH_PROBE => woken.probe = true,
                Token(t) if t <= METRICS_CONNS && t > METRICS_CONNS - crate::limits::MAX_METRICS_CONNS => {
                    woken.metrics_slots.push(METRICS_CONNS - t);
                }
                WAKER => {
                    woken.stop |= self.stop.requested.load(Ordering::SeqCst);
                    // Windows delivers console events and stdin through the
                    // waker; elsewhere both reads find nothing.
                    (woken.stdin, woken.signals) = (true, true);
                }
                STDIN => woken.stdin = true,
                SIGNALS => woken.signals = true,
                IDENTITY_FILE => {
                    if let Some(w) = self.watch.as_mut() {
                        w.on_event(self.poll.registry());
                    }
                }
                Token(t) => {
                    let (slot, side) = (t >> 1, t & 1);
                    let Some(Some(conn)) = self.slab.entries.get_mut(slot) else {
                        continue; // sporadic event for a closed slot
                    };
                    let hup = event.is_read_closed() || event.is_error();
                    let readable = event.is_readable() || hup;
                    let writable = event.is_writable() || event.is_write_closed() || event.is_error();
                    if side == 0 {
                        conn.client_event(readable, writable, hup);
                    } else {
                        conn.upstream().event(readable, writable, hup);
                    }
                    self.touched.push(slot);
                }
            }
        }
        woken
    }

    /// Identities from `--control-stdin`; true at EOF (the wrapper is gone:
    /// shut down).
    fn read_control_stdin(&mut self, ready: bool) -> bool {
        let Some(control) = self.control.as_mut().filter(|_| ready) else {
            return false;
        };
        let (identities, eof) = control.read();
        if eof {
            info!("control stdin closed");
            control.channel.close(self.poll.registry());
            self.control = None;
        }
        for identity in identities {
            self.set_identity(identity, "control stdin");
        }
        eof
    }

    /// SIGHUP re-reads the identity file; true on SIGINT/SIGTERM.
    fn handle_signals(&mut self, ready: bool, now: Instant) -> bool {
        if !ready {
            return false;
        }
        let seen = self.signals.drain();
        if seen.reopen {
            match self.audit.as_mut() {
                Some(a) => a.on_reopen_signal(),
                None => info!("SIGUSR1 ignored: no --audit-log"),
            }
        }
        let mut identity_seen = None;
        if seen.hangup {
            match self.watch.as_mut() {
                Some(w) => {
                    if let Some(identity) = w.check(now, true) {
                        identity_seen = Some(identity);
                    }
                }
                None => info!("SIGHUP ignored: no --identity-file"),
            }
        }
        if let Some(identity) = identity_seen {
            self.set_identity(identity, "identity file (SIGHUP)");
        }
        seen.terminate
    }

    /// `--token-command`'s turn: a run that is due starts, a finished one's
    /// token is in force for the next request (open streams keep theirs).
    fn credential_turn(&mut self, now: Instant) {
        if self.unauthorized.replace(false) {
            if let Some(c) = self.credential.as_mut() {
                c.refused(now);
            }
        }
        if cfg!(feature = "tls") {
            if let Some(scope) = self.step_up.borrow_mut().take() {
                // No token with more scope coming: the waiting request goes
                // again as it was, and its second 403 is relayed.
                if !self.credential.as_mut().is_some_and(|c| c.step_up(&scope, now)) {
                    self.live.bump();
                }
            }
        }
        #[cfg(feature = "tls")]
        if let (Some(nonce), Some(d)) = (self.dpop_nonce.borrow_mut().take(), self.dpop.as_mut()) {
            if d.set_nonce(&nonce) {
                debug!("dpop: the upstream sent a new nonce; it goes in the next proofs");
                self.live.bump();
            }
        }
        let Some(c) = self.credential.as_mut() else { return };
        let Some(outcome) = c.turn(now) else { return };
        c.log_outcome(&outcome);
        let source = c.source();
        let record = match outcome {
            credential::Outcome::Renewed { token, reason } => {
                self.live.set_token(token.secret.expose(), token.scheme);
                #[cfg(feature = "tls")]
                if let Some(d) = self.dpop.as_mut() {
                    d.set_token(dpop_bound(&token));
                }
                Record::CredentialRenewed { source, reason: reason.as_str(), expires_at: token.expires_at }
            }
            credential::Outcome::Failed { why, reason, .. } => {
                Record::CredentialFailed { source, reason: reason.as_str(), why: why.into() }
            }
        };
        self.obs.borrow_mut().record(epoch_now(), &self.live.identity.agent, &record);
    }

    /// A new identity: in force for the next request, and in the audit log.
    fn set_identity(&mut self, identity: crate::mcp::identity::Identity, source: &str) {
        if let Some(previous) = self.live.update(identity, source, &self.config.tools) {
            let record = Record::IdentityChanged { previous: previous.into() };
            self.obs.borrow_mut().record(epoch_now(), &self.live.identity.agent, &record);
        }
    }

    /// The metrics listener's turn: new clients, ready ones, the probe,
    /// deadlines.
    fn serve_metrics(&mut self, woken: &mut Woken, now: Instant) {
        let Some(m) = self.metrics.as_mut() else { return };
        let streams = self.slab.entries.iter().flatten().filter(|c| c.is_streaming()).count();
        let gauges =
            Gauges { sessions: self.sessions.borrow().len(), client_connections: self.slab.live, streams };
        let config = &self.config;
        let view = View {
            port: m.addr.port(),
            client_token: config.client_token.as_deref(),
            restart_grace: config.restart_grace,
            agent: &self.live.identity.agent,
            token_valid: self.credential.as_ref().map(|c| !c.expired()),
            gauges,
            now,
        };
        let registry = self.poll.registry();
        let mut obs = self.obs.borrow_mut();
        if woken.metrics_accept {
            m.accept(registry, METRICS_CONNS);
        }
        if woken.probe {
            m.probe_event(registry, &mut obs, &view);
        }
        for slot in woken.metrics_slots.drain(..) {
            m.drive(slot, registry, &mut obs, &view, config);
        }
        if m.deadline().is_some_and(|d| now >= d) {
            m.expire(registry, &mut obs, &view, config);
        }
    }

    /// The records of this turn, in one write (none while idle).
    fn write_audit(&mut self) {
        let Some(audit) = self.audit.as_mut() else { return };
        let mut obs = self.obs.borrow_mut();
        let Some((buf, records)) = obs.take_pending() else { return };
        audit.write(&buf, records, &mut obs.metrics);
        obs.give_back(buf);
    }

    /// Stop accepting; every open connection finishes its exchange.
    fn begin_shutdown(&mut self, now: Instant) {
        if self.shutdown_at.is_some() {
            return;
        }
        info!("shutting down: no new connections, {} open", self.slab.live);
        self.shutdown_at = Some(now);
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        // Every connection learns about it on its next drive.
        self.touched.extend(self.slab.occupied());
    }

    fn check_identity_file(&mut self, now: Instant) {
        if let Some(identity) = self.watch.as_mut().and_then(|w| w.check(now, false)) {
            self.set_identity(identity, "identity file");
        }
    }

    /// Accept until WouldBlock, within the connection cap (at the cap the
    /// listener is deregistered until a connection closes; after an accept
    /// error such as EMFILE it pauses for `ACCEPT_BACKOFF`).
    fn accept(&mut self, mut ready: bool, now: Instant) {
        if self.accept_paused_until.is_some_and(|t| now >= t) {
            self.accept_paused_until = None;
            ready = true;
        }
        if !self.listening && self.slab.live < self.max_conns && self.accept_paused_until.is_none() {
            if let Some(l) = self.listener.as_mut() {
                if self.poll.registry().register(l, LISTENER, Interest::READABLE).is_ok() {
                    self.listening = true;
                    ready = true;
                }
            }
        }
        if !(ready && self.listening) {
            return;
        }
        while let Some(l) = self.listener.as_mut() {
            if self.slab.live >= self.max_conns {
                warn!("{} connections open: accepting paused", self.max_conns);
                let _ = self.poll.registry().deregister(l);
                self.listening = false;
                return;
            }
            match l.accept() {
                Ok((mut stream, peer)) => {
                    self.next_id += 1;
                    let slot = self.slab.next_slot();
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if let Err(e) = self.poll.registry().register(&mut stream, token(slot, 0), interest) {
                        warn!("cannot register client connection: {e}");
                        continue;
                    }
                    debug!("conn {}: accepted from {peer}", self.next_id);
                    let conn = Conn::new(self.next_id, ClientSock::Tcp(stream), peer, now);
                    let deadline = conn.deadline(&self.config);
                    let got = self.slab.insert(conn);
                    debug_assert_eq!(got, slot, "slot chosen before insert");
                    self.timers.arm(got, deadline);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE/ENFILE and friends: back off instead of spinning.
                    warn!("accept failed: {e}; pausing for {ACCEPT_BACKOFF:?}");
                    let _ = self.poll.registry().deregister(l);
                    self.listening = false;
                    self.accept_paused_until = Some(now + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// Drive every marked connection once, with the identity in force now,
    /// in the order they were marked: the order epoll reported them, in
    /// which a connection served last in one round is not served last in
    /// every round, as it would be in slot order (its requests would make
    /// the tail of the latency).
    fn drive_touched(&mut self, now: Instant) {
        let marks = &mut self.touched_marks;
        self.touched.retain(|&slot| {
            if marks.len() <= slot {
                marks.resize(slot + 1, false);
            }
            // Kept the first time only.
            marks.get_mut(slot).is_some_and(|m| !std::mem::replace(m, true))
        });
        let ctx = Ctx {
            config: &self.config,
            bearer: &self.live.bearer,
            // A `--token-command` token goes in Authorization only.
            token: match self.credential {
                Some(_) => b"",
                None => self.live.identity.token.as_bytes(),
            },
            agent: &self.live.identity.agent,
            now,
            listen_port: self.local_addr.port(),
            shutting_down: self.shutdown_at.is_some(),
            sessions: &self.sessions,
            response_head: &self.response_head,
            policy: &self.live.policy,
            stamps: &self.stamps,
            learned: &self.learned,
            legacy: &self.legacy,
            observing: self.audit.is_some() || self.metrics.is_some(),
            obs: &self.obs,
            connect_failed: &self.connect_failed,
            unauthorized: &self.unauthorized,
            #[cfg(feature = "tls")]
            dpop: self.dpop.as_ref().filter(|d| d.active()).map(|d| d as &dyn crate::conn::editor::Proof),
            #[cfg(not(feature = "tls"))]
            dpop: None,
            dpop_nonce: &self.dpop_nonce,
            step_up: match &self.credential {
                Some(c) if c.steps_up() => Some(&self.step_up),
                _ => None,
            },
            renewable: self.credential.as_ref().is_some_and(|c| c.would_renew(now)),
            token_generation: self.live.generation,
            token_expired: self.credential.as_ref().is_some_and(credential::Renewer::expired),
            record_time: std::cell::Cell::new(None),
        };
        for &slot in &self.touched {
            let (slab, pool, again, closed) =
                (&mut self.slab, &mut self.pool, &mut self.again, &mut self.closed_pipes);
            drive_slot(&self.poll, slab, pool, again, closed, slot, &ctx);
            // Deadlines change only when a connection is driven.
            let conn = self.slab.entries.get(slot).and_then(Option::as_ref);
            self.timers.arm(slot, conn.and_then(|c| c.deadline(&self.config)));
            if let Some(m) = self.touched_marks.get_mut(slot) {
                *m = false;
            }
        }
        self.slab.end_batch();
        // Legacy streams owed an answer of the proxy's are driven next round.
        let wakes = self.legacy.borrow_mut().take_wakes();
        for id in wakes {
            let slot = self.slab.entries.iter().position(|c| c.as_ref().is_some_and(|c| c.id() == id));
            if let Some(slot) = slot {
                self.again.push(slot);
            }
        }
        for l in self.learned.take() {
            if self.stamps.learn(&l.tool, &l.param) {
                info!(
                    "stamping {:?} of tool {:?} from now on: its tools/list schema names it",
                    l.param, l.tool
                );
            }
        }
    }

    /// After shutdown began: done when no connection is left or the grace
    /// is over.
    fn shutdown_finished(&self, now: Instant) -> bool {
        let Some(t) = self.shutdown_at else {
            return false;
        };
        if self.slab.live == 0 {
            info!("shutdown complete");
            return true;
        }
        if now >= t + SHUTDOWN_GRACE {
            warn!("shutdown grace over; closing {} connections", self.slab.live);
            return true;
        }
        false
    }
}

/// Drive one connection until it waits, handing it upstream sockets as it
/// asks for them.
fn drive_slot(
    poll: &Poll,
    slab: &mut Slab,
    pool: &mut Pool,
    again: &mut Vec<usize>,
    closed_pipes: &mut Vec<(u64, crate::conn::client_sock::Pipe)>,
    slot: usize,
    ctx: &Ctx,
) {
    // Bounded: each NeedUpstream round either attaches a socket or fails.
    for _ in 0..MAX_UPSTREAM_ROUNDS {
        let Some(Some(conn)) = slab.entries.get_mut(slot) else {
            return;
        };
        let verdict = conn.drive(ctx);
        if ctx.observing {
            let mut obs = ctx.obs.borrow_mut();
            let ((bytes_in, bytes_out), records) = conn.observed();
            obs.metrics.bytes(bytes_in, bytes_out);
            if !records.is_empty() {
                let ts = ctx.record_time.get().unwrap_or_else(epoch_now);
                ctx.record_time.set(Some(ts));
                for r in records.iter() {
                    obs.record(ts, ctx.agent, r);
                }
                records.clear();
            }
        }
        match conn.upstream().take_released() {
            Some(Released::Reusable(mut stream)) => {
                let _ = poll.registry().deregister(stream.tcp_mut());
                pool.put(stream, ctx.now);
            }
            Some(Released::Spent(mut stream)) => {
                let _ = poll.registry().deregister(stream.tcp_mut());
            }
            None => {}
        }
        match verdict {
            Verdict::Wait => return,
            Verdict::Again => {
                again.push(slot);
                return;
            }
            Verdict::Close => {
                ctx.legacy.borrow_mut().close(conn.id());
                if let Some(conn) = slab.remove(slot) {
                    debug_assert!(conn.close_reason().is_some(), "closed with a reason");
                    let id = conn.id();
                    match conn.into_client() {
                        ClientSock::Tcp(mut tcp) => {
                            let _ = poll.registry().deregister(&mut tcp);
                        }
                        ClientSock::Pipe(pipe) => closed_pipes.push((id, pipe)),
                    }
                }
                return;
            }
            Verdict::NeedUpstream => {
                let pooled = if conn.may_use_pool() { pool.take(ctx.now) } else { None };
                let (mut stream, reused) = match pooled {
                    Some(s) => (s, true),
                    None => {
                        let addrs = &ctx.config.upstream.addrs;
                        let addr = addrs[conn.connect_attempt() as usize % addrs.len()];
                        match sys::connect(addr) {
                            Ok(s) => match Transport::new(s, &ctx.config.upstream) {
                                Ok(t) => (t, false),
                                Err(why) => {
                                    conn.tls_failed(ctx, &why);
                                    continue;
                                }
                            },
                            Err(e) => {
                                conn.connect_failed(ctx, Some(&e));
                                continue;
                            }
                        }
                    }
                };
                let interest = Interest::READABLE | Interest::WRITABLE;
                if let Err(e) = poll.registry().register(stream.tcp_mut(), token(slot, 1), interest) {
                    error!("cannot register upstream connection: {e}");
                    conn.connect_failed(ctx, Some(&e));
                    continue;
                }
                conn.upstream().attach(stream, reused);
            }
        }
    }
    again.push(slot);
}

/// The time since the Unix epoch (for audit records; the loop's deadlines
/// use `Instant`).
fn epoch_now() -> Duration {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
}

/// The upstream URL as `MCP_PROXY_EXEC_INFO` names it.
fn upstream_url(config: &Config) -> String {
    let u = &config.upstream;
    format!("{}://{}{}", if u.https { "https" } else { "http" }, u.authority, u.path)
}

/// The token a DPoP signer binds proofs to: a DPoP-bound one only (an
/// authorization server may answer a DPoP request with a bearer token).
#[cfg(feature = "tls")]
fn dpop_bound(token: &crate::credentials::Token) -> Option<&str> {
    (token.scheme == crate::credentials::Scheme::DPoP).then(|| token.secret.expose())
}

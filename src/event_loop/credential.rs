//! The renewed token sources: `--token-command` (the program that prints
//! the agent's token) and the OAuth client (`--oauth-*`, `crate::oauth`).
//! A source runs at start, again before the token expires
//! (`credentials::renew`), again after a failure (with backoff) and after
//! a 401. Each run is off the loop: the command is a child process (no
//! shell) whose stdout and stderr are read by a thread of its own; the
//! OAuth client's discovery and token request run on a thread of their
//! own. The loop only looks for the run's result, which the thread leaves
//! in a shared slot and announces with the `Waker`. At most one run at a
//! time; a run that has not ended after `RUN_LIMIT` fails (a child is
//! killed); stdout and answers are capped at `OUTPUT_CAP`; the command's
//! stderr goes to the log at `warn`, nowhere else. A failed run keeps the
//! token in force.

use crate::credentials::{output, renew, Scheme, Token};
use crate::mcp::json;
use log::{debug, info, warn};
use mio::Waker;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The environment variable that tells the program why it runs.
pub const EXEC_INFO: &str = "MCP_PROXY_EXEC_INFO";
/// A run that has not ended by then is killed and counts as failed.
pub const RUN_LIMIT: Duration = Duration::from_secs(30);
/// More stdout than this fails the run (a token response is a few KiB).
pub const OUTPUT_CAP: usize = 64 * 1024;
/// A 401 makes a run at most this often.
const REFUSED_EVERY: Duration = Duration::from_secs(10);
/// Lines of a run's stderr logged (each cut to `STDERR_LINE`).
const STDERR_LINES: usize = 20;
const STDERR_LINE: usize = 300;

/// Why the program runs (`MCP_PROXY_EXEC_INFO`'s `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Start,
    /// Ahead of the token's expiry, or again after a failed run.
    Expiring,
    /// The upstream answered 401 to the token in force.
    Unauthorized,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Start => "start",
            Reason::Expiring => "expiring",
            Reason::Unauthorized => "unauthorized",
        }
    }
}

/// What a finished run gave the loop.
#[derive(Debug)]
pub enum Outcome {
    Renewed {
        token: Token,
        reason: Reason,
    },
    /// Why it failed (never its output).
    Failed {
        why: String,
        reason: Reason,
        retry_in: Duration,
    },
}

/// A run in progress: the child (killed by whoever sees `RUN_LIMIT` pass)
/// and the slot its thread fills with stdout, or why it failed.
#[derive(Default)]
struct Running {
    child: Option<std::process::Child>,
    result: Option<Result<Vec<u8>, String>>,
}

type Shared = Arc<Mutex<Running>>;

fn lock(run: &Shared) -> std::sync::MutexGuard<'_, Running> {
    run.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a run gets the token.
#[derive(Clone, Debug)]
pub enum Source {
    /// `--token-command`: the program and its arguments
    /// (`credentials::cmdline::split`).
    Command(Vec<String>),
    /// `--oauth-*`.
    #[cfg(feature = "tls")]
    OAuth(Arc<crate::oauth::Client>),
}

impl Source {
    /// The source's name in the log and in audit records.
    pub fn name(&self) -> &'static str {
        match self {
            Source::Command(_) => "token-command",
            #[cfg(feature = "tls")]
            Source::OAuth(c) => c.source(),
        }
    }

    /// How log lines name it.
    fn label(&self) -> &'static str {
        match self {
            Source::Command(_) => "token command",
            #[cfg(feature = "tls")]
            Source::OAuth(_) => "oauth",
        }
    }
}

/// The source, its runs and when the next one is due.
pub struct Renewer {
    source: Source,
    info_upstream: String,
    agent: String,
    waker: Option<Arc<Waker>>,
    run: Option<(Shared, Reason, Instant)>,
    due: Option<(Instant, Reason)>,
    failures: u32,
    /// When a 401 last made a run: at most one per `REFUSED_EVERY`.
    refused_at: Option<Instant>,
    /// When the token in force expires (seconds since the epoch).
    expires_at: Option<u64>,
}

impl Renewer {
    pub fn new(source: Source, upstream: &str, agent: &str) -> Renewer {
        Renewer {
            source,
            info_upstream: upstream.to_string(),
            agent: agent.to_string(),
            waker: None,
            run: None,
            due: None,
            failures: 0,
            refused_at: None,
            expires_at: None,
        }
    }

    /// The first run, before the loop starts: waited for (at most
    /// `RUN_LIMIT`), since there is no token to serve with until it ends.
    pub fn first(&mut self) -> Result<Token, String> {
        let run = self.start(Reason::Start, None);
        let started = Instant::now();
        let bytes = loop {
            if let Some(result) = finished(&run, started, Instant::now()) {
                break result?;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let token = parse(&bytes, self.dpop_ok())?;
        self.schedule(&token);
        Ok(token)
    }

    /// The upstream refused the token in force (401): a run now, unless one
    /// is running, one failed and waits its backoff, or a 401 made one less
    /// than `REFUSED_EVERY` ago (a server that refuses every token is not
    /// asked to mint one per request).
    pub fn refused(&mut self, now: Instant) {
        let recent = self.refused_at.is_some_and(|at| now.saturating_duration_since(at) < REFUSED_EVERY);
        if self.run.is_some() || self.failures > 0 || recent {
            return;
        }
        match cfg!(feature = "tls") {
            true => info!("{}: the upstream refused the token (401); renewing it", self.source.label()),
            false => info!("token command: the upstream refused the token (401); running it again"),
        }
        self.refused_at = Some(now);
        self.due = Some((now, Reason::Unauthorized));
    }

    /// A 403 asked for more scope: a run now when the OAuth client takes
    /// it (a scope not asked for yet, step-ups left) and none is running;
    /// `false` when no new token comes for it.
    #[cfg_attr(not(feature = "tls"), allow(unused_variables))]
    pub fn step_up(&mut self, scope: &str, now: Instant) -> bool {
        match &self.source {
            Source::Command(_) => false,
            #[cfg(feature = "tls")]
            Source::OAuth(c) => {
                if self.run.is_some() || !c.step_up(scope) {
                    return false;
                }
                info!("oauth: the upstream wants more scope (403); asking for the union");
                self.due = Some((now, Reason::Unauthorized));
                true
            }
        }
    }

    /// Whether this source can ask for more scope (an OAuth client).
    pub fn steps_up(&self) -> bool {
        !matches!(self.source, Source::Command(_))
    }

    /// Whether a 401 now would bring a new token: a run is under way, or
    /// `refused` would start one.
    pub fn would_renew(&self, now: Instant) -> bool {
        let recent = self.refused_at.is_some_and(|at| now.saturating_duration_since(at) < REFUSED_EVERY);
        self.run.is_some() || (self.failures == 0 && !recent)
    }

    /// The token in force is past its expiry.
    pub fn expired(&self) -> bool {
        self.expires_at.is_some_and(|at| !renew::usable(unix_now(), Some(at)))
    }

    /// From now on, a finished run wakes the loop.
    pub fn set_waker(&mut self, waker: Arc<Waker>) {
        self.waker = Some(waker);
    }

    /// When the loop must turn: the next run, or the end of a run's time.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.run {
            Some((_, _, started)) => Some(*started + RUN_LIMIT),
            None => self.due.map(|(at, _)| at),
        }
    }

    /// The loop's turn: starts a run that is due, and gives what a
    /// finished one produced.
    pub fn turn(&mut self, now: Instant) -> Option<Outcome> {
        if let Some((run, reason, started)) = &self.run {
            let reason = *reason;
            let result = finished(run, *started, now)?;
            self.run = None;
            let dpop = self.dpop_ok();
            return Some(match result.and_then(|bytes| parse(&bytes, dpop)) {
                Ok(token) => {
                    self.failures = 0;
                    self.schedule(&token);
                    Outcome::Renewed { token, reason }
                }
                Err(why) => {
                    self.failures = self.failures.saturating_add(1);
                    let retry_in = Duration::from_secs(renew::retry_after(self.failures));
                    self.due = Some((now + retry_in, reason));
                    Outcome::Failed { why, reason, retry_in }
                }
            });
        }
        match self.due {
            Some((at, reason)) if now >= at => {
                match cfg!(feature = "tls") {
                    true => debug!("{}: running ({})", self.source.label(), reason.as_str()),
                    false => debug!("token command: running ({})", reason.as_str()),
                }
                self.due = None;
                let run = self.start(reason, self.waker.clone());
                self.run = Some((run, reason, now));
                None
            }
            _ => None,
        }
    }

    /// The source's name in the log and in audit records.
    pub fn source(&self) -> &'static str {
        self.source.name()
    }

    /// A DPoP-bound token is usable: the OAuth client has a DPoP key.
    fn dpop_ok(&self) -> bool {
        match &self.source {
            Source::Command(_) => false,
            #[cfg(feature = "tls")]
            Source::OAuth(c) => c.dpop_key().is_some(),
        }
    }

    /// A run of the source: the command as a child process, or the OAuth
    /// client on a thread.
    fn start(&self, reason: Reason, waker: Option<Arc<Waker>>) -> Shared {
        match &self.source {
            Source::Command(argv) => start(argv.clone(), self.info(reason), waker),
            #[cfg(feature = "tls")]
            Source::OAuth(client) => start_oauth(client.clone(), waker),
        }
    }

    /// Logs a run's outcome.
    pub fn log_outcome(&self, outcome: &Outcome) {
        if !cfg!(feature = "tls") {
            // Only the command (a literal: no argument to format).
            return match outcome {
                Outcome::Renewed { token, reason } => {
                    info!("token command ({}): new token, {}", reason.as_str(), describe(token))
                }
                Outcome::Failed { why, reason, retry_in } => warn!(
                    "token command ({}) failed: {why}; the token in force is kept; again in {retry_in:?}",
                    reason.as_str()
                ),
            };
        }
        let label = self.source.label();
        match outcome {
            Outcome::Renewed { token, reason } => {
                info!("{label} ({}): new token, {}", reason.as_str(), describe(token))
            }
            Outcome::Failed { why, reason, retry_in } => {
                warn!(
                    "{label} ({}) failed: {why}; the token in force is kept; again in {retry_in:?}",
                    reason.as_str()
                )
            }
        }
    }

    /// The next run before `token` expires (none when it does not).
    fn schedule(&mut self, token: &Token) {
        self.expires_at = token.expires_at;
        let Some(expires_at) = token.expires_at else {
            self.due = None;
            return;
        };
        let now = unix_now();
        let at = renew::renew_at(now, expires_at);
        self.due = Some((Instant::now() + Duration::from_secs(at.saturating_sub(now)), Reason::Expiring));
    }

    /// `MCP_PROXY_EXEC_INFO`: `{"upstream": URL, "agent": NAME, "reason": R}`.
    fn info(&self, reason: Reason) -> String {
        let mut out = Vec::new();
        out.extend_from_slice(b"{\"upstream\":");
        json::write_json_string(&self.info_upstream, &mut out);
        out.extend_from_slice(b",\"agent\":");
        json::write_json_string(&self.agent, &mut out);
        out.extend_from_slice(b",\"reason\":\"");
        out.extend_from_slice(reason.as_str().as_bytes());
        out.extend_from_slice(b"\"}");
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// Seconds since the epoch (0 before it).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A run's stdout as a token this proxy can send (a DPoP-bound one only
/// when it holds the key, `dpop`).
fn parse(bytes: &[u8], dpop: bool) -> Result<Token, String> {
    let token = output::parse(bytes, unix_now()).map_err(|e| format!("its output: {e}"))?;
    if token.scheme == Scheme::DPoP && !dpop {
        return Err(
            "its output has token_type DPoP, which needs a DPoP key (--dpop, with an OAuth source)".into()
        );
    }
    if token.expires_at.is_some_and(|at| !renew::usable(unix_now(), Some(at))) {
        return Err("its output holds a token that has already expired".into());
    }
    Ok(token)
}

/// A run's result once it has one; at `RUN_LIMIT` the child is killed and
/// the run has failed (a thread still reading a pipe that a child of the
/// program holds open ends when that closes; nobody waits for it).
fn finished(run: &Shared, started: Instant, now: Instant) -> Option<Result<Vec<u8>, String>> {
    let mut r = lock(run);
    if let Some(result) = r.result.take() {
        return Some(result);
    }
    if now.saturating_duration_since(started) < RUN_LIMIT {
        return None;
    }
    if let Some(child) = r.child.as_mut() {
        let _ = child.kill();
    }
    Some(Err(format!("it did not finish within {RUN_LIMIT:?} and was killed")))
}

/// Starts an OAuth run: discovery when nothing is known yet, then a token
/// request, on a thread of its own that fills the slot and wakes the loop.
#[cfg(feature = "tls")]
fn start_oauth(client: Arc<crate::oauth::Client>, waker: Option<Arc<Waker>>) -> Shared {
    let run: Shared = Arc::default();
    let theirs = run.clone();
    let spawned = std::thread::Builder::new().name("oauth".into()).spawn(move || {
        let result = client.fetch();
        lock(&theirs).result.get_or_insert(result);
        if let Some(w) = waker {
            let _ = w.wake();
        }
    });
    if let Err(e) = spawned {
        lock(&run).result = Some(Err(format!("cannot start a thread for it: {}", e.kind())));
    }
    run
}

/// Starts a run: the child, and a thread that reads its stdout to the end,
/// reaps it and fills the slot (then wakes the loop).
fn start(argv: Vec<String>, info: String, waker: Option<Arc<Waker>>) -> Shared {
    let run: Shared = Arc::default();
    let failed = |why: String| {
        lock(&run).result = Some(Err(why));
        run.clone()
    };
    let Some((program, args)) = argv.split_first() else {
        return failed("the command is empty".into());
    };
    let spawned = Command::new(program)
        .args(args)
        .env(EXEC_INFO, info)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start {program:?}: {}", e.kind())),
    };
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    lock(&run).child = Some(child);
    let theirs = run.clone();
    let reader = std::thread::Builder::new().name("token-command".into()).spawn(move || {
        if let Some(stderr) = stderr {
            let _ = std::thread::Builder::new()
                .name("token-command-err".into())
                .spawn(move || log_stderr(stderr));
        }
        let out = match stdout {
            Some(mut stdout) => read_capped(&mut stdout),
            None => Err("its stdout was not piped"),
        };
        // Reaped without holding the lock while it waits (the loop takes
        // it to look, or to kill at `RUN_LIMIT`).
        let status = loop {
            let polled = lock(&theirs).child.as_mut().map(std::process::Child::try_wait);
            match polled {
                Some(Ok(None)) => std::thread::sleep(Duration::from_millis(10)),
                other => break other,
            }
        };
        let result = match status {
            Some(Ok(Some(status))) if !status.success() => Err(format!("it exited with {status}")),
            Some(Err(e)) => Err(format!("waiting for it failed: {}", e.kind())),
            _ => out.map_err(str::to_string),
        };
        lock(&theirs).result.get_or_insert(result);
        if let Some(w) = waker {
            let _ = w.wake();
        }
    });
    match reader {
        Ok(_) => run,
        Err(e) => {
            if let Some(child) = lock(&run).child.as_mut() {
                let _ = child.kill();
            }
            failed(format!("cannot start a thread for it: {}", e.kind()))
        }
    }
}

/// stdout up to `OUTPUT_CAP` (read to its end, so the program never
/// blocks on a full pipe; more than the cap is an error).
fn read_capped(stdout: &mut impl Read) -> Result<Vec<u8>, &'static str> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    let mut over = false;
    loop {
        match stdout.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let piece = buf.get(..n).unwrap_or_default();
                if kept.len() + piece.len() > OUTPUT_CAP {
                    over = true;
                } else {
                    kept.extend_from_slice(piece);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err("reading its stdout failed"),
        }
    }
    match over {
        true => Err("it printed more than 64 KiB"),
        false => Ok(kept),
    }
}

/// The program's stderr, line by line at `warn` (the first lines, each
/// cut), the rest read and dropped.
fn log_stderr(stderr: impl Read) {
    let mut lines = BufReader::new(stderr);
    let mut line = Vec::new();
    let mut logged = 0;
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if logged < STDERR_LINES {
            logged += 1;
            let text = String::from_utf8_lossy(&line);
            let text: String =
                text.trim_end().chars().filter(|c| !c.is_control()).take(STDERR_LINE).collect();
            warn!("token command: stderr: {text}");
        } else if logged == STDERR_LINES {
            logged += 1;
            warn!("token command: more on stderr, not logged");
        }
    }
}

/// What a renewal did, for the log (never the token).
pub fn describe(token: &Token) -> String {
    match token.expires_at {
        Some(at) => format!("expires in {} s", at.saturating_sub(unix_now())),
        None => "no expiry".to_string(),
    }
}

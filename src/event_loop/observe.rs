//! The audit log's file and the metrics listener: the I/O around
//! `obs::Observer`.
//!
//! - `AuditFile` appends the buffered records with one write per loop turn
//!   (none while idle), rotates to `PATH.1` before a record would take the
//!   file past `--audit-max-bytes` (a turn's records then take one write
//!   per file), and reopens on SIGUSR1. A failed write is said
//!   once at warn; its records are dropped and counted, relaying goes on.
//! - `MetricsServer` answers `GET /metrics` and `GET /healthz` on its own
//!   listener and never forwards anything. A `/healthz` whose knowledge is
//!   stale waits for a connect to the upstream (no request is sent).

use crate::config::{AuditLog, Config};
use crate::http::guard::{bearer_matches, host_allowed};
use crate::http::head::{parse_request, ParseError};
use crate::http::headers::name;
use crate::http::write;
use crate::limits::{HEALTH_PROBE_TIMEOUT, MAX_METRICS_CONNS, MAX_METRICS_HEAD, METRICS_REQUEST_TIMEOUT};
use crate::obs::metrics::{Gauges, Metrics};
use crate::obs::Observer;
use crate::sys;
use log::{debug, info, warn};
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

/// Where the audit records go.
pub(super) struct AuditFile {
    /// `None`: stderr.
    path: Option<PathBuf>,
    file: Option<File>,
    /// Bytes in the current file (for `--audit-max-bytes`).
    size: u64,
    max_bytes: Option<u64>,
    /// A failure was said at warn; said again only after a success.
    failing: bool,
    /// A failed write ended within a record.
    torn: bool,
}

impl AuditFile {
    /// Opens the log (appending); an error here stops the start.
    pub(super) fn open(cfg: &AuditLog) -> io::Result<AuditFile> {
        let mut a = AuditFile {
            path: cfg.path.clone(),
            file: None,
            size: 0,
            max_bytes: cfg.max_bytes,
            failing: false,
            torn: false,
        };
        if a.path.is_some() {
            a.reopen()?;
        }
        Ok(a)
    }

    fn reopen(&mut self) -> io::Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        self.file = None;
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        self.size = file.metadata().map(|m| m.len()).unwrap_or(0);
        self.file = Some(file);
        Ok(())
    }

    /// SIGUSR1: the file was moved away (logrotate); start a new one.
    pub(super) fn on_reopen_signal(&mut self) {
        if self.path.is_none() {
            return;
        }
        match self.reopen() {
            Ok(()) => info!("audit log reopened"),
            Err(e) => self.fail(&e, 0, None),
        }
    }

    /// Writes `buf` (`records` records): one write, or with
    /// `--audit-max-bytes` one per file the records go to. A file is
    /// rotated before a record would take it past the bound, so a turn's
    /// records (a batch has many) may end one file and begin the next; a
    /// record is never split.
    pub(super) fn write(&mut self, buf: &[u8], records: u64, metrics: &mut Metrics) {
        if self.path.is_none() {
            let mut err = io::stderr().lock();
            if let Err(e) = err.write_all(buf) {
                self.fail(&e, records, Some(metrics));
            }
            return;
        }
        let Some(max) = self.max_bytes else {
            self.append(buf, records, metrics);
            return;
        };
        let mut rest = buf;
        while !rest.is_empty() {
            let mut fit = whole_records(rest, max.saturating_sub(self.size));
            if fit == 0 && self.size > 0 {
                if let Err(e) = self.rotate() {
                    // The bound cannot be kept: the rest goes where it can.
                    self.fail(&e, 0, None);
                    self.append(rest, record_count(rest), metrics);
                    return;
                }
                fit = whole_records(rest, max.saturating_sub(self.size));
            }
            // A record longer than the bound fills a file alone.
            if fit == 0 {
                fit = rest.iter().position(|&b| b == b'\n').map_or(rest.len(), |i| i + 1);
            }
            let (part, tail) = rest.split_at(fit);
            self.append(part, record_count(part), metrics);
            rest = tail;
        }
    }

    /// One write of whole records to the file (opened again first if a
    /// reopen failed).
    fn append(&mut self, buf: &[u8], records: u64, metrics: &mut Metrics) {
        if self.file.is_none() {
            // A reopen that failed: try again, as a write would.
            if let Err(e) = self.reopen() {
                self.fail(&e, records, Some(metrics));
                return;
            }
        }
        let Some(file) = self.file.as_mut() else { return };
        // A record cut by an earlier failed write is ended first, so that
        // what follows starts a line of its own (the cut one does not parse).
        let mut written = 0;
        let result = if std::mem::take(&mut self.torn) {
            file.write_all(&[b"\n".as_slice(), buf].concat())
        } else {
            write_counting(file, buf, &mut written)
        };
        match result {
            Ok(()) => {
                self.size += buf.len() as u64;
                if std::mem::take(&mut self.failing) {
                    info!("audit log writable again");
                }
            }
            Err(e) => {
                // Only the records not written whole are dropped.
                let kept = buf.get(..written).unwrap_or_default();
                self.size += written as u64;
                self.torn = written > 0 && !kept.ends_with(b"\n");
                self.fail(&e, records.saturating_sub(record_count(kept)), Some(metrics));
            }
        }
    }

    fn rotate(&mut self) -> io::Result<()> {
        let Some(path) = self.path.clone() else { return Ok(()) };
        let mut to = path.clone().into_os_string();
        to.push(".1");
        self.file = None;
        std::fs::rename(&path, PathBuf::from(to))?;
        self.reopen()?;
        debug!("audit log rotated");
        Ok(())
    }

    fn fail(&mut self, e: &io::Error, records: u64, metrics: Option<&mut Metrics>) {
        if let Some(m) = metrics {
            m.audit_dropped(records);
        }
        if !std::mem::replace(&mut self.failing, true) {
            warn!("audit log: {}: records are dropped (and counted) until it works again", e.kind());
        }
    }
}

/// The length of the whole records (lines) at the start of `buf` that fit
/// in `room` bytes.
fn whole_records(buf: &[u8], room: u64) -> usize {
    let within = &buf[..buf.len().min(usize::try_from(room).unwrap_or(usize::MAX))];
    within.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
}

/// Records in `buf`: each ends with the one line break it holds.
fn record_count(buf: &[u8]) -> u64 {
    buf.iter().filter(|&&b| b == b'\n').count() as u64
}

/// One client of the metrics listener.
struct MetricsConn {
    stream: TcpStream,
    loopback: bool,
    head: Vec<u8>,
    out: Vec<u8>,
    written: usize,
    deadline: Instant,
    /// A `/healthz` waiting for the probe connect.
    awaits_probe: bool,
}

/// The probe connect of a stale `/healthz`.
struct Probe {
    stream: TcpStream,
    deadline: Instant,
}

/// The `--metrics-listen` listener and its connections.
pub(super) struct MetricsServer {
    listener: TcpListener,
    pub(super) addr: SocketAddr,
    conns: Vec<Option<MetricsConn>>,
    probe: Option<Probe>,
}

/// What the metrics listener needs from the loop to answer.
pub(super) struct View<'a> {
    pub config: &'a Config,
    pub agent: &'a str,
    pub gauges: Gauges,
    pub now: Instant,
}

impl MetricsServer {
    pub(super) fn bind(addr: SocketAddr, registry: &Registry, token: Token) -> io::Result<MetricsServer> {
        let mut listener = sys::listen(addr)?;
        let addr = listener.local_addr()?;
        registry.register(&mut listener, token, Interest::READABLE)?;
        Ok(MetricsServer { listener, addr, conns: Vec::new(), probe: None })
    }

    /// The earliest deadline (a slow client, the probe).
    pub(super) fn deadline(&self) -> Option<Instant> {
        let conns = self.conns.iter().flatten().map(|c| c.deadline);
        conns.chain(self.probe.as_ref().map(|p| p.deadline)).min()
    }

    pub(super) fn accept(&mut self, registry: &Registry, base: usize) {
        loop {
            let (mut stream, peer) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    debug!("metrics listener: accept: {e}");
                    return;
                }
            };
            let Some(slot) = (0..MAX_METRICS_CONNS).find(|&i| !matches!(self.conns.get(i), Some(Some(_))))
            else {
                debug!("metrics listener: {MAX_METRICS_CONNS} connections open: one refused");
                continue;
            };
            if registry
                .register(&mut stream, Token(base - slot), Interest::READABLE | Interest::WRITABLE)
                .is_err()
            {
                continue;
            }
            if self.conns.len() <= slot {
                self.conns.resize_with(slot + 1, || None);
            }
            self.conns[slot] = Some(MetricsConn {
                stream,
                loopback: peer.ip().is_loopback(),
                head: Vec::new(),
                out: Vec::new(),
                written: 0,
                deadline: Instant::now() + METRICS_REQUEST_TIMEOUT,
                awaits_probe: false,
            });
        }
    }

    /// A connection's socket is ready (or a deadline passed): read its
    /// request, answer it, write, close.
    pub(super) fn drive(&mut self, slot: usize, registry: &Registry, obs: &mut Observer, view: &View) {
        let Some(Some(c)) = self.conns.get_mut(slot) else { return };
        let mut done = false;
        if c.out.is_empty() && !c.awaits_probe {
            let mut buf = [0u8; 2048];
            loop {
                match c.stream.read(&mut buf) {
                    Ok(0) => {
                        done = true;
                        break;
                    }
                    Ok(n) => c.head.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        done = true;
                        break;
                    }
                }
                if c.head.len() > MAX_METRICS_HEAD {
                    break;
                }
            }
            match route(&c.head, c.loopback, self.addr.port(), view.config) {
                Route::Incomplete if c.head.len() > MAX_METRICS_HEAD => {
                    c.out = response(431, "text/plain", b"head too large\n")
                }
                Route::Incomplete if done || view.now >= c.deadline => {
                    c.out = response(408, "text/plain", b"request not received in time\n")
                }
                Route::Incomplete => {}
                Route::Answer(status, body) => c.out = response(status, "text/plain", body.as_bytes()),
                Route::Metrics => {
                    let mut text = String::new();
                    obs.metrics.render(view.gauges, &mut text);
                    c.out = response(200, "text/plain; version=0.0.4; charset=utf-8", text.as_bytes());
                }
                Route::Health if obs.health.stale(view.now) => {
                    c.awaits_probe = true;
                }
                Route::Health => c.out = health(obs, view),
            }
        }
        if c.awaits_probe {
            if self.probe.is_none() {
                self.start_probe(registry, obs, view);
            }
            return;
        }
        self.flush(slot, registry, view.now);
    }

    fn flush(&mut self, slot: usize, registry: &Registry, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(slot) else { return };
        let mut close = false;
        while c.written < c.out.len() {
            match c.stream.write(&c.out[c.written..]) {
                Ok(0) => {
                    close = true;
                    break;
                }
                Ok(n) => c.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    close = true;
                    break;
                }
            }
        }
        if (!c.out.is_empty() && c.written >= c.out.len()) || now >= c.deadline + METRICS_REQUEST_TIMEOUT {
            close = true;
        }
        if close {
            if let Some(Some(mut c)) = self.conns.get_mut(slot).map(Option::take) {
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
                let _ = registry.deregister(&mut c.stream);
            }
        }
    }

    fn start_probe(&mut self, registry: &Registry, obs: &mut Observer, view: &View) {
        let addrs = &view.config.upstream.addrs;
        let Some(&addr) = addrs.first() else { return };
        match sys::connect(addr) {
            Ok(mut stream) => {
                if registry.register(&mut stream, super::HEALTH_PROBE, Interest::WRITABLE).is_ok() {
                    let timeout = view.config.connect_timeout.min(HEALTH_PROBE_TIMEOUT);
                    self.probe = Some(Probe { stream, deadline: view.now + timeout });
                    return;
                }
                obs.health.unreachable(view.now);
            }
            Err(_) => obs.health.unreachable(view.now),
        }
        self.answer_waiting(registry, obs, view);
    }

    /// The probe's socket is ready, or its deadline passed.
    pub(super) fn probe_event(&mut self, registry: &Registry, obs: &mut Observer, view: &View) {
        let Some(p) = self.probe.as_mut() else { return };
        let reached = match p.stream.take_error() {
            Ok(None) => match p.stream.peer_addr() {
                Ok(_) => Some(true),
                Err(e) if e.kind() == io::ErrorKind::NotConnected => None,
                Err(_) => Some(false),
            },
            _ => Some(false),
        };
        let reached = match reached {
            Some(r) => r,
            None if view.now >= p.deadline => false,
            None => return,
        };
        if let Some(mut p) = self.probe.take() {
            let _ = registry.deregister(&mut p.stream);
        }
        if reached {
            obs.health.reached(view.now);
        } else {
            obs.health.unreachable(view.now);
        }
        self.answer_waiting(registry, obs, view);
    }

    fn answer_waiting(&mut self, registry: &Registry, obs: &mut Observer, view: &View) {
        for slot in 0..self.conns.len() {
            if let Some(Some(c)) = self.conns.get_mut(slot) {
                if c.awaits_probe {
                    c.awaits_probe = false;
                    c.out = health(obs, view);
                    self.flush(slot, registry, view.now);
                }
            }
        }
    }

    /// Deadlines: slow clients are cut off, a probe with no answer is a failure.
    pub(super) fn expire(&mut self, registry: &Registry, obs: &mut Observer, view: &View) {
        if self.probe.as_ref().is_some_and(|p| view.now >= p.deadline) {
            self.probe_event(registry, obs, view);
        }
        for slot in 0..self.conns.len() {
            let due = self.conns.get(slot).and_then(Option::as_ref).is_some_and(|c| view.now >= c.deadline);
            if due {
                self.drive(slot, registry, obs, view);
                if let Some(Some(c)) = self.conns.get_mut(slot) {
                    if c.out.is_empty() && !c.awaits_probe {
                        c.out = response(408, "text/plain", b"request not received in time\n");
                    }
                    // One more timeout to write what it is owed, then it closes.
                    if view.now >= c.deadline + METRICS_REQUEST_TIMEOUT {
                        if let Some(Some(mut c)) = self.conns.get_mut(slot).map(Option::take) {
                            let _ = registry.deregister(&mut c.stream);
                        }
                        continue;
                    }
                }
                self.flush(slot, registry, view.now);
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    Incomplete,
    Metrics,
    Health,
    Answer(u16, &'static str),
}

/// What a request head asks for, read by `http::head` (the MCP
/// listener's parser) and refused with its status.
fn route(head: &[u8], loopback: bool, port: u16, config: &Config) -> Route {
    let req = match parse_request(head) {
        Ok(Some(h)) => h,
        Ok(None) => return Route::Incomplete,
        Err(e) => return Route::Answer(e.client_status(), refusal_body(e)),
    };
    // The parser takes every request-target form; a route is a path.
    if !req.target.starts_with(b"/") {
        return Route::Answer(400, "bad request\n");
    }
    // On loopback, a Host that is not loopback is a browser page rebound to
    // it (as on the MCP listener); off loopback, the client token is required.
    if loopback && !req.headers.get_name(name::HOST).is_some_and(|h| host_allowed(h, port)) {
        return Route::Answer(403, "Host not allowed\n");
    }
    if let (false, Some(secret)) = (loopback, config.client_token.as_deref()) {
        let authorization = req.headers.get_name(name::AUTHORIZATION);
        if !authorization.is_some_and(|v| bearer_matches(v, secret.as_bytes())) {
            return Route::Answer(401, "client token required\n");
        }
    }
    let path = req.target.split(|&b| b == b'?').next().unwrap_or_default();
    match (req.method.as_slice(), path) {
        (b"GET", b"/metrics") => Route::Metrics,
        (b"GET", b"/healthz") => Route::Health,
        (_, b"/metrics" | b"/healthz") => Route::Answer(405, "only GET\n"),
        _ => Route::Answer(404, "only /metrics and /healthz here\n"),
    }
}

/// The body of the answer to a head `http::head` refused (its status is
/// `client_status`, as on the MCP listener); it names nothing the client sent.
fn refusal_body(e: ParseError) -> &'static str {
    match e {
        ParseError::TooLarge => "head too large\n",
        ParseError::TooManyFields => "too many header fields\n",
        _ if e.client_status() == 501 => "transfer coding not implemented\n",
        _ => "bad request\n",
    }
}

/// A whole answer: the head (the one reason-phrase table), then `body`;
/// the connection closes after it.
fn response(status: u16, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = b"HTTP/1.1 ".to_vec();
    write::push_decimal(&mut out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(write::reason_phrase(status));
    out.extend_from_slice(b"\r\nContent-Type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\nContent-Length: ");
    write::push_decimal(&mut out, body.len() as u64);
    out.extend_from_slice(b"\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n");
    out.extend_from_slice(body);
    out
}

/// `/healthz`: 200 while the upstream answers, 503 once it has been
/// unreachable for longer than the restart grace.
fn health(obs: &Observer, view: &View) -> Vec<u8> {
    let r = obs.health.report(view.now, view.config.restart_grace);
    let mut body = Vec::new();
    body.extend_from_slice(b"{\"status\":");
    body.extend_from_slice(if r.healthy { b"\"ok\"" } else { b"\"unavailable\"" });
    body.extend_from_slice(b",\"agent\":");
    crate::mcp::json::write_json_string(view.agent, &mut body);
    body.extend_from_slice(b",\"upstream_reachable\":");
    body.extend_from_slice(match r.reachable {
        Some(true) => b"true",
        Some(false) => b"false",
        None => b"null",
    });
    let _ = write!(body, ",\"sessions\":{}", view.gauges.sessions);
    body.extend_from_slice(b",\"seconds_since_last_answer\":");
    match r.since_answer {
        Some(d) => {
            let _ = write!(body, "{:.3}", d.as_secs_f64());
        }
        None => body.extend_from_slice(b"null"),
    }
    body.extend_from_slice(b"}\n");
    response(if r.healthy { 200 } else { 503 }, "application/json", &body)
}

/// `write_all` that says how much was written before an error.
fn write_counting(file: &mut File, buf: &[u8], written: &mut usize) -> io::Result<()> {
    while let Some(rest) = buf.get(*written..).filter(|r| !r.is_empty()) {
        match file.write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_records_never_cut_a_record() {
        let buf = b"a\nbb\nccc\n";
        let fits: Vec<usize> = (0..=10).map(|room| whole_records(buf, room)).collect();
        assert_eq!(fits, [0, 0, 2, 2, 2, 5, 5, 5, 5, 9, 9]);
        assert_eq!(whole_records(b"", 10), 0);
        assert_eq!((record_count(buf), record_count(b"")), (3, 0));
    }

    #[test]
    fn an_answer_is_its_head_then_its_body() {
        let got = response(405, "text/plain", b"only GET\n");
        let want = "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\
                    Cache-Control: no-store\r\nConnection: close\r\n\r\nonly GET\n";
        assert_eq!(String::from_utf8_lossy(&got), want);
    }

    fn config(client_token: Option<&str>) -> Config {
        let mut args = vec!["--upstream", "http://127.0.0.1:9/mcp", "--agent", "a"];
        let path = std::env::temp_dir().join(format!("observe-test-secret-{}", std::process::id()));
        if let Some(t) = client_token {
            std::fs::write(&path, t).unwrap();
            args.extend(["--client-token-file", path.to_str().unwrap()]);
        }
        let c = crate::config::parse(args.into_iter().map(String::from), Some("tok".into())).unwrap();
        let _ = std::fs::remove_file(&path);
        c
    }

    fn routed(head: &str, loopback: bool, c: &Config) -> String {
        match route(head.as_bytes(), loopback, 9464, c) {
            Route::Incomplete => "incomplete".into(),
            Route::Metrics => "metrics".into(),
            Route::Health => "health".into(),
            Route::Answer(status, _) => status.to_string(),
        }
    }

    #[test]
    fn routes_by_method_path_host_and_client_token() {
        let open = config(None);
        let guarded = config(Some("s3cret"));
        let get = |path: &str, host: &str, extra: &str| {
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n")
        };
        let cases = [
            (get("/metrics", "127.0.0.1:9464", ""), true, &open, "metrics"),
            (get("/healthz?x", "localhost:9464", ""), true, &open, "health"),
            (get("/metrics", "evil.example", ""), true, &open, "403"),
            (get("/metrics", "127.0.0.1:9465", ""), true, &open, "403"),
            (get("/mcp", "127.0.0.1:9464", ""), true, &open, "404"),
            (get("/metrics", "127.0.0.1:9464", "").replacen("GET", "POST", 1), true, &open, "405"),
            // Off loopback: the client token, whatever the Host.
            (get("/metrics", "192.0.2.2:9464", ""), false, &guarded, "401"),
            (get("/metrics", "192.0.2.2:9464", "Authorization: Bearer nope\r\n"), false, &guarded, "401"),
            (
                get("/metrics", "192.0.2.2:9464", "authorization: Bearer s3cret\r\n"),
                false,
                &guarded,
                "metrics",
            ),
            ("GET /metrics HTTP/1.1\r\nHost: x\r\n".to_string(), true, &open, "incomplete"),
            ("GET /metrics HTTP/2\r\n\r\n".to_string(), true, &open, "400"),
            ("GET metrics HTTP/1.1\r\n\r\n".to_string(), true, &open, "400"),
            ("GET /metrics HTTP/1.1\r\nno colon\r\n\r\n".to_string(), true, &open, "400"),
        ];
        for (head, loopback, c, want) in cases {
            assert_eq!(routed(&head, loopback, c), want, "{head:?} loopback {loopback}");
        }
    }

    /// What the project's head parser refuses, the metrics listener
    /// refuses too, with the MCP listener's status.
    #[test]
    fn heads_the_parser_refuses_are_refused() {
        let open = config(None);
        let many: String = (0..crate::limits::MAX_FIELDS).map(|i| format!("X-{i}: v\r\n")).collect();
        let cases = [
            // The request line.
            ("GET /metrics\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("G(T /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("GET  /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("GET /met rics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.2\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            // A target that is not a path.
            ("GET http://127.0.0.1:9464/metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            // Field lines.
            ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nX-A: b\r\n c\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.1\r\nHost : 127.0.0.1:9464\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n", "400"),
            // Host (RFC 9112 §3.2: 400 for none in HTTP/1.1, or several).
            ("GET /metrics HTTP/1.1\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.1\r\nHost: evil.example\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            // HTTP/1.0 may leave Host out; loopback still wants its own.
            ("GET /metrics HTTP/1.0\r\n\r\n", "403"),
            // Framing the parser cannot use.
            ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "501"),
        ];
        for (head, want) in cases {
            assert_eq!(routed(head, true, &open), want, "{head:?}");
        }
        let too_many = format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n{many}\r\n");
        assert_eq!(
            route(too_many.as_bytes(), true, 9464, &open),
            Route::Answer(431, "too many header fields\n")
        );
        // Line ends of a lone LF are read as the MCP listener reads them.
        assert_eq!(routed("GET /metrics HTTP/1.1\nHost: 127.0.0.1:9464\n\n", true, &open), "metrics");
        // Off loopback with the token, HTTP/1.0 without Host is answered.
        let ten = "GET /healthz HTTP/1.0\r\nAuthorization: Bearer s3cret\r\n\r\n";
        assert_eq!(routed(ten, false, &config(Some("s3cret"))), "health");
    }
}

//! The `--metrics-listen` listener's sockets: accept, register, read each
//! client's bytes into its `obs::serve::Client` and write back what it is
//! owed, and the probe connect a stale `/healthz` waits for. What a request
//! asks for and what it is answered is decided in `obs::serve`; nothing here
//! reads a head or writes an answer's bytes.

use crate::config::Config;
use crate::limits::{HEALTH_PROBE_TIMEOUT, MAX_METRICS_CONNS};
use crate::obs::serve::{Client, View};
use crate::obs::Observer;
use crate::sys;
use log::debug;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

/// One client of the metrics listener: its socket and its exchange.
struct MetricsConn {
    stream: TcpStream,
    client: Client,
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

impl MetricsServer {
    pub(super) fn bind(addr: SocketAddr, registry: &Registry, token: Token) -> io::Result<MetricsServer> {
        let mut listener = sys::listen(addr)?;
        let addr = listener.local_addr()?;
        registry.register(&mut listener, token, Interest::READABLE)?;
        Ok(MetricsServer { listener, addr, conns: Vec::new(), probe: None })
    }

    /// The earliest deadline (a slow client, the probe).
    pub(super) fn deadline(&self) -> Option<Instant> {
        let conns = self.conns.iter().flatten().map(|c| c.client.deadline());
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
            let client = Client::new(peer.ip().is_loopback(), Instant::now());
            if let Some(entry) = self.conns.get_mut(slot) {
                *entry = Some(MetricsConn { stream, client });
            }
        }
    }

    /// A connection's socket is ready (or a deadline passed): read its
    /// request, answer it, write, close.
    pub(super) fn drive(
        &mut self,
        slot: usize,
        registry: &Registry,
        obs: &mut Observer,
        view: &View,
        config: &Config,
    ) {
        let Some(Some(c)) = self.conns.get_mut(slot) else { return };
        if c.client.reading() {
            let ended = read_head(c);
            c.client.decide(ended, obs, view);
        }
        if c.client.awaits_probe() {
            if self.probe.is_none() {
                self.start_probe(registry, obs, view, config);
            }
            return;
        }
        self.flush(slot, registry, view.now);
    }

    fn flush(&mut self, slot: usize, registry: &Registry, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(slot) else { return };
        let mut close = false;
        while !c.client.unwritten().is_empty() {
            match c.stream.write(c.client.unwritten()) {
                Ok(0) => {
                    close = true;
                    break;
                }
                Ok(n) => c.client.wrote(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    close = true;
                    break;
                }
            }
        }
        if close || c.client.finished(now) {
            if let Some(Some(mut c)) = self.conns.get_mut(slot).map(Option::take) {
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
                let _ = registry.deregister(&mut c.stream);
            }
        }
    }

    fn start_probe(&mut self, registry: &Registry, obs: &mut Observer, view: &View, config: &Config) {
        let Some(&addr) = config.upstream.addrs.first() else { return };
        match sys::connect(addr) {
            Ok(mut stream) => {
                if registry.register(&mut stream, super::HEALTH_PROBE, Interest::WRITABLE).is_ok() {
                    let timeout = config.connect_timeout.min(HEALTH_PROBE_TIMEOUT);
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
                if c.client.awaits_probe() {
                    c.client.probe_settled(obs, view);
                    self.flush(slot, registry, view.now);
                }
            }
        }
    }

    /// Deadlines: slow clients are cut off, a probe with no answer is a failure.
    pub(super) fn expire(&mut self, registry: &Registry, obs: &mut Observer, view: &View, config: &Config) {
        if self.probe.as_ref().is_some_and(|p| view.now >= p.deadline) {
            self.probe_event(registry, obs, view);
        }
        for slot in 0..self.conns.len() {
            let due = self
                .conns
                .get(slot)
                .and_then(Option::as_ref)
                .is_some_and(|c| view.now >= c.client.deadline());
            if !due {
                continue;
            }
            self.drive(slot, registry, obs, view, config);
            if let Some(Some(c)) = self.conns.get_mut(slot) {
                // One more timeout to write what it is owed, then it closes.
                if c.client.expire(view.now) {
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

/// Reads what the client has sent, up to the head's bound. Returns whether
/// it will send no more (its side closed, or its socket failed).
fn read_head(c: &mut MetricsConn) -> bool {
    let mut buf = [0u8; 2048];
    while c.client.wants_bytes() {
        match c.stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => c.client.received(buf.get(..n).unwrap_or_default()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
    false
}

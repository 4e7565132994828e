//! The upstream host looked up again, off the event loop: a remote HOST
//! (not an IP address, not `localhost`) is resolved on a short-lived thread
//! of its own after a connect failed (at most once a second) and at least
//! every `RESOLVE_EVERY`, so an upstream behind changing DNS is followed
//! without a restart. The loop never blocks on a lookup: the thread leaves
//! its answer in a shared slot and wakes the loop's `mio::Waker`, and until
//! an answer comes the addresses in force stay. A lookup that fails or
//! finds nothing keeps them too. (A thread per lookup, once a minute at
//! most, and no channel: little code, for the minimal build's size budget.)

use crate::config::lookup;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest time between two lookups.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(60);
/// The shortest time between two lookups asked for by failed connects.
pub const RESOLVE_AFTER_FAILURE: Duration = Duration::from_secs(1);

type Answer = io::Result<Vec<SocketAddr>>;
type Lookup = dyn Fn() -> Answer + Send + Sync;

pub(super) struct Resolver {
    host: String,
    lookup: Arc<Lookup>,
    wake: Arc<dyn Fn() + Send + Sync>,
    /// Where the lookup thread leaves its answer.
    slot: Arc<Mutex<Option<Answer>>>,
    /// A lookup is under way.
    pending: bool,
    /// When the last lookup was asked for.
    asked: Instant,
}

/// Whether `host` is ever looked up again (as at start: an IP address or
/// `localhost` never is).
pub fn is_remote(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>().is_err() && !bare.eq_ignore_ascii_case("localhost")
}

impl Resolver {
    /// The resolver of `host:port`; `wake` tells the loop an answer is there.
    pub(super) fn start(
        host: &str,
        port: u16,
        wake: impl Fn() + Send + Sync + 'static,
        now: Instant,
    ) -> Resolver {
        let name = host.to_string();
        Self::start_with(host, move || lookup(&name, port), wake, now)
    }

    /// `start` with the lookup given (tests).
    pub(super) fn start_with(
        host: &str,
        lookup: impl Fn() -> Answer + Send + Sync + 'static,
        wake: impl Fn() + Send + Sync + 'static,
        now: Instant,
    ) -> Resolver {
        Resolver {
            host: host.to_string(),
            lookup: Arc::new(lookup),
            wake: Arc::new(wake),
            slot: Arc::default(),
            pending: false,
            asked: now,
        }
    }

    /// Starts one lookup on a thread of its own; false if no thread could
    /// be started (the addresses stay).
    fn ask(&self) -> bool {
        let (lookup, wake, slot) = (self.lookup.clone(), self.wake.clone(), self.slot.clone());
        let spawned = std::thread::Builder::new().name("resolver".into()).spawn(move || {
            let answer = lookup();
            if let Ok(mut s) = slot.lock() {
                *s = Some(answer);
            }
            wake();
        });
        spawned.is_ok()
    }

    /// When the next periodic lookup is due (the loop's poll timeout).
    pub(super) fn due_at(&self) -> Option<Instant> {
        (!self.pending).then_some(self.asked + RESOLVE_EVERY)
    }

    /// One turn of the loop: takes the answer if it came (the new
    /// addresses, when they differ from `current`), and starts a lookup
    /// when one is due or a connect failed (`failed`).
    pub(super) fn turn(
        &mut self,
        now: Instant,
        failed: bool,
        current: &[SocketAddr],
    ) -> Option<Vec<SocketAddr>> {
        let mut changed = None;
        let answer = match self.pending {
            true => self.slot.lock().ok().and_then(|mut s| s.take()),
            false => None,
        };
        if let Some(answer) = answer {
            self.pending = false;
            match answer {
                Ok(addrs) if addrs.is_empty() => {
                    log::warn!("upstream host {} resolves to nothing now; keeping its addresses", self.host)
                }
                Ok(addrs) => {
                    if addrs != current {
                        log::info!("upstream host {} now resolves to {addrs:?}", self.host);
                        changed = Some(addrs);
                    }
                }
                Err(e) => log::warn!(
                    "cannot resolve upstream host {} ({}); keeping its addresses",
                    self.host,
                    e.kind()
                ),
            }
        }
        let since = now.saturating_duration_since(self.asked);
        if !self.pending && (since >= RESOLVE_EVERY || (failed && since >= RESOLVE_AFTER_FAILURE)) {
            self.pending = self.ask();
            self.asked = now;
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_hosts_only() {
        for (host, remote) in [
            ("mcp.example.com", true),
            ("localhost", false),
            ("LOCALHOST", false),
            ("10.0.0.1", false),
            ("[::1]", false),
        ] {
            assert_eq!(is_remote(host), remote, "{host}");
        }
    }

    #[test]
    fn looked_up_after_a_failure_and_periodically_never_blocking() {
        let a: SocketAddr = "10.0.0.1:443".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:443".parse().unwrap();
        let dns: Arc<Mutex<Result<Vec<SocketAddr>, ()>>> = Arc::new(Mutex::new(Ok(vec![a])));
        let lookups = Arc::new(Mutex::new(0));
        let (wake_tx, woken) = std::sync::mpsc::channel();
        let wake_tx = Mutex::new(wake_tx);
        let (d, n) = (dns.clone(), lookups.clone());
        let lookup = move || {
            *n.lock().unwrap() += 1;
            match &*d.lock().unwrap() {
                Ok(v) => Ok(v.clone()),
                Err(()) => Err(io::ErrorKind::NotFound.into()),
            }
        };
        let t0 = Instant::now();
        let wake = move || wake_tx.lock().unwrap().send(()).unwrap();
        let mut r = Resolver::start_with("mcp.example.com", lookup, wake, t0);
        let wait = |r: &mut Resolver, woken: &std::sync::mpsc::Receiver<()>, now, current: &[SocketAddr]| {
            woken.recv_timeout(Duration::from_secs(5)).expect("the thread wakes the loop");
            r.turn(now, false, current)
        };
        // Nothing due yet, no failure: no lookup.
        assert_eq!(r.turn(t0, false, &[a]), None);
        assert_eq!(r.due_at(), Some(t0 + RESOLVE_EVERY));
        // A failed connect asks, but not twice within a second.
        let t1 = t0 + Duration::from_secs(2);
        *dns.lock().unwrap() = Ok(vec![b]);
        assert_eq!(r.turn(t1, true, &[a]), None);
        assert_eq!(r.due_at(), None, "pending");
        assert_eq!(wait(&mut r, &woken, t1, &[a]), Some(vec![b]));
        assert_eq!(r.turn(t1 + Duration::from_millis(500), true, &[b]), None);
        assert_eq!(*lookups.lock().unwrap(), 1);
        // Periodically; the same answer changes nothing.
        let t2 = t1 + RESOLVE_EVERY;
        assert_eq!(r.turn(t2, false, &[b]), None);
        assert_eq!(wait(&mut r, &woken, t2, &[b]), None);
        // A failed or empty lookup keeps the addresses.
        let mut t = t2;
        for answer in [Err(()), Ok(vec![])] {
            *dns.lock().unwrap() = answer;
            t += RESOLVE_EVERY;
            assert_eq!(r.turn(t, false, &[b]), None);
            assert_eq!(wait(&mut r, &woken, t, &[b]), None);
        }
        assert_eq!(*lookups.lock().unwrap(), 4);
    }
}

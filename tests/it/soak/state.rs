//! Shared state: the seeded RNG, the failure list, the panic guard and the outage log.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::OUTAGE_MARGIN;

/// xorshift64*: the fault schedule and each client's pauses, from the seed.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(super) fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Every failure, from a client thread, the fake server or the driver; the
/// first one stops the soak.
#[derive(Default)]
pub(super) struct Failures(Mutex<Vec<String>>);

impl Failures {
    pub(super) fn add(&self, who: &str, what: String) {
        self.0.lock().unwrap().push(format!("{who}: {what}"));
    }

    pub(super) fn any(&self) -> bool {
        !self.0.lock().unwrap().is_empty()
    }

    pub(super) fn list(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Records a panic of the thread it lives in as a failure.
pub(super) struct PanicGuard<'a>(pub(super) &'a Failures, pub(super) String);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.add(&self.1, "panicked (message above)".into());
        }
    }
}

/// When the upstream was dying or down: from just before its kill to the
/// moment it listens again.
#[derive(Default)]
pub(super) struct Outages(Mutex<Vec<(Instant, Option<Instant>)>>);

impl Outages {
    pub(super) fn begin(&self) {
        self.0.lock().unwrap().push((Instant::now(), None));
    }

    pub(super) fn end(&self) {
        if let Some(last) = self.0.lock().unwrap().last_mut() {
            last.1 = Some(Instant::now());
        }
    }

    /// Whether an outage overlaps [since - OUTAGE_MARGIN, now].
    pub(super) fn since(&self, since: Instant) -> bool {
        let from = since.checked_sub(OUTAGE_MARGIN).unwrap_or(since);
        // Every outage began in the past: it overlaps unless it ended before `from`.
        self.0.lock().unwrap().iter().any(|(_, up)| up.map_or(true, |up| up >= from))
    }
}

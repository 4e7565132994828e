//! The upstream's health as `/healthz` reports it: whether the upstream was
//! reachable at the last attempt (a request's connect, or the probe connect
//! `/healthz` makes when what it knows is older than `FRESH`), since when it
//! has been unreachable, and when it last answered. The clock is handed in.

use std::time::{Duration, Instant};

/// What `/healthz` knows is fresh for this long; older, it connects again
/// (no request sent) before it answers.
pub const FRESH: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct Health {
    /// When the last connect attempt ended, and whether it reached the upstream.
    last_attempt: Option<(Instant, bool)>,
    unreachable_since: Option<Instant>,
    last_answer: Option<Instant>,
}

/// What `/healthz` answers.
#[derive(Debug, PartialEq)]
pub struct Report {
    pub healthy: bool,
    pub reachable: Option<bool>,
    pub since_answer: Option<Duration>,
}

impl Health {
    /// A connect reached the upstream.
    pub fn reached(&mut self, now: Instant) {
        self.last_attempt = Some((now, true));
        self.unreachable_since = None;
    }

    /// The upstream answered (a response head).
    pub fn answered(&mut self, now: Instant) {
        self.reached(now);
        self.last_answer = Some(now);
    }

    /// A connect failed (refused, timed out).
    pub fn unreachable(&mut self, now: Instant) {
        self.last_attempt = Some((now, false));
        self.unreachable_since.get_or_insert(now);
    }

    /// What is known is too old to answer from: probe first.
    pub fn stale(&self, now: Instant) -> bool {
        !self.last_attempt.is_some_and(|(at, _)| now.saturating_duration_since(at) <= FRESH)
    }

    /// Healthy while the upstream answers; unhealthy once it has been
    /// unreachable for longer than `grace` (a restart within the grace is
    /// not a failure: sessions survive it).
    pub fn report(&self, now: Instant, grace: Duration) -> Report {
        let down_for = self.unreachable_since.map(|t| now.saturating_duration_since(t));
        Report {
            healthy: self.last_attempt.is_some() && !down_for.is_some_and(|d| d > grace),
            reachable: self.last_attempt.map(|(_, ok)| ok),
            since_answer: self.last_answer.map(|t| now.saturating_duration_since(t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_only_past_the_grace_and_healthy_again_once_reached() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(5);
        let mut h = Health::default();
        assert!(h.stale(t0) && !h.report(t0, grace).healthy, "nothing known yet");
        h.answered(t0);
        assert!(!h.stale(t0 + FRESH) && h.stale(t0 + FRESH * 2));
        h.unreachable(t0 + Duration::from_secs(1));
        h.unreachable(t0 + Duration::from_secs(3));
        let r = h.report(t0 + Duration::from_secs(6), grace);
        assert_eq!((r.healthy, r.reachable), (true, Some(false)), "down for 5 s: within the grace");
        let r = h.report(t0 + Duration::from_secs(7), grace);
        assert_eq!((r.healthy, r.since_answer), (false, Some(Duration::from_secs(7))));
        h.reached(t0 + Duration::from_secs(8));
        assert!(h.report(t0 + Duration::from_secs(8), grace).healthy);
    }
}

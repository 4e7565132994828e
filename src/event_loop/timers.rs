//! Connection deadlines in a min-heap, so that a wake-up costs the
//! connections it concerns and not every open one: with thousands of idle
//! SSE streams open, scanning each one's deadline twice per wake-up cost
//! more than the request that woke the loop.
//!
//! A deadline changes only when its connection is inserted or driven; the
//! event loop then calls `arm` with the new one. A deadline that moved
//! later leaves the earlier entry in place: when that comes up, the
//! connection is driven (finding nothing due) and armed with what is then
//! its deadline. So a busy connection, whose deadline moves later with
//! every request, costs the heap nothing per request, only a wake-up once
//! per timeout. Entries are never removed from the heap in place: an entry
//! is live while it matches what its slot is armed with, and stale ones
//! are dropped when they reach the top, or all at once when they outnumber
//! the live ones.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

#[derive(Default)]
pub(super) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, usize)>>,
    /// The deadline each slot is armed with (`None`: none, or its entry
    /// was taken by `expired`).
    armed: Vec<Option<Instant>>,
    /// Slots armed with a deadline.
    live: usize,
}

impl Timers {
    /// Slot `slot` is now due at `deadline` (`None`: never, or no
    /// connection there any more). A slot armed with an earlier deadline
    /// keeps it: it comes up early, once.
    pub(super) fn arm(&mut self, slot: usize, deadline: Option<Instant>) {
        if self.armed.len() <= slot {
            self.armed.resize(slot + 1, None);
        }
        let Some(current) = self.armed.get_mut(slot) else { return };
        if *current == deadline || current.zip(deadline).is_some_and(|(c, d)| c <= d) {
            return;
        }
        match (current.is_some(), deadline.is_some()) {
            (false, true) => self.live += 1,
            (true, false) => self.live -= 1,
            _ => {}
        }
        *current = deadline;
        if let Some(d) = deadline {
            self.heap.push(Reverse((d, slot)));
            if self.heap.len() > 2 * self.live + 64 {
                self.compact();
            }
        }
    }

    /// The earliest armed deadline (perhaps earlier than any connection's
    /// own: see `arm`).
    pub(super) fn earliest(&mut self) -> Option<Instant> {
        while let Some(&Reverse((d, slot))) = self.heap.peek() {
            if self.armed.get(slot).copied().flatten() == Some(d) {
                return Some(d);
            }
            self.heap.pop();
        }
        None
    }

    /// Appends to `out` every slot armed with a deadline at or before `now`,
    /// disarming it: the caller drives it (the connection itself knows
    /// whether anything is due) and arms it again with its deadline.
    pub(super) fn expired(&mut self, now: Instant, out: &mut Vec<usize>) {
        while let Some(&Reverse((d, slot))) = self.heap.peek() {
            if d > now {
                return;
            }
            self.heap.pop();
            if let Some(armed) = self.armed.get_mut(slot).filter(|a| **a == Some(d)) {
                *armed = None;
                self.live -= 1;
                out.push(slot);
            }
        }
    }

    /// Rebuild the heap from the live entries alone.
    fn compact(&mut self) {
        self.heap =
            self.armed.iter().enumerate().filter_map(|(slot, d)| d.map(|d| Reverse((d, slot)))).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(t0: Instant, ms: u64) -> Option<Instant> {
        Some(t0 + Duration::from_millis(ms))
    }

    #[test]
    fn an_earlier_deadline_replaces_a_later_one_and_a_later_one_waits() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        assert_eq!(t.earliest(), None);
        t.arm(3, at(t0, 30));
        t.arm(1, at(t0, 10));
        t.arm(2, at(t0, 20));
        assert_eq!(t.earliest(), at(t0, 10));
        // Moved later: the earlier entry stands, and nothing is pushed.
        t.arm(1, at(t0, 40));
        assert_eq!(t.heap.len(), 3);
        assert_eq!(t.earliest(), at(t0, 10));
        // Moved earlier: that one counts.
        t.arm(3, at(t0, 5));
        assert_eq!(t.earliest(), at(t0, 5));
        // Closed: never due.
        t.arm(2, None);
        let mut due = Vec::new();
        t.expired(t0 + Duration::from_millis(25), &mut due);
        assert_eq!(due, vec![3, 1]);
        assert_eq!(t.earliest(), None);
        // Driven and armed again with their own deadlines.
        t.arm(1, at(t0, 40));
        t.arm(3, at(t0, 35));
        assert_eq!(t.earliest(), at(t0, 35));
        due.clear();
        t.expired(t0 + Duration::from_secs(1), &mut due);
        assert_eq!(due, vec![3, 1]);
        assert_eq!(t.earliest(), None);
        assert_eq!(t.live, 0);
    }

    #[test]
    fn a_slot_comes_back_once_however_often_it_was_armed() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.arm(0, at(t0, 10));
        t.arm(0, at(t0, 10));
        assert_eq!(t.heap.len(), 1);
        // Closed, then a new connection in the slot at the same instant:
        // two entries, one slot due once.
        t.arm(0, None);
        t.arm(0, at(t0, 10));
        let mut due = Vec::new();
        t.expired(t0 + Duration::from_secs(1), &mut due);
        assert_eq!(due, vec![0]);
    }

    #[test]
    fn the_heap_stays_within_twice_the_live_slots() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        // Busy connections whose deadline moves later on every request
        // push nothing.
        for i in 0..100_000u64 {
            t.arm((i % 3) as usize, at(t0, 1_000 + i));
        }
        assert_eq!(t.heap.len(), 3);
        assert_eq!(t.earliest(), at(t0, 1_000));
        // Connections opened and closed in turn on three slots, the
        // deadline moving earlier each time: stale entries are compacted.
        for i in 0..100_000u64 {
            let slot = (i % 3) as usize;
            t.arm(slot, None);
            t.arm(slot, at(t0, 900 - i % 900));
        }
        assert!(t.heap.len() <= 2 * 3 + 64, "{} entries", t.heap.len());
        let mut due = Vec::new();
        t.expired(t0 + Duration::from_secs(1_000), &mut due);
        due.sort_unstable();
        assert_eq!(due, vec![0, 1, 2]);
    }
}

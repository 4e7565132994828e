//! When to run the credential program again: ahead of a token's expiry,
//! and after a failed run. Pure: times are unix seconds passed in.

/// Renew when this share of the lifetime is left (1/5: 12 minutes of an
/// hour's token), bounded by the two leads below.
const RENEW_SHARE: u64 = 5;

/// Least lead before expiry: room for a slow program and a request in
/// flight when the token is swapped.
const MIN_RENEW_LEAD: u64 = 30;

/// Most lead before expiry: a day-long token need not be renewed hours
/// early.
const MAX_RENEW_LEAD: u64 = 15 * 60;

/// The first wait after a failed run; each failure after it doubles it.
const RETRY_FIRST: u64 = 10;

/// The longest wait between failed runs: a broken program is not run more
/// than every 5 minutes, and a fixed one is picked up within 5 minutes.
const RETRY_MAX: u64 = 300;

/// When to renew a token obtained at `obtained_at` that expires at
/// `expires_at`: with a fifth of its lifetime left, but at least 30 s and at
/// most 15 min before expiry, and never before half its lifetime (a token
/// living a minute or less would otherwise be renewed back to back); one
/// already expired, at once.
pub fn renew_at(obtained_at: u64, expires_at: u64) -> u64 {
    let lifetime = expires_at.saturating_sub(obtained_at);
    let lead = (lifetime / RENEW_SHARE).clamp(MIN_RENEW_LEAD, MAX_RENEW_LEAD).min(lifetime / 2);
    expires_at.saturating_sub(lead).max(obtained_at)
}

/// How long to wait before running the program again after `failures`
/// failed runs in a row: 10 s, 20 s, 40 s, ... up to 300 s (10 s for 0 or 1).
pub fn retry_after(failures: u32) -> u64 {
    // 10 << 5 is past the cap already; the shift stays small.
    let doublings = failures.saturating_sub(1).min(5);
    (RETRY_FIRST << doublings).min(RETRY_MAX)
}

/// Whether a token may still be sent at `now`: not at or past its expiry.
/// A token without an expiry is usable until the upstream refuses it.
pub fn usable(now: u64, expires_at: Option<u64>) -> bool {
    expires_at.map_or(true, |at| now < at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renew_at_a_fifth_of_the_lifetime_clamped() {
        const T: u64 = 1_796_600_000;
        let cases: &[(u64, u64, u64)] = &[
            // A fifth left: 1 h lives 48 min, 10 min lives 8.
            (T, T + 3600, T + 2880),
            (T, T + 600, T + 480),
            (T, T + 4500, T + 3600),
            // At most 15 min early (a fifth of 75 min and more).
            (T, T + 4505, T + 3605),
            (T, T + 86_400, T + 86_400 - 900),
            (0, u64::MAX, u64::MAX - 900),
            // At least 30 s early (a fifth of 150 s and less).
            (T, T + 150, T + 120),
            (T, T + 149, T + 119),
            (T, T + 100, T + 70),
            (T, T + 60, T + 30),
            // A lifetime of a minute or less: at half of it.
            (T, T + 59, T + 30),
            (T, T + 31, T + 16),
            (T, T + 30, T + 15),
            (T, T + 3, T + 2),
            (T, T + 1, T + 1),
            (T, T, T),
            // Expired on arrival, or a clock that went back: at once.
            (T, T - 10, T),
            (T, 0, T),
            (0, 0, 0),
            (0, 20, 10),
        ];
        for &(obtained, expires, want) in cases {
            assert_eq!(renew_at(obtained, expires), want, "obtained {obtained}, expires {expires}");
            assert!(renew_at(obtained, expires) >= obtained);
        }
    }

    #[test]
    fn retry_after_doubles_to_the_cap() {
        let cases: &[(u32, u64)] = &[
            (0, 10),
            (1, 10),
            (2, 20),
            (3, 40),
            (4, 80),
            (5, 160),
            (6, 300),
            (7, 300),
            (64, 300),
            (u32::MAX, 300),
        ];
        for &(failures, want) in cases {
            assert_eq!(retry_after(failures), want, "{failures} failures");
        }
    }

    #[test]
    fn usable_until_expiry() {
        let cases: &[(u64, Option<u64>, bool)] = &[
            (0, None, true),
            (u64::MAX, None, true),
            (99, Some(100), true),
            (100, Some(100), false),
            (101, Some(100), false),
            (0, Some(0), false),
        ];
        for &(now, expires_at, want) in cases {
            assert_eq!(usable(now, expires_at), want, "now {now}, expires {expires_at:?}");
        }
    }
}

//! RFC 3339 time stamps in UTC with milliseconds (`2026-12-01T23:40:05.123Z`)
//! from a time since the Unix epoch; no time zone database, no clock read.

use smallvec::SmallVec;
use std::time::Duration;

/// Appends `since_epoch` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
pub fn write_rfc3339_millis(since_epoch: Duration, out: &mut Vec<u8>) {
    let secs = since_epoch.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    // Built on the stack and appended once (24 bytes up to year 9999); every
    // field but a year past 9999 has a fixed width, written with constant
    // divisors (a record is written per request).
    let mut text: SmallVec<[u8; 32]> = SmallVec::new();
    if y > 9999 {
        text.extend_from_slice(y.to_string().as_bytes());
    } else {
        text.extend_from_slice(&[digit(y / 1000), digit(y / 100), digit(y / 10), digit(y)]);
    }
    let two = |v: u64| [digit(v / 10), digit(v)];
    let [m1, m0] = two(m);
    let [d1, d0] = two(d);
    let [h1, h0] = two(rem / 3600);
    let [n1, n0] = two(rem % 3600 / 60);
    let [s1, s0] = two(rem % 60);
    let ms = u64::from(since_epoch.subsec_millis());
    text.extend_from_slice(&[
        b'-',
        m1,
        m0,
        b'-',
        d1,
        d0,
        b'T',
        h1,
        h0,
        b':',
        n1,
        n0,
        b':',
        s1,
        s0,
        b'.',
        digit(ms / 100),
        digit(ms / 10),
        digit(ms),
        b'Z',
    ]);
    out.extend_from_slice(&text);
}

/// The last decimal digit of `v`.
fn digit(v: u64) -> u8 {
    b'0' + (v % 10) as u8
}

/// The proleptic Gregorian (year, month, day) of a count of days since
/// 1970-01-01: the days are counted in 400-year eras of 146,097 days, each
/// starting on 1 March so that the leap day ends a year.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days from 0000-03-01
    let era = z / 146_097;
    let doe = z % 146_097; // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of the March-based year
    let mp = (5 * doy + 2) / 153; // March = 0
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(secs: u64, millis: u32) -> String {
        let mut out = Vec::new();
        write_rfc3339_millis(Duration::new(secs, millis * 1_000_000), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn known_instants() {
        assert_eq!(text(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(text(951_782_400, 7), "2000-02-29T00:00:00.007Z");
        assert_eq!(text(1_796_168_405, 123), "2026-12-01T23:40:05.123Z");
        assert_eq!(text(4_102_444_799, 999), "2099-12-31T23:59:59.999Z");
        assert_eq!(text(253_402_300_800, 0), "10000-01-01T00:00:00.000Z");
    }

    #[test]
    fn every_day_follows_the_one_before() {
        // Day by day over 1970-2400, against a counter of the calendar.
        let (mut y, mut m, mut d) = (1970, 1, 1);
        for days in 0..157_000u64 {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let len =
                [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m as usize - 1];
            d += 1;
            if d > len {
                (d, m) = (1, m + 1);
                if m > 12 {
                    (m, y) = (1, y + 1);
                }
            }
        }
    }
}

//! RFC 3339 time stamps in UTC with milliseconds (`2026-12-01T23:40:05.123Z`)
//! from a time since the Unix epoch; no time zone database, no clock read.

use smallvec::SmallVec;
use std::time::Duration;

/// Appends `since_epoch` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC). (The records
/// are written by `Stamps`; the tests hold it to this.)
#[cfg(test)]
pub fn write_rfc3339_millis(since_epoch: Duration, out: &mut Vec<u8>) {
    let mut seconds: SmallVec<[u8; 32]> = SmallVec::new();
    write_up_to_seconds(since_epoch.as_secs(), &mut seconds);
    out.extend_from_slice(&seconds);
    out.extend_from_slice(&millis(since_epoch));
}

/// `write_rfc3339_millis` for records written in bursts: the date and the
/// time of day are worked out once per second, and only the milliseconds
/// for each record (a record is written per request).
#[derive(Debug, Default)]
pub struct Stamps {
    /// The second `text` is, and its text up to the `.` of the fraction.
    second: Option<u64>,
    text: SmallVec<[u8; 32]>,
}

impl Stamps {
    /// Appends `since_epoch` as `write_rfc3339_millis` does.
    pub fn write(&mut self, since_epoch: Duration, out: &mut Vec<u8>) {
        let secs = since_epoch.as_secs();
        if self.second != Some(secs) {
            self.text.clear();
            write_up_to_seconds(secs, &mut self.text);
            self.second = Some(secs);
        }
        out.extend_from_slice(&self.text);
        out.extend_from_slice(&millis(since_epoch));
    }
}

/// `YYYY-MM-DDTHH:MM:SS.` of a second since the epoch: every field but a
/// year past 9999 has a fixed width, written with constant divisors.
fn write_up_to_seconds(secs: u64, text: &mut SmallVec<[u8; 32]>) {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
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
    text.extend_from_slice(&[b'-', m1, m0, b'-', d1, d0, b'T', h1, h0, b':', n1, n0, b':', s1, s0, b'.']);
}

/// `mmmZ`: the milliseconds of `since_epoch` and the zone.
fn millis(since_epoch: Duration) -> [u8; 4] {
    let ms = u64::from(since_epoch.subsec_millis());
    [digit(ms / 100), digit(ms / 10), digit(ms), b'Z']
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
    fn stamps_write_what_the_function_writes_whatever_the_order() {
        let mut stamps = Stamps::default();
        let instants = [(1_796_168_405, 123), (1_796_168_405, 999), (1_796_168_406, 0), (1_796_168_405, 7)];
        for (secs, millis) in instants.into_iter().chain([(253_402_300_800, 1), (0, 0), (0, 0)]) {
            let mut out = b"x".to_vec();
            stamps.write(Duration::new(secs, millis * 1_000_000), &mut out);
            assert_eq!(out[1..], *text(secs, millis).as_bytes(), "{secs}.{millis}");
        }
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

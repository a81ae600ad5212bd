//! UTC timestamps for file names, logs and query parameters, without a
//! date-time dependency: nanoseconds since the Unix epoch to and from
//! `YYYY-MM-DDTHH:MM:SS.mmmZ` (RFC 3339, UTC only).

use std::time::{SystemTime, UNIX_EPOCH};

const NS_PER_SEC: u64 = 1_000_000_000;
const SECS_PER_DAY: u64 = 86_400;

/// Now, ns since the Unix epoch (0 if the clock is before 1970).
pub fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// CLOCK_MONOTONIC now, ns: the clock of `bpf_ktime_get_ns()`, which stamps
/// every sample (see [`crate::sample::RawSample::timestamp_ns`]).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * NS_PER_SEC + ts.tv_nsec as u64
}

/// (year, month 1..=12, day 1..=31) of `days` since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a (year, month, day) date (Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

struct Parts {
    year: i64,
    month: u32,
    day: u32,
    hour: u64,
    minute: u64,
    second: u64,
    millis: u64,
}

fn parts(unix_ns: u64) -> Parts {
    let secs = unix_ns / NS_PER_SEC;
    let (year, month, day) = civil_from_days((secs / SECS_PER_DAY) as i64);
    let rem = secs % SECS_PER_DAY;
    Parts {
        year,
        month,
        day,
        hour: rem / 3600,
        minute: rem % 3600 / 60,
        second: rem % 60,
        millis: unix_ns % NS_PER_SEC / 1_000_000,
    }
}

/// `2024-05-01T12:00:00.123Z`: RFC 3339 in UTC, millisecond precision.
pub fn rfc3339(unix_ns: u64) -> String {
    let p = parts(unix_ns);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        p.year, p.month, p.day, p.hour, p.minute, p.second, p.millis
    )
}

/// `20240501T120000.123Z`: the same instant without separators, for file
/// names (sorts like the time it names).
pub fn compact(unix_ns: u64) -> String {
    let p = parts(unix_ns);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}.{:03}Z",
        p.year, p.month, p.day, p.hour, p.minute, p.second, p.millis
    )
}

/// `2024-05-01`: the UTC day of `unix_ns`.
pub fn day(unix_ns: u64) -> String {
    let p = parts(unix_ns);
    format!("{:04}-{:02}-{:02}", p.year, p.month, p.day)
}

/// A time given as integer nanoseconds since the Unix epoch, or as RFC 3339
/// in UTC (`2024-05-01T12:00:00Z`, optional fraction). `None` if it is
/// neither, or if it is not representable as u64 nanoseconds (RFC 3339
/// times from 1970 up to 2554-07-21T23:34:33.709551615Z).
pub fn parse(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Ok(ns) = text.parse::<u64>() {
        return Some(ns);
    }
    let text = text.strip_suffix('Z').or_else(|| text.strip_suffix('z'))?;
    let (date, time) = text.split_once(['T', 't', ' '])?;
    let mut date = date.splitn(3, '-');
    let year: i64 = date.next()?.parse().ok()?;
    let month: u32 = date.next()?.parse().ok()?;
    let day: u32 = date.next()?.parse().ok()?;
    let (hms, fraction) = match time.split_once('.') {
        Some((hms, f)) => (hms, Some(f)),
        None => (time, None),
    };
    let mut hms = hms.splitn(3, ':');
    let hour: u64 = hms.next()?.parse().ok()?;
    let minute: u64 = hms.next()?.parse().ok()?;
    let second: u64 = hms.next()?.parse().ok()?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 || year < 1970 {
        return None;
    }
    let nanos = match fraction {
        None => 0,
        Some(f) if !f.is_empty() && f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) => {
            f.parse::<u64>().ok()? * 10u64.pow(9 - f.len() as u32)
        }
        Some(_) => return None,
    };
    // Checked: a date past 2554-07-21 does not fit in u64 nanoseconds and
    // must be refused, not wrapped to some earlier time.
    let days = u64::try_from(days_from_civil(year, month, day)).ok()?;
    days.checked_mul(SECS_PER_DAY)?
        .checked_add(hour * 3600 + minute * 60 + second)?
        .checked_mul(NS_PER_SEC)?
        .checked_add(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses_round_trip() {
        // 2024-02-29T23:59:58.123Z (a leap day).
        let ns = 1_709_251_198_123_000_000;
        assert_eq!(rfc3339(ns), "2024-02-29T23:59:58.123Z");
        assert_eq!(compact(ns), "20240229T235958.123Z");
        assert_eq!(day(ns), "2024-02-29");
        assert_eq!(parse("2024-02-29T23:59:58.123Z"), Some(ns));
        assert_eq!(parse(&ns.to_string()), Some(ns));
        assert_eq!(parse("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(parse("yesterday"), None);
        assert_eq!(parse("2024-13-01T00:00:00Z"), None);
    }

    #[test]
    fn times_past_u64_nanoseconds_are_refused_not_wrapped() {
        let last = u64::MAX;
        assert_eq!(rfc3339(last), "2554-07-21T23:34:33.709Z");
        assert_eq!(parse("2554-07-21T23:34:33.709551615Z"), Some(last));
        assert_eq!(parse("2554-07-21T23:34:33.709551616Z"), None);
        assert_eq!(parse("2554-07-22T00:00:00Z"), None);
        assert_eq!(parse("9999-12-31T23:59:59Z"), None);
        assert_eq!(parse("18446744073709551616"), None);
    }

    #[test]
    fn monotonic_advances() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}

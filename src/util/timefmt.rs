//! UTC timestamps for file names, logs and query parameters: nanoseconds
//! since the Unix epoch to and from `YYYY-MM-DDTHH:MM:SS.mmmZ` (RFC 3339),
//! with `jiff` doing the calendar. Times are u64 nanoseconds, so they run
//! from 1970 to 2554-07-21T23:34:33.709551615Z; anything outside is refused
//! when parsed, never wrapped.

use std::time::{SystemTime, UNIX_EPOCH};

use jiff::Timestamp;

const NS_PER_SEC: u64 = 1_000_000_000;

/// Now, ns since the Unix epoch (0 if the clock is before 1970).
pub fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// CLOCK_MONOTONIC now, ns: the clock of `bpf_ktime_get_ns()`, which stamps
/// every sample (see [`crate::sampling::records::RawSample::timestamp_ns`]).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * NS_PER_SEC + ts.tv_nsec as u64
}

/// `unix_ns` formatted in UTC with a `strftime` pattern. Every u64 of
/// nanoseconds is a valid jiff timestamp (jiff reaches the year 9999).
fn utc(unix_ns: u64, pattern: &str) -> String {
    Timestamp::from_nanosecond(i128::from(unix_ns))
        .expect("u64 nanoseconds lie within jiff's range")
        .strftime(pattern)
        .to_string()
}

/// `2024-05-01T12:00:00.123Z`: RFC 3339 in UTC, millisecond precision
/// (truncated).
pub fn rfc3339(unix_ns: u64) -> String {
    utc(unix_ns, "%Y-%m-%dT%H:%M:%S%.3fZ")
}

/// `20240501T120000.123Z`: the same instant without separators, for file
/// names (sorts like the time it names).
pub fn compact(unix_ns: u64) -> String {
    utc(unix_ns, "%Y%m%dT%H%M%S%.3fZ")
}

/// `2024-05-01`: the UTC day of `unix_ns`.
pub fn day(unix_ns: u64) -> String {
    utc(unix_ns, "%Y-%m-%d")
}

/// A time given as integer nanoseconds since the Unix epoch, or as an RFC
/// 3339 time (`2024-05-01T12:00:00Z`, optional fraction, any UTC offset).
/// `None` if it is neither, or if it is not representable as u64
/// nanoseconds (before 1970, or after 2554-07-21T23:34:33.709551615Z).
pub fn parse(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Ok(ns) = text.parse::<u64>() {
        return Some(ns);
    }
    let timestamp: Timestamp = text.parse().ok()?;
    u64::try_from(timestamp.as_nanosecond()).ok()
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

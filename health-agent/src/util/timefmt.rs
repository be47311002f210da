//! RFC 3339 timestamps (UTC; `humantime` formats them) and short durations.

use std::{
    fmt::Write as _,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use humantime::Rfc3339Timestamp;

/// RFC 3339 in UTC with milliseconds: `2026-11-22T10:04:05.123Z`.
#[must_use]
pub fn rfc3339_millis(epoch_ms: u64) -> String {
    rfc3339_with(epoch_ms, humantime::format_rfc3339_millis)
}

/// `2026-11-21T06:00:00Z` for milliseconds since the Unix epoch.
#[must_use]
pub fn rfc3339(epoch_ms: u64) -> String {
    rfc3339_with(epoch_ms, humantime::format_rfc3339_seconds)
}

/// `epoch_ms` formatted by `format`; a time RFC 3339 cannot write (after
/// the year 9999) as the number it is.
fn rfc3339_with(epoch_ms: u64, format: fn(SystemTime) -> Rfc3339Timestamp) -> String {
    let mut text = String::new();
    let written = UNIX_EPOCH
        .checked_add(Duration::from_millis(epoch_ms))
        .is_some_and(|t| write!(text, "{}", format(t)).is_ok());
    if written {
        text
    } else {
        format!("{epoch_ms} ms after 1970-01-01T00:00:00Z")
    }
}

/// `412µs`, `1.204ms`, `2.5s`.
#[must_use]
pub fn short(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 1_000_000 {
        format!("{}µs", ns / 1000)
    } else if ns < 1_000_000_000 {
        #[allow(clippy::cast_precision_loss, reason = "display only")]
        let ms = ns as f64 / 1e6;
        let text = format!("{ms:.3}");
        format!("{}ms", text.trim_end_matches('0').trim_end_matches('.'))
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Milliseconds since the Unix epoch, now (0 before it).
#[must_use]
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_240_965_928), "2026-11-21T06:02:45Z");
        assert_eq!(
            rfc3339_millis(1_795_240_965_928),
            "2026-11-21T06:02:45.928Z"
        );
        assert_eq!(rfc3339_millis(7), "1970-01-01T00:00:00.007Z");
        assert_eq!(rfc3339(253_402_300_799_000), "9999-12-31T23:59:59Z");
        // Past what RFC 3339 can write: the number, not a panic.
        assert_eq!(
            rfc3339_millis(u64::MAX),
            "18446744073709551615 ms after 1970-01-01T00:00:00Z"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(short(Duration::from_micros(412)), "412µs");
        assert_eq!(short(Duration::from_micros(1204)), "1.204ms");
        assert_eq!(short(Duration::from_millis(83)), "83ms");
        assert_eq!(short(Duration::from_millis(2500)), "2.5s");
    }
}

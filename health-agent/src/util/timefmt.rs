//! RFC 3339 timestamps (UTC, seconds) and short durations, without a
//! calendar dependency.

use std::time::Duration;

/// RFC 3339 in UTC with milliseconds: `2026-11-22T10:04:05.123Z`.
#[must_use]
pub fn rfc3339_millis(epoch_ms: u64) -> String {
    let mut s = rfc3339(epoch_ms);
    s.insert_str(s.len() - 1, &format!(".{:03}", epoch_ms % 1000));
    s
}

/// `2026-11-21T06:00:00Z` for milliseconds since the Unix epoch.
#[must_use]
pub fn rfc3339(epoch_ms: u64) -> String {
    let secs = epoch_ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
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
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
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
    }

    #[test]
    fn durations() {
        assert_eq!(short(Duration::from_micros(412)), "412µs");
        assert_eq!(short(Duration::from_micros(1204)), "1.204ms");
        assert_eq!(short(Duration::from_millis(83)), "83ms");
        assert_eq!(short(Duration::from_millis(2500)), "2.5s");
    }
}

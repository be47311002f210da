//! Durations on the command line, in configuration files and in the API:
//! `60s`, `500ms`, `2m`, `1h`, several of them summed (`1h30m`, `1m 30s`),
//! or a bare number of seconds (`60`). The units are ms, s, m and h; the
//! arithmetic is `humantime`'s, and a value too large to hold (or to add to
//! a clock reading, [`MAX`]) is an error naming it, never a wrapped number.

use std::time::Duration;

/// The longest duration taken: a hundred years. Longer ones are refused,
/// like those that overflow, since adding them to a clock reading would.
pub const MAX: Duration = Duration::from_hours(100 * 365 * 24);

/// The units a part may have.
const UNITS: [&str; 4] = ["ms", "s", "m", "h"];

/// Parses a duration of whole seconds, one at least: for settings the
/// kernel or etcd keep in seconds (a connection-tracking lifetime, a lease
/// TTL), which would otherwise round it without a word.
pub fn parse_whole_secs(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d.subsec_nanos() != 0 || d < Duration::from_secs(1) {
        return Err(format!(
            "{s:?} is not a whole number of seconds: this setting is kept in seconds"
        ));
    }
    Ok(d)
}

/// Parses a duration of more than zero.
pub fn parse(s: &str) -> Result<Duration, String> {
    let d = parse_or_zero(s)?;
    if d.is_zero() {
        return Err(format!("{s:?}: must be more than zero"));
    }
    Ok(d)
}

/// Parses a duration, zero included however it is spelt (`0`, `0s`,
/// `0ms`): for the settings where zero means none.
pub fn parse_or_zero(s: &str) -> Result<Duration, String> {
    let hint = "use e.g. 500ms, 60s, 2m, 1h or 1h30m";
    if s.trim().is_empty() {
        return Err(format!("{s:?} is not a duration ({hint})"));
    }
    // A bare number is seconds.
    let text = if s.bytes().all(|b| b.is_ascii_digit()) {
        format!("{s}s")
    } else {
        check_syntax(s).map_err(|e| format!("{s:?}: {e} ({hint})"))?;
        s.to_owned()
    };
    let d = humantime::parse_duration(&text).map_err(|e| match e {
        humantime::DurationError::NumberOverflow => {
            format!("{s:?} overflows: a duration is at most 100 years")
        }
        other => format!("{s:?} is not a duration: {other} ({hint})"),
    })?;
    if d > MAX {
        return Err(format!(
            "{s:?} is too long: a duration is at most 100 years"
        ));
    }
    Ok(d)
}

/// Parts of digits then one of [`UNITS`], optionally separated by spaces:
/// no sign, no fraction, no other unit (humantime would take `1.5s` and
/// `1d`, which this syntax never did).
fn check_syntax(s: &str) -> Result<(), String> {
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            let c = rest.chars().next().unwrap_or(' ');
            return Err(format!("expected a number, found {c:?}"));
        }
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        if unit.is_empty() {
            let found = rest
                .chars()
                .next()
                .map_or_else(|| "nothing".to_owned(), |c| format!("{c:?}"));
            return Err(format!("expected a unit (ms, s, m or h), found {found}"));
        }
        if !UNITS.contains(&unit) {
            return Err(format!("unknown unit {unit:?} (use ms, s, m or h)"));
        }
        rest = rest[unit_len..].trim_start();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_kept_in_seconds_take_whole_seconds() {
        assert_eq!(parse_whole_secs("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_whole_secs("2000ms"), Ok(Duration::from_secs(2)));
        for bad in ["1500ms", "500ms", "1s500ms"] {
            let err = parse_whole_secs(bad).expect_err(bad);
            assert!(err.contains("not a whole number of seconds"), "{err}");
        }
    }

    #[test]
    fn units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "1d", "-1s", "0s", "1.5s"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn zero_is_taken_however_spelt_where_it_means_none() {
        for zero in ["0", "0s", "0ms", "0m", "0h", "0m 0s"] {
            assert_eq!(parse_or_zero(zero), Ok(Duration::ZERO), "{zero:?}");
            let err = parse(zero).expect_err(zero);
            assert!(err.contains("must be more than zero"), "{zero:?}: {err}");
        }
        assert_eq!(parse_or_zero("3s"), Ok(Duration::from_secs(3)));
        for bad in ["", "-0s", "0d", "0.0s"] {
            assert!(parse_or_zero(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parts_are_summed() {
        assert_eq!(parse("1h30m"), Ok(Duration::from_mins(90)));
        assert_eq!(parse("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1s500ms"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn bad_syntax_is_named() {
        for (bad, needle) in [
            ("1d", "unknown unit \"d\""),
            ("1.5s", "expected a unit (ms, s, m or h), found '.'"),
            ("-1s", "expected a number, found '-'"),
            ("1sec", "unknown unit \"sec\""),
            ("5m x", "expected a number, found 'x'"),
            ("0s", "must be more than zero"),
            ("   ", "is not a duration"),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(needle), "{bad:?}: {e}");
            assert!(e.starts_with(&format!("{bad:?}")), "names the value: {e}");
        }
    }

    #[test]
    fn overflow_is_an_error_naming_the_value() {
        for bad in [
            "99999999999999999999s",
            "99999999999999999999",
            "18446744073709551615h",
            "18446744073709551615m",
            "18446744073709551615s 1s",
            "18446744073709551615ms 18446744073709551615ms 18446744073709551615ms",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(
                e.starts_with(&format!("{bad:?}")) && e.contains("at most 100 years"),
                "{bad:?}: {e}"
            );
        }
        // What fits in a `Duration` but not past a clock reading.
        let e = parse("18446744073709551615s").expect_err("too long");
        assert!(e.contains("at most 100 years"), "{e}");
        // The longest taken.
        let max = format!("{}s", MAX.as_secs());
        assert_eq!(parse(&max), Ok(MAX));
        assert!(parse(&format!("{}s", MAX.as_secs() + 1)).is_err());
    }
}

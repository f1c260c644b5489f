//! UTC calendar time as text (ISO 8601 / RFC 3339) for the management API and
//! the logs, from seconds or a `SystemTime` (proleptic Gregorian calendar; H.
//! Hinnant's `civil_from_days`). One place for what the dead-letter summary and
//! the log limiter's summaries print.

use std::time::{SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 as (year, month 1–12, day 1–31).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn iso8601(secs: u64) -> String {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `t` as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (microseconds, as tracing's default
/// format prints its timestamps); times before the epoch print as the epoch.
pub fn rfc3339_micros(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let whole = iso8601(d.as_secs());
    format!("{}.{:06}Z", &whole[..whole.len() - 1], d.subsec_micros())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn calendar_dates_and_times() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_418), (2025, 11, 26));
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_795_691_727), "2026-11-26T11:15:27Z");
        let t = UNIX_EPOCH + Duration::from_micros(1_795_691_727_000_042);
        assert_eq!(rfc3339_micros(t), "2026-11-26T11:15:27.000042Z");
    }
}

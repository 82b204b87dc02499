//! Times and durations as the report and the status view print them.

use std::time::{Duration, UNIX_EPOCH};

/// `2026-11-23 15:25:01 UTC`.
pub fn utc(ts: f64) -> String {
    if !(0.0..=1e11).contains(&ts) {
        return format!("{ts}");
    }
    let t = UNIX_EPOCH + Duration::from_secs_f64(ts);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    format!("{} UTC", s.trim_end_matches('Z').replacen('T', " ", 1))
}

/// `42s`, `3m05s`, `3h59m`, `2d04h`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(utc(1767225600.4), "2026-01-01 00:00:00 UTC");
        assert_eq!(duration(42.2), "42s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(14_340.0), "3h59m");
        assert_eq!(duration(187_200.0), "2d04h");
    }
}

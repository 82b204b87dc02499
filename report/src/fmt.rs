//! Times and durations as the report and the status view print them.

use std::time::{Duration, UNIX_EPOCH};

/// The latest time a record may carry (Unix seconds, in the year [`MAX_YEAR`]); a later one is
/// no time vigil wrote.
pub const MAX_TS: f64 = 1e11;
pub const MAX_YEAR: u32 = 5138;

/// `2026-11-23 15:25:01 UTC`.
pub fn utc(ts: f64) -> String {
    if !(0.0..=MAX_TS).contains(&ts) {
        return format!("{ts}");
    }
    let t = UNIX_EPOCH + Duration::from_secs_f64(ts);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    format!("{} UTC", s.trim_end_matches('Z').replacen('T', " ", 1))
}

/// Text from records made safe for a terminal: every control character but newline and tab
/// (ESC, which starts the sequences that move the cursor, retitle the window or write the
/// clipboard; carriage return; the C1 controls) is written as `\x1b`, `\u{9b}`.
pub fn term_safe(s: &str) -> String {
    escape_controls(s, false)
}

/// [`term_safe`] for text that must stay one line: a newline is written as `\x0a` too.
pub fn term_safe_line(s: &str) -> String {
    escape_controls(s, true)
}

fn escape_controls(s: &str, newline: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && (c != '\n' || newline) && c != '\t' {
            if (c as u32) < 0x100 {
                out.push_str(&format!("\\x{:02x}", c as u32));
            } else {
                out.push_str(&c.escape_unicode().to_string());
            }
        } else {
            out.push(c);
        }
    }
    out
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
        assert_eq!(
            term_safe("a\u{1b}]0;x\u{7}b\r\u{9b}2J\tc\n"),
            "a\\x1b]0;x\\x07b\\x0d\\x9b2J\tc\n"
        );
        assert_eq!(term_safe_line("a\nb"), "a\\x0ab");
    }
}

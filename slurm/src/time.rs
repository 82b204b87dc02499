//! Slurm's time formats: durations (`--time`, `TimeLimit=`, `RunTime=`) and timestamps
//! (`EndTime=`, `squeue -o %e`, `SLURM_JOB_END_TIME`).
//!
//! Pure, except [`local_to_epoch`], which asks the C library for the machine's time zone (Slurm
//! prints times in local time unless `SLURM_TIME_FORMAT=%s`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why a text is not a duration; one phrase, for the caller to put after the value it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("it is empty")]
    Empty,
    #[error("it is negative")]
    Negative,
    /// A duration with units that humantime refuses, with its reason.
    #[error("{0}")]
    Units(String),
    #[error("{0:?} is not a whole number")]
    NotAWholeNumber(String),
    #[error("{0:?} is too large")]
    FieldTooLarge(String),
    #[error("it has too many fields")]
    TooManyFields,
    #[error("it is too large")]
    TooLarge,
}

/// Slurm's duration forms (`M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`) or a number with
/// units (`90s`, `45m`, `2h`, `1d`, `1h30m`). Slurm's words for no limit (`UNLIMITED`,
/// `Partition_Limit`) are errors here; [`parse_limit`] reads them as `None`.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if s.starts_with('-') {
        return Err(DurationError::Negative);
    }
    if s.bytes().any(|b| b.is_ascii_alphabetic()) {
        return humantime::parse_duration(s).map_err(|e| DurationError::Units(e.to_string()));
    }
    let num = |t: &str| -> Result<u64, DurationError> {
        if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
            return Err(DurationError::NotAWholeNumber(t.into()));
        }
        t.parse::<u64>()
            .map_err(|_| DurationError::FieldTooLarge(t.into()))
    };
    let (days, clock) = match s.split_once('-') {
        Some((d, rest)) => (Some(num(d)?), rest),
        None => (None, s),
    };
    let parts = clock
        .split(':')
        .map(num)
        .collect::<Result<Vec<u64>, DurationError>>()?;
    let (h, m, sec) = match (days.is_some(), parts.as_slice()) {
        (false, [m]) => (0, *m, 0),
        (false, [m, s]) => (0, *m, *s),
        (false, [h, m, s]) | (true, [h, m, s]) => (*h, *m, *s),
        (true, [h]) => (*h, 0, 0),
        (true, [h, m]) => (*h, *m, 0),
        _ => return Err(DurationError::TooManyFields),
    };
    let total = days
        .unwrap_or(0)
        .checked_mul(86_400)
        .and_then(|d| d.checked_add(h.checked_mul(3600)?))
        .and_then(|t| t.checked_add(m.checked_mul(60)?))
        .and_then(|t| t.checked_add(sec))
        .ok_or(DurationError::TooLarge)?;
    Ok(Duration::from_secs(total))
}

/// A duration in Slurm's `--time` form: `HH:MM:SS`, or `D-HH:MM:SS` from a day on.
pub fn format_duration(secs: u64) -> String {
    let (d, r) = (secs / 86_400, secs % 86_400);
    let hms = format!("{:02}:{:02}:{:02}", r / 3600, r % 3600 / 60, r % 60);
    if d > 0 {
        format!("{d}-{hms}")
    } else {
        hms
    }
}

/// Slurm's `TimeLimit=`: `None` for `UNLIMITED`, `Partition_Limit` and the like.
pub fn parse_limit(s: &str) -> Option<Duration> {
    parse_duration(s.trim()).ok().filter(|d| !d.is_zero())
}

/// `SLURM_JOB_END_TIME` (Slurm >= 23.02): epoch seconds; `None` when unset, empty or zero.
pub fn parse_end_env(value: Option<&str>) -> Option<SystemTime> {
    let v = value?.trim();
    v.parse::<u64>()
        .ok()
        .filter(|s| *s > 0)
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

/// Why a text is not one of Slurm's times.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("Slurm's time {0:?} is too large")]
    TooLarge(String),
    #[error("Slurm's time {0:?} is not a time")]
    NotATime(String),
    #[error("Slurm's time {0:?} does not exist here")]
    NotHere(String),
}

/// A time as Slurm prints it: epoch seconds under `SLURM_TIME_FORMAT=%s`, else
/// `YYYY-MM-DDTHH:MM:SS` in local time (converted with `local`). `Ok(None)` for the words Slurm
/// uses when there is no time (`N/A`, `Unknown`, `None`, `(null)`, empty, `0`).
pub fn parse_time(
    s: &str,
    local: &dyn Fn(Civil) -> Option<i64>,
) -> Result<Option<SystemTime>, TimeError> {
    let t = s.trim();
    if t.is_empty()
        || ["n/a", "unknown", "none", "(null)"].contains(&t.to_ascii_lowercase().as_str())
    {
        return Ok(None);
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return match t.parse::<u64>() {
            Ok(0) => Ok(None),
            Ok(n) => Ok(Some(UNIX_EPOCH + Duration::from_secs(n))),
            Err(_) => Err(TimeError::TooLarge(t.into())),
        };
    }
    let c = parse_civil(t).ok_or_else(|| TimeError::NotATime(t.into()))?;
    let secs = local(c).ok_or_else(|| TimeError::NotHere(t.into()))?;
    Ok(epoch_to_system(secs as f64))
}

/// `SLURM_TIME_FORMAT=%s squeue -h -j ID -o %e`: the job's end, if it has one.
pub fn parse_squeue_end(out: &str) -> Result<Option<SystemTime>, TimeError> {
    let line = out
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    parse_time(line, &local_to_epoch)
}

/// A calendar date and time of day, with no zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

/// `YYYY-MM-DDTHH:MM:SS` exactly (the separator may be `T`, `t` or a space), checked.
pub fn parse_civil(s: &str) -> Option<Civil> {
    let b = s.as_bytes();
    if !s.is_ascii()
        || b.len() != 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let n = |r: std::ops::Range<usize>| -> Option<u32> {
        let t = &s[r];
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let c = Civil {
        year: i64::from(n(0..4)?),
        month: n(5..7)?,
        day: n(8..10)?,
        hour: n(11..13)?,
        minute: n(14..16)?,
        second: n(17..19)?,
    };
    let valid = (1..=12).contains(&c.month)
        && c.day >= 1
        && c.day <= days_in_month(c.year, c.month)
        && c.hour < 24
        && c.minute < 60
        && c.second <= 60;
    valid.then_some(c)
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Seconds since the epoch of a civil time in UTC (proleptic Gregorian).
pub fn civil_to_epoch(c: Civil) -> i64 {
    // Howard Hinnant's days_from_civil.
    let y = if c.month <= 2 { c.year - 1 } else { c.year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(c.month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(c.day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + i64::from(c.hour) * 3600 + i64::from(c.minute) * 60 + i64::from(c.second)
}

/// Epoch seconds as a time; `None` at or before the epoch, or not finite.
pub fn epoch_to_system(secs: f64) -> Option<SystemTime> {
    (secs.is_finite() && secs > 0.0).then(|| UNIX_EPOCH + Duration::from_secs_f64(secs))
}

/// Seconds since the epoch of a civil time in this machine's local zone (`mktime`).
pub fn local_to_epoch(c: Civil) -> Option<i64> {
    // SAFETY: `tm` is a plain C struct, zeroed and then filled; mktime only reads and normalises it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = i32::try_from(c.year - 1900).ok()?;
    tm.tm_mon = c.month as i32 - 1;
    tm.tm_mday = c.day as i32;
    tm.tm_hour = c.hour as i32;
    tm.tm_min = c.minute as i32;
    tm.tm_sec = c.second as i32;
    tm.tm_isdst = -1;
    let t = unsafe { libc::mktime(&mut tm) };
    (t != -1).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn utc(c: Civil) -> Option<i64> {
        Some(civil_to_epoch(c))
    }

    #[test]
    fn slurm_duration_forms_and_units() {
        let s = Duration::from_secs;
        for (text, want) in [
            ("90", s(90 * 60)),
            ("05:30", s(5 * 60 + 30)),
            ("1:30:00", s(5400)),
            ("2-12", s(2 * 86_400 + 12 * 3600)),
            ("1-00:30", s(86_400 + 1800)),
            ("1-02:03:04", s(86_400 + 2 * 3600 + 3 * 60 + 4)),
            ("0", s(0)),
            ("90s", s(90)),
            ("45m", s(2700)),
            ("1h30m", s(5400)),
            ("1d", s(86_400)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn bad_durations_say_why() {
        for (bad, why) in [
            ("", DurationError::Empty),
            ("-5", DurationError::Negative),
            ("1:2:3:4", DurationError::TooManyFields),
            ("1-2:3:4:5", DurationError::TooManyFields),
            ("1::2", DurationError::NotAWholeNumber("".into())),
            ("1-", DurationError::NotAWholeNumber("".into())),
            (
                "99999999999999999999",
                DurationError::FieldTooLarge("99999999999999999999".into()),
            ),
            ("9999999999999999-0", DurationError::TooLarge),
        ] {
            assert_eq!(parse_duration(bad), Err(why), "{bad:?}");
        }
        for words in ["UNLIMITED", "Partition_Limit", "soon", "a-b"] {
            let e = parse_duration(words).unwrap_err().to_string();
            assert!(!e.is_empty() && !e.contains('\n'), "{words}: {e}");
        }
    }

    #[test]
    fn time_limits_and_their_words_for_none() {
        assert_eq!(parse_limit("00:10:00"), Some(Duration::from_secs(600)));
        assert_eq!(parse_limit("1-00:00:00"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_limit(" 10:00 "), Some(Duration::from_secs(600)));
        for none in [
            "UNLIMITED",
            "Partition_Limit",
            "NOT_SET",
            "INVALID",
            "",
            "N/A",
            "0",
        ] {
            assert_eq!(parse_limit(none), None, "{none}");
        }
    }

    #[test]
    fn the_time_form_vigil_writes() {
        let secs = |t: &str| parse_duration(t).unwrap().as_secs();
        assert_eq!(format_duration(secs("4h")), "04:00:00");
        assert_eq!(format_duration(secs("90m")), "01:30:00");
        assert_eq!(format_duration(secs("1d")), "1-00:00:00");
        assert_eq!(format_duration(secs("1-2:03")), "1-02:03:00");
        assert_eq!(format_duration(secs("90")), "01:30:00");
        assert_eq!(format_duration(secs("01:02")), "00:01:02");
    }

    #[test]
    fn timestamps_epoch_local_and_none() {
        assert_eq!(parse_end_env(Some("1767225600")), Some(at(1_767_225_600)));
        for none in [None, Some(""), Some("0"), Some("soon")] {
            assert_eq!(parse_end_env(none), None);
        }
        assert_eq!(parse_time("1767225600", &utc), Ok(Some(at(1_767_225_600))));
        assert_eq!(
            parse_time("2026-01-01T00:00:00", &utc),
            Ok(Some(at(1_767_225_600)))
        );
        for none in ["N/A", "Unknown", "NONE", "(null)", "", "  ", "0"] {
            assert_eq!(parse_time(none, &utc), Ok(None), "{none:?}");
        }
        assert_eq!(
            parse_time("later", &utc),
            Err(TimeError::NotATime("later".into()))
        );
        assert!(parse_time("later", &utc)
            .unwrap_err()
            .to_string()
            .contains("\"later\""));
        assert_eq!(
            parse_time("2026-02-30T00:00:00", &utc),
            Err(TimeError::NotATime("2026-02-30T00:00:00".into()))
        );
        assert_eq!(
            parse_time("2026-01-01T00:00:00", &|_| None),
            Err(TimeError::NotHere("2026-01-01T00:00:00".into()))
        );
        assert_eq!(
            parse_time("99999999999999999999", &utc),
            Err(TimeError::TooLarge("99999999999999999999".into()))
        );
        assert_eq!(
            parse_squeue_end("1767225600\n"),
            Ok(Some(at(1_767_225_600)))
        );
        assert_eq!(parse_squeue_end("N/A\n"), Ok(None));
        assert_eq!(parse_squeue_end(""), Ok(None));
    }

    #[test]
    fn local_time_round_trips_through_the_c_library() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as libc::time_t;
        // SAFETY: localtime_r fills the zeroed struct from a valid time.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        assert!(!unsafe { libc::localtime_r(&now, &mut tm) }.is_null());
        let c = Civil {
            year: i64::from(tm.tm_year) + 1900,
            month: tm.tm_mon as u32 + 1,
            day: tm.tm_mday as u32,
            hour: tm.tm_hour as u32,
            minute: tm.tm_min as u32,
            second: tm.tm_sec as u32,
        };
        assert_eq!(local_to_epoch(c), Some(now));
    }

    proptest! {
        #[test]
        fn slurm_clock_forms_add_up(d in 0u64..400, h in 0u64..24, m in 0u64..60, s in 0u64..60) {
            let want = Duration::from_secs(d * 86_400 + h * 3600 + m * 60 + s);
            prop_assert_eq!(parse_duration(&format!("{d}-{h:02}:{m:02}:{s:02}")), Ok(want));
            prop_assert_eq!(parse_duration(&format!("{m:02}:{s:02}")), Ok(Duration::from_secs(m * 60 + s)));
        }

        #[test]
        fn format_and_parse_round_trip(secs in 0u64..100 * 86_400) {
            prop_assert_eq!(parse_duration(&format_duration(secs)), Ok(Duration::from_secs(secs)));
        }

        #[test]
        fn never_panic(s in "\\PC{0,16}") {
            let _ = parse_duration(&s);
            let _ = parse_limit(&s);
            let _ = parse_time(&s, &utc);
            let _ = parse_civil(&s);
        }
    }
}

//! When the allocation ends: `--end-time`, `--time-limit`, and Slurm's answers.
//!
//! Everything here is a pure parser except [`local_to_epoch`], which asks the C library for the
//! machine's time zone (Slurm prints `EndTime=` in local time unless `SLURM_TIME_FORMAT=%s`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::values::MAX_SECONDS;

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

/// Where the end time came from; its name is the stop's trigger in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndSource {
    /// `--end-time`.
    Flag,
    /// `--time-limit`, counted from the agent's start.
    Limit,
    /// Slurm: `SLURM_JOB_END_TIME`, `squeue` or `scontrol show job`.
    Slurm,
}

impl EndSource {
    pub fn trigger(self) -> &'static str {
        match self {
            EndSource::Flag => "end-time",
            EndSource::Limit | EndSource::Slurm => "time-limit",
        }
    }
}

fn end_time_error(value: &str, why: &str) -> String {
    format!(
        "--end-time {value:?}: {why}; give unix seconds (1767225600) or an RFC 3339 time with a zone (2026-01-01T00:00:00Z, 2026-01-01T01:00:00+01:00)"
    )
}

/// Parses `--end-time`: unix seconds (fractions allowed) or RFC 3339 with `Z` or an offset.
pub fn parse_end_time(value: &str) -> Result<SystemTime, String> {
    let s = value.trim();
    if s.is_empty() {
        return Err(end_time_error(value, "it is empty"));
    }
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return match s.parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(UNIX_EPOCH + Duration::from_secs_f64(x)),
            _ => Err(end_time_error(value, "it is not a time")),
        };
    }
    parse_rfc3339(s).map_err(|why| end_time_error(value, &why))
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM)`; `t`/space for `T` and `z` for `Z` allowed.
pub fn parse_rfc3339(s: &str) -> Result<SystemTime, String> {
    let b = s.as_bytes();
    if b.len() < 19 || !s.is_char_boundary(19) || !matches!(b[10], b'T' | b't' | b' ') {
        return Err("it is neither a number nor an RFC 3339 time".into());
    }
    let civil = parse_civil(&s[..19]).ok_or("it is neither a number nor an RFC 3339 time")?;
    let mut rest = &s[19..];
    let mut frac = 0.0;
    if let Some(r) = rest.strip_prefix('.') {
        let digits = r.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err("the fraction of a second has no digits".into());
        }
        frac = format!("0.{}", &r[..digits]).parse::<f64>().unwrap_or(0.0);
        rest = &r[digits..];
    }
    let offset: i64 = match rest {
        "Z" | "z" => 0,
        "" => return Err("it has no time zone (end it with Z or an offset such as +02:00)".into()),
        _ => {
            let ob = rest.as_bytes();
            let sign = match ob[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return Err(format!("{rest:?} is not a time zone")),
            };
            let (h, m) = rest[1..]
                .split_once(':')
                .ok_or_else(|| format!("{rest:?} is not a time zone"))?;
            let num = |t: &str, max: i64| {
                (t.len() == 2 && t.bytes().all(|c| c.is_ascii_digit()))
                    .then(|| t.parse::<i64>().ok())
                    .flatten()
                    .filter(|v| *v <= max)
            };
            match (num(h, 23), num(m, 59)) {
                (Some(h), Some(m)) => sign * (h * 3600 + m * 60),
                _ => return Err(format!("{rest:?} is not a time zone")),
            }
        }
    };
    let secs = civil_to_epoch(civil) - offset;
    epoch_to_system(secs as f64 + frac).ok_or_else(|| "it is before 1970".into())
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

fn epoch_to_system(secs: f64) -> Option<SystemTime> {
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

fn time_limit_error(value: &str, why: &str) -> String {
    format!(
        "--time-limit {value:?}: {why}; give a duration as Slurm writes one (90 = 90 minutes, 1:30:00, 2-00:00:00) or with a unit (45m, 2h, 1d)"
    )
}

/// Parses `--time-limit`: more than zero, at most a year.
pub fn parse_time_limit(value: &str) -> Result<Duration, String> {
    let d = parse_duration(value.trim()).map_err(|why| time_limit_error(value, &why))?;
    if d.is_zero() {
        return Err(time_limit_error(value, "it must be more than zero"));
    }
    if d.as_secs_f64() > MAX_SECONDS {
        return Err(time_limit_error(value, "it is more than a year"));
    }
    Ok(d)
}

/// A duration as Slurm or a person writes it; shared with `vigil launch` (one parser for both).
pub use vigil_recipes::slurm::parse_duration;

/// Slurm's `TimeLimit=`: `None` for `UNLIMITED`, `Partition_Limit` and the like.
pub fn parse_slurm_time_limit(s: &str) -> Option<Duration> {
    parse_duration(s.trim()).ok().filter(|d| !d.is_zero())
}

/// `SLURM_JOB_END_TIME` (Slurm >= 23.02): epoch seconds; `None` when unset, empty or zero.
pub fn parse_slurm_end_env(value: Option<&str>) -> Option<SystemTime> {
    let v = value?.trim();
    v.parse::<u64>()
        .ok()
        .filter(|s| *s > 0)
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

/// A time as Slurm prints it: epoch seconds under `SLURM_TIME_FORMAT=%s`, else
/// `YYYY-MM-DDTHH:MM:SS` in local time (converted with `local`). `Ok(None)` for the words Slurm
/// uses when there is no time (`N/A`, `Unknown`, `None`, empty).
pub fn parse_slurm_time(
    s: &str,
    local: &dyn Fn(Civil) -> Option<i64>,
) -> Result<Option<SystemTime>, String> {
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
            Err(_) => Err(format!("Slurm's time {t:?} is too large")),
        };
    }
    let c = parse_civil(t).ok_or_else(|| format!("Slurm's time {t:?} is not a time"))?;
    let secs = local(c).ok_or_else(|| format!("Slurm's time {t:?} does not exist here"))?;
    Ok(epoch_to_system(secs as f64))
}

/// `SLURM_TIME_FORMAT=%s squeue -h -j ID -o %e`: the job's end, if it has one.
pub fn parse_squeue_end(out: &str) -> Result<Option<SystemTime>, String> {
    let line = out
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    parse_slurm_time(line, &local_to_epoch)
}

/// An end given by a flag, with the flag's text.
#[derive(Debug, Clone, Copy)]
pub enum FlagEnd<'a> {
    /// `--end-time`.
    At(SystemTime, &'a str),
    /// `--time-limit`.
    After(Duration, &'a str),
}

/// Refuses an end given by flags that leaves no time before the stop lead `lead`: the ranks would
/// be asked to stop before their first step, in every run (`--end-time` past or within the lead,
/// a `--time-limit` not longer than it). Slurm's own end, known only at run time, caps the lead
/// instead (`allocation::lead::cap`).
pub fn check_flag_end(end: &FlagEnd, lead: Duration, now: SystemTime) -> Result<(), String> {
    let lead_s = lead.as_secs_f64();
    let smaller = |span: Duration| (span.as_secs_f64() / 4.0).floor().max(1.0);
    match *end {
        FlagEnd::At(t, v) => match t.duration_since(now) {
            Err(ago) => Err(format!(
                "--end-time {v}: that time has passed ({:.0}s ago); give a time in the future, such as {}",
                ago.duration().as_secs_f64(),
                humantime::format_rfc3339_seconds(now + Duration::from_secs(4 * 3600))
            )),
            Ok(left) if left <= lead => Err(format!(
                "--end-time {v} is {:.0}s away, not more than the stop lead ({lead_s:.0}s, --stop-lead): the ranks would be asked to stop at once; give a later end, or a smaller --stop-lead (such as --stop-lead {:.0})",
                left.as_secs_f64(),
                smaller(left)
            )),
            Ok(_) => Ok(()),
        },
        FlagEnd::After(d, v) if d <= lead => Err(format!(
            "--time-limit {v} is not longer than the stop lead ({lead_s:.0}s, --stop-lead): the ranks would be asked to stop at once; give a longer --time-limit, or a smaller --stop-lead (such as --stop-lead {:.0})",
            smaller(d)
        )),
        FlagEnd::After(..) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(secs: f64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs_f64(secs)
    }

    fn utc(c: Civil) -> Option<i64> {
        Some(civil_to_epoch(c))
    }

    #[test]
    fn end_time_takes_unix_seconds_and_rfc3339_with_a_zone() {
        assert_eq!(parse_end_time("1767225600").unwrap(), at(1_767_225_600.0));
        assert_eq!(
            parse_end_time(" 1767225600.5 ").unwrap(),
            at(1_767_225_600.5)
        );
        assert_eq!(
            parse_end_time("2026-01-01T00:00:00Z").unwrap(),
            at(1_767_225_600.0)
        );
        assert_eq!(
            parse_end_time("2026-01-01t00:00:00z").unwrap(),
            at(1_767_225_600.0)
        );
        assert_eq!(
            parse_end_time("2026-01-01T01:00:00+01:00").unwrap(),
            at(1_767_225_600.0)
        );
        assert_eq!(
            parse_end_time("2025-12-31T19:30:00-04:30").unwrap(),
            at(1_767_225_600.0)
        );
        assert_eq!(
            parse_end_time("2026-01-01 00:00:00.25Z").unwrap(),
            at(1_767_225_600.25)
        );
    }

    #[test]
    fn a_bad_end_time_names_the_flag_the_value_and_a_good_one() {
        for (bad, says) in [
            ("", "empty"),
            ("tomorrow", "neither a number"),
            ("2026-01-01T00:00:00", "no time zone"),
            ("2026-02-30T00:00:00Z", "neither a number"),
            ("2026-01-01T00:00:00+25:00", "not a time zone"),
            ("2026-01-01T00:00:00.Z", "no digits"),
            ("0", "not a time"),
            ("1.2.3", "not a time"),
            ("1969-12-31T00:00:00Z", "before 1970"),
        ] {
            let e = parse_end_time(bad).unwrap_err();
            assert!(e.starts_with(&format!("--end-time {bad:?}")), "{e}");
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.contains("2026-01-01T00:00:00Z"), "{e}");
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn time_limit_takes_slurm_forms_and_units() {
        let s = Duration::from_secs;
        for (text, want) in [
            ("90", s(90 * 60)),
            ("5:30", s(5 * 60 + 30)),
            ("1:30:00", s(5400)),
            ("2-12", s(2 * 86_400 + 12 * 3600)),
            ("1-00:30", s(86_400 + 1800)),
            ("1-02:03:04", s(86_400 + 2 * 3600 + 3 * 60 + 4)),
            ("90s", s(90)),
            ("45m", s(2700)),
            ("2h", s(7200)),
            ("1d", s(86_400)),
            ("1h30m", s(5400)),
        ] {
            assert_eq!(parse_time_limit(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn a_bad_time_limit_is_one_line_naming_the_flag() {
        for (bad, says) in [
            ("0", "more than zero"),
            ("0:00:00", "more than zero"),
            ("0s", "more than zero"),
            ("-5", "negative"),
            ("", "empty"),
            ("soon", "soon"),
            ("1:2:3:4", "too many fields"),
            ("1-2:3:4:5", "too many fields"),
            ("a-b", "a-b"),
            ("400d", "more than a year"),
            ("99999999999999999999", "too large"),
            ("1::2", "not a whole number"),
        ] {
            let e = parse_time_limit(bad).unwrap_err();
            assert!(e.starts_with(&format!("--time-limit {bad:?}")), "{e}");
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.contains("1:30:00") && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn slurm_time_limits_and_their_words_for_none() {
        assert_eq!(
            parse_slurm_time_limit("00:10:00"),
            Some(Duration::from_secs(600))
        );
        assert_eq!(
            parse_slurm_time_limit("1-00:00:00"),
            Some(Duration::from_secs(86_400))
        );
        for none in [
            "UNLIMITED",
            "Partition_Limit",
            "NOT_SET",
            "INVALID",
            "",
            "N/A",
        ] {
            assert_eq!(parse_slurm_time_limit(none), None, "{none}");
        }
    }

    #[test]
    fn slurm_end_times_epoch_local_and_none() {
        assert_eq!(
            parse_slurm_end_env(Some("1767225600")),
            Some(at(1_767_225_600.0))
        );
        for none in [None, Some(""), Some("0"), Some("soon")] {
            assert_eq!(parse_slurm_end_env(none), None);
        }
        assert_eq!(
            parse_slurm_time("1767225600", &utc),
            Ok(Some(at(1_767_225_600.0)))
        );
        assert_eq!(
            parse_slurm_time("2026-01-01T00:00:00", &utc),
            Ok(Some(at(1_767_225_600.0)))
        );
        for none in ["N/A", "Unknown", "NONE", "", "  ", "0"] {
            assert_eq!(parse_slurm_time(none, &utc), Ok(None), "{none:?}");
        }
        assert!(parse_slurm_time("later", &utc)
            .unwrap_err()
            .contains("\"later\""));
        assert_eq!(
            parse_squeue_end("1767225600\n"),
            Ok(Some(at(1_767_225_600.0)))
        );
        assert_eq!(parse_squeue_end("N/A\n"), Ok(None));
        assert_eq!(parse_squeue_end(""), Ok(None));
    }

    #[test]
    fn local_time_round_trips_through_the_c_library() {
        let now = std::time::SystemTime::now()
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
        fn rfc3339_round_trips_with_any_offset(secs in 0i64..4_000_000_000, off_min in -1439i64..1440) {
            // Format `secs` as the civil time at offset `off_min`, then parse it back.
            let local = secs + off_min * 60;
            let days = local.div_euclid(86_400);
            let tod = local.rem_euclid(86_400);
            // civil_from_days (Hinnant)
            let z = days + 719_468;
            let era = z.div_euclid(146_097);
            let doe = z - era * 146_097;
            let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
            let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
            let mp = (5 * doy + 2) / 153;
            let d = doy - (153 * mp + 2) / 5 + 1;
            let m = if mp < 10 { mp + 3 } else { mp - 9 };
            let y = yoe + era * 400 + i64::from(m <= 2);
            let sign = if off_min < 0 { '-' } else { '+' };
            let text = format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{sign}{:02}:{:02}",
                tod / 3600, tod / 60 % 60, tod % 60, off_min.abs() / 60, off_min.abs() % 60
            );
            let got = parse_rfc3339(&text);
            if secs == 0 {
                prop_assert!(got.is_err());
            } else {
                prop_assert_eq!(got, Ok(at(secs as f64)), "{}", text);
            }
        }

        #[test]
        fn durations_never_panic(s in "\\PC{0,16}") {
            let _ = parse_time_limit(&s);
            let _ = parse_end_time(&s);
            let _ = parse_slurm_time(&s, &utc);
        }

        #[test]
        fn slurm_clock_forms_add_up(d in 0u64..400, h in 0u64..24, m in 0u64..60, s in 0u64..60) {
            let want = Duration::from_secs(d * 86_400 + h * 3600 + m * 60 + s);
            prop_assert_eq!(parse_duration(&format!("{d}-{h:02}:{m:02}:{s:02}")), Ok(want));
        }
    }
}

//! When the allocation ends: `--end-time` and `--time-limit` (vigil's own flags), and what Slurm
//! says (its forms are read by `vigil_slurm::time`, re-exported here for the callers).
//!
//! Pure parsers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use vigil_slurm::time::{civil_to_epoch, epoch_to_system, parse_civil, DurationError};
pub use vigil_slurm::time::{
    parse_duration, parse_end_env as parse_slurm_end_env, parse_squeue_end,
};

use crate::values::MAX_SECONDS;

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

/// A bad `--end-time`: the value as given and why, with the forms it takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--end-time {value:?}: {why}; give unix seconds (1767225600) or an RFC 3339 time with a zone (2026-01-01T00:00:00Z, 2026-01-01T01:00:00+01:00)")]
pub struct EndTimeError {
    pub value: String,
    pub why: Rfc3339Error,
}

/// Why a text is not an RFC 3339 time (or, for `--end-time`, unix seconds).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rfc3339Error {
    #[error("it is empty")]
    Empty,
    #[error("it is not a time")]
    NotATime,
    #[error("it is neither a number nor an RFC 3339 time")]
    NeitherForm,
    #[error("the fraction of a second has no digits")]
    NoFractionDigits,
    #[error("it has no time zone (end it with Z or an offset such as +02:00)")]
    NoZone,
    #[error("{0:?} is not a time zone")]
    BadZone(String),
    #[error("it is before 1970")]
    Before1970,
}

/// Parses `--end-time`: unix seconds (fractions allowed) or RFC 3339 with `Z` or an offset.
pub fn parse_end_time(value: &str) -> Result<SystemTime, EndTimeError> {
    let fail = |why| EndTimeError {
        value: value.to_string(),
        why,
    };
    let s = value.trim();
    if s.is_empty() {
        return Err(fail(Rfc3339Error::Empty));
    }
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return match s.parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(UNIX_EPOCH + Duration::from_secs_f64(x)),
            _ => Err(fail(Rfc3339Error::NotATime)),
        };
    }
    parse_rfc3339(s).map_err(fail)
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM)`; `t`/space for `T` and `z` for `Z` allowed.
pub fn parse_rfc3339(s: &str) -> Result<SystemTime, Rfc3339Error> {
    let b = s.as_bytes();
    if b.len() < 19 || !s.is_char_boundary(19) || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(Rfc3339Error::NeitherForm);
    }
    let civil = parse_civil(&s[..19]).ok_or(Rfc3339Error::NeitherForm)?;
    let mut rest = &s[19..];
    let mut frac = 0.0;
    if let Some(r) = rest.strip_prefix('.') {
        let digits = r.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(Rfc3339Error::NoFractionDigits);
        }
        frac = format!("0.{}", &r[..digits]).parse::<f64>().unwrap_or(0.0);
        rest = &r[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        "" => return Err(Rfc3339Error::NoZone),
        _ => zone_offset(rest).ok_or_else(|| Rfc3339Error::BadZone(rest.into()))?,
    };
    let secs = civil_to_epoch(civil) - offset;
    epoch_to_system(secs as f64 + frac).ok_or(Rfc3339Error::Before1970)
}

/// `+HH:MM` or `-HH:MM` in seconds east of UTC.
fn zone_offset(zone: &str) -> Option<i64> {
    let sign = match zone.as_bytes()[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let (h, m) = zone[1..].split_once(':')?;
    let num = |t: &str, max: i64| {
        (t.len() == 2 && t.bytes().all(|c| c.is_ascii_digit()))
            .then(|| t.parse::<i64>().ok())
            .flatten()
            .filter(|v| *v <= max)
    };
    Some(sign * (num(h, 23)? * 3600 + num(m, 59)? * 60))
}

/// A bad `--time-limit`: the value as given and why, with the forms it takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--time-limit {value:?}: {why}; give a duration as Slurm writes one (90 = 90 minutes, 1:30:00, 2-00:00:00) or with a unit (45m, 2h, 1d)")]
pub struct TimeLimitError {
    pub value: String,
    pub why: LimitWhy,
}

/// Why a `--time-limit` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitWhy {
    #[error(transparent)]
    Duration(#[from] DurationError),
    #[error("it must be more than zero")]
    Zero,
    #[error("it is more than a year")]
    OverAYear,
}

/// Parses `--time-limit`: more than zero, at most a year.
pub fn parse_time_limit(value: &str) -> Result<Duration, TimeLimitError> {
    let fail = |why| TimeLimitError {
        value: value.to_string(),
        why,
    };
    let d = parse_duration(value.trim()).map_err(|e| fail(e.into()))?;
    if d.is_zero() {
        return Err(fail(LimitWhy::Zero));
    }
    if d.as_secs_f64() > MAX_SECONDS {
        return Err(fail(LimitWhy::OverAYear));
    }
    Ok(d)
}

/// An end given by a flag, with the flag's text.
#[derive(Debug, Clone, Copy)]
pub enum FlagEnd<'a> {
    /// `--end-time`.
    At(SystemTime, &'a str),
    /// `--time-limit`.
    After(Duration, &'a str),
}

/// An end given by flags that leaves no time before the stop lead; each says what to give
/// instead.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FlagEndError {
    #[error("--end-time {value}: that time has passed ({ago_s:.0}s ago); give a time in the future, such as {}", humantime::format_rfc3339_seconds(*.example))]
    Passed {
        value: String,
        ago_s: f64,
        example: SystemTime,
    },
    #[error("--end-time {value} is {left_s:.0}s away, not more than the stop lead ({lead_s:.0}s, --stop-lead): the ranks would be asked to stop at once; give a later end, or a smaller --stop-lead (such as --stop-lead {smaller:.0})")]
    EndWithinLead {
        value: String,
        left_s: f64,
        lead_s: f64,
        smaller: f64,
    },
    #[error("--time-limit {value} is not longer than the stop lead ({lead_s:.0}s, --stop-lead): the ranks would be asked to stop at once; give a longer --time-limit, or a smaller --stop-lead (such as --stop-lead {smaller:.0})")]
    LimitWithinLead {
        value: String,
        lead_s: f64,
        smaller: f64,
    },
}

/// Refuses an end given by flags that leaves no time before the stop lead `lead`: the ranks would
/// be asked to stop before their first step, in every run (`--end-time` past or within the lead,
/// a `--time-limit` not longer than it). Slurm's own end, known only at run time, caps the lead
/// instead (`allocation::lead::cap`).
pub fn check_flag_end(end: &FlagEnd, lead: Duration, now: SystemTime) -> Result<(), FlagEndError> {
    let lead_s = lead.as_secs_f64();
    let smaller = |span: Duration| (span.as_secs_f64() / 4.0).floor().max(1.0);
    match *end {
        FlagEnd::At(t, v) => match t.duration_since(now) {
            Err(ago) => Err(FlagEndError::Passed {
                value: v.into(),
                ago_s: ago.duration().as_secs_f64(),
                example: now + Duration::from_secs(4 * 3600),
            }),
            Ok(left) if left <= lead => Err(FlagEndError::EndWithinLead {
                value: v.into(),
                left_s: left.as_secs_f64(),
                lead_s,
                smaller: smaller(left),
            }),
            Ok(_) => Ok(()),
        },
        FlagEnd::After(d, v) if d <= lead => Err(FlagEndError::LimitWithinLead {
            value: v.into(),
            lead_s,
            smaller: smaller(d),
        }),
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
            let e = parse_end_time(bad).unwrap_err().to_string();
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
            let e = parse_time_limit(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--time-limit {bad:?}")), "{e}");
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.contains("1:30:00") && !e.contains('\n'), "{e}");
        }
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
        }
    }
}

//! Plain values every layer parses or names: durations, counts, ports, signals, file-safe job
//! ids, and the error a bad one gives. A leaf: it imports nothing from the crate, so every other
//! module may use it without forming a circle.

/// A launch request that cannot be carried out; the message names the problem and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Why a flag's value was refused: the fix, such as "give a port number from 0 to 65535" (clap
/// puts the flag and the value in front).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadValue(pub String);

pub fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// The longest duration any flag takes: a year. Larger values overflow the clock arithmetic and
/// are never meant; leave a timeout out to disable it.
pub const MAX_SECONDS: f64 = vigil_events::MAX_SECONDS;

/// Value parser of every seconds flag: a finite number from 0 to [`MAX_SECONDS`].
pub fn seconds(s: &str) -> Result<f64, BadValue> {
    let fix =
        format!("give a number of seconds from 0 to {MAX_SECONDS:.0} (a year), such as 30 or 2.5");
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=MAX_SECONDS).contains(&v) => Ok(v),
        _ => Err(BadValue(fix)),
    }
}

/// Value parser of every count flag: a whole number >= 0 that fits 32 bits.
pub fn count(s: &str) -> Result<u32, BadValue> {
    s.trim()
        .parse::<u32>()
        .map_err(|_| BadValue(format!("give a whole number from 0 to {}", u32::MAX)))
}

/// Value parser of torchrun's switches (`--standalone`, `-m`, ...), which also come from `PET_*`
/// as an integer: non-zero is on, as torchrun's `bool(int(value))`. `true`/`false` are clap's own
/// values for a switch given or left out.
pub fn pet_switch(s: &str) -> Result<bool, BadValue> {
    match s.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        t => t
            .parse::<i64>()
            .map(|n| n != 0)
            .map_err(|_| BadValue("give 1 (on) or 0 (off)".to_string())),
    }
}

/// Value parser of a TCP port flag.
pub fn port(s: &str) -> Result<u16, BadValue> {
    s.trim()
        .parse::<u16>()
        .map_err(|_| BadValue("give a port number from 0 to 65535".to_string()))
}

/// Value parser of a score threshold (`--straggler-threshold`): a number from 0 to 1.
pub fn fraction(s: &str) -> Result<f64, BadValue> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(BadValue(
            "give a number from 0 to 1, such as 0.7".to_string(),
        )),
    }
}

/// Value parser of `--safety-factor`: a finite number from 1 to 1000.
pub fn factor(s: &str) -> Result<f64, BadValue> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (1.0..=1000.0).contains(&v) => Ok(v),
        _ => Err(BadValue(
            "give a number from 1 to 1000, such as 5".to_string(),
        )),
    }
}

/// A job id made safe for a file name (the schema crate's, so the report and the ledger find
/// the directories the agent names).
pub use vigil_events::file_safe;

/// `SIGTERM`, `TERM`, `15`: a signal number.
pub fn parse_signal(flag: &str, s: &str) -> Result<i32, ConfigError> {
    let t = s.trim();
    if let Ok(n) = t.parse::<i32>() {
        if nix::sys::signal::Signal::try_from(n).is_ok() {
            return Ok(n);
        }
    }
    let name = t.trim_start_matches("signal.").to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    name.parse::<nix::sys::signal::Signal>()
        .map(|s| s as i32)
        .map_err(|_| {
            ConfigError(format!(
                "{flag} {s:?} is not a signal: give a name such as SIGTERM or SIGKILL, or a number"
            ))
        })
}

/// `SIGTERM` for 15; `signal 99` for a number that names no signal (the schema crate's, so the
/// event log and the report name signals alike).
pub use vigil_events::signal_name;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_parsers_take_only_sane_numbers() {
        assert_eq!(seconds("2.5"), Ok(2.5));
        assert_eq!(seconds(" 0 "), Ok(0.0));
        assert_eq!(count("7"), Ok(7));
        assert_eq!(port("0"), Ok(0));
        assert_eq!(factor("5"), Ok(5.0));
        for bad in [
            "-1", "1e30", "inf", "-inf", "nan", "NaN", "abc", "", "31536001",
        ] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
        for bad in ["-1", "1.5", "1e3", "4294967296", "x", ""] {
            assert!(count(bad).is_err(), "{bad}");
        }
        for bad in ["65536", "-1", "80.0"] {
            assert!(port(bad).is_err(), "{bad}");
        }
        for bad in ["0", "0.99", "1001", "nan", "inf"] {
            assert!(factor(bad).is_err(), "{bad}");
        }
    }
}

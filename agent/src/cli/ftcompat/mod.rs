//! `ft_launcher` compatibility: rewrites NVIDIA Resiliency Extension (NVRx) `ft_launcher` flags and
//! its `--ft-cfg-path` YAML file into vigil's own flags, so a job switches by changing one word.
//!
//! [`translate`] is pure: it reads the YAML file only through the reader it is given. It rewrites
//! every ft_launcher flag that comes before the training script, in every spelling NVRx has
//! accepted (`--ft-rank-heartbeat-timeout`, `--ft-rank_heartbeat_timeout`,
//! `--ft_rank_heartbeat_timeout`, the deprecated `--ft-param-rank_heartbeat_timeout`, `--x=v` and
//! `--x v`), and leaves the training script and everything after it untouched. Settings with no
//! effect in vigil are accepted and reported as notes, one line each. Precedence, lowest first:
//! the YAML file, ft flags on the command line, vigil's own flags given explicitly.
//! The table of every flag and key is in docs/ft_launcher.md.

pub mod help;
mod table;
mod yaml;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use table::{Dflt, Effect, Kind, Opt, FLAG_ALIASES, OPTS};
use yaml::load_cfg;

/// The rewritten arguments and one line for each accepted setting that changes nothing in vigil.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translated {
    /// Arguments for `vigil run`, ft_launcher flags replaced by vigil's.
    pub args: Vec<String>,
    /// Where the training script (or a `--` before it) starts in `args`; `args.len()` if none.
    /// Everything from here on belongs to the script and must not be parsed as vigil's flags.
    pub script_at: usize,
    /// One line each, for the binary to print (accepted settings without effect, ignored ones).
    pub notes: Vec<String>,
}

/// Why an ft_launcher command line cannot be translated; `Display` is one line with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FtError {
    #[error("unknown ft_launcher flag `{flag}`: did you mean `{suggestion}`? (every flag is listed in docs/ft_launcher.md)")]
    UnknownFlag { flag: String, suggestion: String },
    #[error("`{flag}` needs a value: give `{flag} VALUE` or `{flag}=VALUE`")]
    MissingValue { flag: String },
    #[error("{flag} is ambiguous: it could be {candidates}; write more of the flag's name")]
    Ambiguous { flag: String, candidates: String },
    #[error("bad value `{value}` for {origin}: expected {expected}")]
    BadValue {
        origin: String,
        value: String,
        expected: String,
    },
    #[error("cannot read the ft_launcher config `{path}` given by {flag}: {reason}; fix the path, or add --ignore-missing-fault-tol-cfg to run with the other settings")]
    CfgUnreadable {
        path: String,
        flag: String,
        reason: String,
    },
    #[error("the ft_launcher config `{path}` has no `fault_tolerance:` section: add one, or add --ignore-missing-fault-tol-cfg to run with the other settings")]
    CfgNoSection { path: String },
    #[error("the ft_launcher config `{path}` is not usable: {reason}; fix the file")]
    CfgInvalid { path: String, reason: String },
}

/// To the binary an untranslatable line is a launch request that cannot be carried out; the
/// message is the same one line.
impl From<FtError> for crate::values::ConfigError {
    fn from(e: FtError) -> Self {
        crate::values::ConfigError(e.to_string())
    }
}

/// One of `vigil run`'s flags as clap defines it.
struct RunFlag {
    /// The dash spelling without `--`.
    long: String,
    short: Option<char>,
    takes_value: bool,
}

/// `vigil run`'s flags, read from clap's own definition of `vigil run`: every other flag before
/// the script is a switch.
fn run_flags() -> &'static [RunFlag] {
    static FLAGS: std::sync::OnceLock<Vec<RunFlag>> = std::sync::OnceLock::new();
    FLAGS.get_or_init(|| {
        use clap::CommandFactory;
        let cli = crate::cli::Cli::command();
        let run = cli
            .find_subcommand("run")
            .expect("`vigil run` is a subcommand");
        run.get_arguments()
            .filter_map(|a| {
                Some(RunFlag {
                    long: a.get_long()?.replace('_', "-"),
                    short: a.get_short(),
                    takes_value: a.get_action().takes_values(),
                })
            })
            .collect()
    })
}

fn takes_value(norm: &str) -> bool {
    run_flags().iter().any(|f| f.takes_value && f.long == norm)
}

/// The long name of `vigil run`'s short flag `c` when it takes a value (`-r` is `redirects`).
fn value_short(c: char) -> Option<&'static str> {
    run_flags()
        .iter()
        .find(|f| f.takes_value && f.short == Some(c))
        .map(|f| f.long.as_str())
}

/// argparse's habit that torchrun users rely on: an unambiguous prefix of a long flag is that
/// flag (`--max-restart` is `--max-restarts`). `norm` is the dash spelling without `--`. Returns
/// the whole flag's name, or `norm` itself when it is a flag or no flag starts with it (clap then
/// names the unknown flag); a prefix of several flags is an error naming them.
fn resolve_prefix(norm: &str, flag: &str) -> Result<String, FtError> {
    let flags = run_flags();
    if norm.is_empty() || flags.iter().any(|f| f.long == norm) {
        return Ok(norm.to_string());
    }
    let matches: Vec<&str> = flags
        .iter()
        .map(|f| f.long.as_str())
        .filter(|n| n.starts_with(norm))
        .collect();
    match matches.as_slice() {
        [] => Ok(norm.to_string()),
        [one] => Ok(one.to_string()),
        many => Err(FtError::Ambiguous {
            flag: flag.to_string(),
            candidates: many
                .iter()
                .map(|n| format!("--{n}"))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// A parsed setting. `None` is ft's null: disabled or unset.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    None,
    F(f64),
    I(i64),
    B(bool),
    S(String),
    Sections(Vec<(String, Option<f64>)>),
}

/// A setting with where it came from, for notes and errors.
struct Setting {
    val: Val,
    origin: String,
    from_yaml: bool,
}

/// What an ft_launcher flag is.
enum FtFlag {
    CfgPath,
    IgnoreMissing,
    Opt(usize),
}

/// What the flags before the training script said.
#[derive(Default)]
struct Scan {
    /// vigil's and torchrun's own flags with their values, as given (a prefix written whole).
    kept: Vec<String>,
    /// vigil's flags given explicitly (dash spelling, no `--`): each wins over its ft setting.
    explicit: HashSet<String>,
    /// ft_launcher settings from the command line, by index into `OPTS`.
    cli: HashMap<usize, Setting>,
    /// `--ft-cfg-path`'s value and the flag as written.
    cfg: Option<(String, String)>,
    ignore_missing: bool,
}

/// Rewrite `vigil run`'s arguments (the argv after the subcommand) from ft_launcher's flags to
/// vigil's. `read` reads the `--ft-cfg-path` file.
pub fn translate(
    args: &[String],
    read: &dyn Fn(&Path) -> std::io::Result<String>,
) -> Result<Translated, FtError> {
    let mut scan = Scan::default();
    let mut tail_at = args.len();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" || !arg.starts_with('-') || arg == "-" {
            tail_at = i;
            break;
        }
        i += match arg.strip_prefix("--") {
            Some(body) => scan.long(args, i, body)?,
            None => scan.shorts(args, i),
        };
    }
    let mut notes = Vec::new();
    let yaml = match &scan.cfg {
        Some((path, flag)) => load_cfg(path, flag, scan.ignore_missing, read, &mut notes)?,
        None => HashMap::new(),
    };
    let mapped = vigil_flags(&scan.cli, &yaml, &scan.explicit, &mut notes);
    let mut out = scan.kept;
    out.extend(mapped);
    let script_at = out.len();
    out.extend(args[tail_at..].iter().cloned());
    Ok(Translated {
        args: out,
        script_at,
        notes,
    })
}

impl Scan {
    /// Takes the long flag `args[i]` (`--` stripped: `body`); returns how many arguments it used.
    fn long(&mut self, args: &[String], i: usize, body: &str) -> Result<usize, FtError> {
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        let norm = name.replace('_', "-");
        let flag = format!("--{name}");
        match classify(&norm, &flag)? {
            Some(FtFlag::CfgPath) => {
                let (value, used) = take_value(args, i, inline, &flag)?;
                self.cfg = Some((value, flag));
                Ok(used)
            }
            Some(FtFlag::IgnoreMissing) => {
                self.ignore_missing = match inline {
                    Some(v) => parse_bool(v).ok_or_else(|| bad(&flag, v, Kind::Bool))?,
                    None => true,
                };
                Ok(1)
            }
            Some(FtFlag::Opt(idx)) => {
                let (setting, used) = ft_setting(&OPTS[idx], args, i, inline, &flag)?;
                self.cli.insert(idx, setting);
                Ok(used)
            }
            None => {
                let norm = resolve_prefix(&norm, &flag)?;
                // A prefix is written out whole, so that clap sees the flag itself.
                self.kept
                    .push(match (name.replace('_', "-") == norm, inline) {
                        (true, _) => args[i].clone(),
                        (false, Some(v)) => format!("--{norm}={v}"),
                        (false, None) => format!("--{norm}"),
                    });
                let value = inline.is_none() && takes_value(&norm);
                self.explicit.insert(norm);
                match args.get(i + 1).filter(|_| value) {
                    Some(v) => {
                        self.kept.push(v.clone());
                        Ok(2)
                    }
                    None => Ok(1),
                }
            }
        }
    }

    /// Takes a cluster of short flags, `args[i]`: `-m`, `-r 3`, `-r3`, `-mr3`; returns how many
    /// arguments it used.
    fn shorts(&mut self, args: &[String], i: usize) -> usize {
        let arg = &args[i];
        self.kept.push(arg.clone());
        let shorts: Vec<char> = arg.chars().skip(1).collect();
        for (k, c) in shorts.iter().enumerate() {
            if let Some(long) = value_short(*c) {
                self.explicit.insert(long.to_string());
                if k + 1 == shorts.len() {
                    if let Some(v) = args.get(i + 1) {
                        self.kept.push(v.clone());
                        return 2;
                    }
                }
                break;
            }
        }
        1
    }
}

/// The ft_launcher setting `opt` given as the flag at `args[i]`, and how many arguments it used.
fn ft_setting(
    opt: &Opt,
    args: &[String],
    i: usize,
    inline: Option<&str>,
    flag: &str,
) -> Result<(Setting, usize), FtError> {
    let (raw, used) = if matches!(opt.kind, Kind::Bool) && inline.is_none() {
        // `--ft-enable-nic-monitor` alone means true; a boolean after it is its value.
        match args.get(i + 1).filter(|n| parse_bool(n).is_some()) {
            Some(n) => (n.clone(), 2),
            None => ("true".to_string(), 1),
        }
    } else {
        take_value(args, i, inline, flag)?
    };
    let val = parse_str(opt.kind, &raw).ok_or_else(|| bad(flag, &raw, opt.kind))?;
    let origin = if inline.is_some() || used == 1 {
        format!("{flag}={raw}")
    } else {
        format!("{flag} {raw}")
    };
    let setting = Setting {
        val,
        origin,
        from_yaml: false,
    };
    Ok((setting, used))
}

/// vigil's flags for the ft settings (the command line's over the YAML file's), in `OPTS`
/// order; a note for each setting a vigil flag given explicitly overrides, and for each that
/// has no effect in vigil.
fn vigil_flags(
    cli: &HashMap<usize, Setting>,
    yaml: &HashMap<usize, Setting>,
    explicit: &HashSet<String>,
    notes: &mut Vec<String>,
) -> Vec<String> {
    let mut mapped = Vec::new();
    for (idx, opt) in OPTS.iter().enumerate() {
        let Some(setting) = cli.get(&idx).or_else(|| yaml.get(&idx)) else {
            continue;
        };
        match opt.effect {
            Effect::Map(target) => {
                let Some(value) = render(&setting.val) else {
                    continue;
                };
                if explicit.contains(&target[2..]) {
                    notes.push(format!(
                        "{}: ignored, {target} given explicitly wins",
                        setting.origin
                    ));
                } else if matches!(opt.kind, Kind::Bool) {
                    // vigil's boolean flags are switches that take a value only after `=`.
                    mapped.push(format!("{target}={value}"));
                } else {
                    mapped.push(target.to_string());
                    mapped.push(value);
                }
            }
            Effect::Note(why) => {
                if setting.val == Val::None
                    || (setting.from_yaml && is_default(&setting.val, opt.default))
                {
                    continue;
                }
                notes.push(format!("{}: accepted, no effect: {why}", setting.origin));
            }
        }
    }
    // NVRx's tracker stops after 2 attempts without progress unless told otherwise; vigil's own
    // default (3) is for its step-based check.
    let given = |m: &[String], t: &str| m.iter().any(|m| m == t) || explicit.contains(&t[2..]);
    let from_file = mapped.iter().any(|m| m == "--checkpoint-iteration-file");
    if from_file && !given(&mapped, "--max-no-progress") {
        mapped.extend(["--max-no-progress".to_string(), "2".to_string()]);
    }
    // And any growth of the checkpointed iteration is progress (NVRx's min_progress_iterations
    // as vigil documents it); vigil's own default (10) is for steps, where a step or two is jitter.
    if from_file && !given(&mapped, "--min-progress-steps") {
        mapped.extend(["--min-progress-steps".to_string(), "1".to_string()]);
    }
    mapped
}

/// vigil's flags before the script with each `--flag value` of a value-taking flag joined into
/// `--flag=value`, so that clap takes a value such as `-inf` or `-1` as the value [`translate`]
/// found it to be, and says what is wrong with it, instead of reading it as an unknown flag.
pub fn join_values(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let norm = a.strip_prefix("--").map(|n| n.replace('_', "-"));
        match (norm, args.get(i + 1)) {
            (Some(n), Some(v)) if takes_value(&n) => {
                out.push(format!("{a}={v}"));
                i += 2;
            }
            _ => {
                out.push(a.clone());
                i += 1;
            }
        }
    }
    out
}

/// Recognise an ft_launcher flag by its normalised name (dashes, no leading `--`); `Ok(None)` for
/// anything else (vigil's and torchrun's flags).
fn classify(norm: &str, flag: &str) -> Result<Option<FtFlag>, FtError> {
    let rest = if let Some(r) = norm.strip_prefix("ft-param-") {
        r
    } else if let Some(r) = norm.strip_prefix("ft-") {
        r
    } else {
        match norm {
            "fault-tol-cfg-path" => return Ok(Some(FtFlag::CfgPath)),
            "ignore-missing-fault-tol-cfg" => return Ok(Some(FtFlag::IgnoreMissing)),
            "restart-policy" => return Ok(opt_index("restart_policy").map(FtFlag::Opt)),
            _ => return Ok(None),
        }
    };
    match rest {
        "cfg-path" => return Ok(Some(FtFlag::CfgPath)),
        "ignore-missing-cfg" | "ignore-missing-fault-tol-cfg" => {
            return Ok(Some(FtFlag::IgnoreMissing))
        }
        _ => {}
    }
    let field = FLAG_ALIASES
        .iter()
        .find(|(alias, _)| *alias == rest)
        .map(|(_, f)| f.to_string())
        .unwrap_or_else(|| rest.replace('-', "_"));
    match opt_index(&field) {
        Some(idx) => Ok(Some(FtFlag::Opt(idx))),
        None => Err(FtError::UnknownFlag {
            flag: flag.to_string(),
            suggestion: closest(norm),
        }),
    }
}

fn opt_index(field: &str) -> Option<usize> {
    OPTS.iter().position(|o| o.field == field)
}

/// The known ft flag nearest to `norm` by edit distance.
fn closest(norm: &str) -> String {
    let mut known: Vec<String> = OPTS
        .iter()
        .map(|o| format!("ft-{}", o.field.replace('_', "-")))
        .collect();
    known.push("ft-cfg-path".into());
    known.push("ft-ignore-missing-cfg".into());
    known.push("ignore-missing-fault-tol-cfg".into());
    let target = norm
        .strip_prefix("ft-param-")
        .map_or_else(|| norm.to_string(), |r| format!("ft-{r}"));
    let best = known
        .into_iter()
        .min_by_key(|k| edit_distance(&target, k))
        .unwrap_or_default();
    format!("--{best}")
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The value of the flag at `args[i]`: inline after `=`, else the next argument. Returns it and
/// how many arguments were used.
fn take_value(
    args: &[String],
    i: usize,
    inline: Option<&str>,
    flag: &str,
) -> Result<(String, usize), FtError> {
    match inline {
        Some(v) => Ok((v.to_string(), 1)),
        None => match args.get(i + 1) {
            // Like argparse: a following option is not a value, a negative number is.
            Some(v) if !v.starts_with('-') || v.parse::<f64>().is_ok() => Ok((v.clone(), 2)),
            _ => Err(FtError::MissingValue {
                flag: flag.to_string(),
            }),
        },
    }
}

fn bad(origin: &str, value: &str, kind: Kind) -> FtError {
    FtError::BadValue {
        origin: origin.to_string(),
        value: value.to_string(),
        expected: expected(kind),
    }
}

fn expected(kind: Kind) -> String {
    match kind {
        Kind::Timeout => "seconds (a number >= 0), or null/none to disable".into(),
        Kind::Float => "a number, or null/none".into(),
        Kind::Positive => "a number > 0".into(),
        Kind::Int => "an integer".into(),
        Kind::Count => "an integer >= 0".into(),
        Kind::CountOrOff => "an integer (0 or less: off)".into(),
        Kind::Bool => "true or false".into(),
        Kind::Str => "a string".into(),
        Kind::Signal => "a signal name or number (SIGKILL, SIGTERM, signal.SIGKILL, 9)".into(),
        Kind::LogLevel => "DEBUG, INFO, WARNING, ERROR, CRITICAL or a level 10-50".into(),
        Kind::Sections => {
            "NAME:SECONDS,... such as setup:600,step:180 (`=` works too; null/none disables one)"
                .into()
        }
        Kind::Choice(choices) => format!("one of {}", choices.join(", ")),
    }
}

fn is_null(s: &str) -> bool {
    matches!(s.trim().to_ascii_lowercase().as_str(), "" | "none" | "null")
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Seconds: `None` inside for disabled (null or infinite), `Err` for nonsense.
fn parse_seconds(s: &str) -> Option<Option<f64>> {
    if is_null(s) {
        return Some(None);
    }
    let f: f64 = s.trim().parse().ok()?;
    if f.is_nan() || f < 0.0 {
        return None;
    }
    Some(f.is_finite().then_some(f))
}

/// Parse a command-line (or YAML scalar) value of the given kind.
fn parse_str(kind: Kind, s: &str) -> Option<Val> {
    let t = s.trim();
    match kind {
        Kind::Timeout => parse_seconds(t).map(|o| o.map_or(Val::None, Val::F)),
        Kind::Float => {
            if is_null(t) {
                return Some(Val::None);
            }
            t.parse::<f64>().ok().filter(|f| !f.is_nan()).map(Val::F)
        }
        Kind::Positive => {
            if is_null(t) {
                return Some(Val::None);
            }
            t.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite() && *f > 0.0)
                .map(Val::F)
        }
        Kind::Int => {
            if is_null(t) {
                return Some(Val::None);
            }
            t.parse::<i64>().ok().map(Val::I)
        }
        Kind::Count => {
            if is_null(t) {
                return Some(Val::None);
            }
            t.parse::<u32>().ok().map(|n| Val::I(i64::from(n)))
        }
        Kind::CountOrOff => {
            if is_null(t) {
                return Some(Val::None);
            }
            t.parse::<i64>()
                .ok()
                .map(|n| Val::I(n.clamp(0, i64::from(u32::MAX))))
        }
        Kind::Bool => parse_bool(t).map(Val::B),
        Kind::Str => Some(if is_null(t) {
            Val::None
        } else {
            Val::S(t.to_string())
        }),
        Kind::Signal => parse_signal(t).map(Val::S),
        Kind::LogLevel => parse_log_level(t).map(Val::I),
        Kind::Sections => parse_sections(t).map(Val::Sections),
        Kind::Choice(choices) => choices
            .iter()
            .find(|c| c.eq_ignore_ascii_case(t))
            .map(|c| Val::S(c.to_string())),
    }
}

const SIGNALS: &[&str] = &[
    "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "IOT", "BUS", "FPE", "KILL", "USR1", "SEGV",
    "USR2", "PIPE", "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU",
    "URG", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO", "POLL", "PWR", "SYS",
];

/// `SIGKILL`, `sigkill`, `KILL`, `signal.SIGKILL`, `Signals.SIGKILL` -> `SIGKILL`; `9` -> `9`.
fn parse_signal(s: &str) -> Option<String> {
    let s = s
        .strip_prefix("signal.")
        .or_else(|| s.strip_prefix("Signals."))
        .or_else(|| s.strip_prefix("signal.Signals."))
        .unwrap_or(s);
    if let Ok(n) = s.parse::<u32>() {
        return (1..=64).contains(&n).then(|| n.to_string());
    }
    let upper = s.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNALS.contains(&bare).then(|| format!("SIG{bare}"))
}

fn parse_log_level(s: &str) -> Option<i64> {
    if let Ok(n) = s.parse::<i64>() {
        return (10..=50).contains(&n).then_some(n);
    }
    match s.to_ascii_uppercase().as_str() {
        "DEBUG" | "DBG" => Some(10),
        "INFO" => Some(20),
        "WARNING" | "WARN" => Some(30),
        "ERROR" => Some(40),
        "CRITICAL" | "FATAL" => Some(50),
        _ => None,
    }
}

/// `setup:600,step:180,checkpointing:null`, also with `=`, spaces, quotes or `{...}` around.
fn parse_sections(s: &str) -> Option<Vec<(String, Option<f64>)>> {
    let s = s.trim();
    let s = s
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .unwrap_or(s);
    let mut out: Vec<(String, Option<f64>)> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let cut = part.find([':', '='])?;
        let name = part[..cut].trim().trim_matches(|c| c == '"' || c == '\'');
        let value = part[cut + 1..]
            .trim()
            .trim_matches(|c| c == '"' || c == '\'');
        let secs = parse_seconds(value)?;
        push_section(&mut out, name, secs)?;
    }
    Some(out)
}

/// Add one section timeout; a later one for the same name replaces the earlier.
fn push_section(out: &mut Vec<(String, Option<f64>)>, name: &str, secs: Option<f64>) -> Option<()> {
    if name.is_empty() || name.contains([',', '=', ':']) || name.chars().any(char::is_whitespace) {
        return None;
    }
    out.retain(|(n, _)| n != name);
    out.push((name.to_string(), secs));
    Some(())
}

/// The value for a mapped vigil flag; `None` to leave the flag out (disabled).
fn render(val: &Val) -> Option<String> {
    match val {
        Val::None => None,
        Val::F(f) => Some(f.to_string()),
        Val::I(n) => Some(n.to_string()),
        Val::B(b) => Some(b.to_string()),
        Val::S(s) => Some(s.clone()),
        Val::Sections(list) => {
            let set: Vec<String> = list
                .iter()
                .filter_map(|(n, s)| s.map(|s| format!("{n}={s}")))
                .collect();
            (!set.is_empty()).then(|| set.join(","))
        }
    }
}

fn is_default(val: &Val, default: Dflt) -> bool {
    match (val, default) {
        (Val::None, Dflt::Null) => true,
        (Val::F(f), Dflt::F(d)) => *f == d,
        (Val::I(n), Dflt::I(d)) => *n == d,
        (Val::F(f), Dflt::I(d)) => *f == d as f64,
        (Val::I(n), Dflt::F(d)) => *n as f64 == d,
        (Val::B(b), Dflt::B(d)) => *b == d,
        (Val::S(s), Dflt::S(d)) => s == d,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::table::NO_NODE_CHECK;
    use super::*;

    #[test]
    fn values_are_joined_to_their_flags() {
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            join_values(&v(&[
                "--max-restarts",
                "-1",
                "--standalone",
                "--term_timeout",
                "-inf",
                "-m",
                "--role=x"
            ])),
            v(&[
                "--max-restarts=-1",
                "--standalone",
                "--term_timeout=-inf",
                "-m",
                "--role=x"
            ])
        );
        // A value flag at the very end has no value to join (clap says it needs one).
        assert_eq!(join_values(&v(&["--role"])), v(&["--role"]));
    }
    use proptest::prelude::*;

    fn sv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    fn no_file(p: &Path) -> std::io::Result<String> {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} not found", p.display()),
        ))
    }

    fn tr(args: &[&str]) -> Translated {
        translate(&sv(args), &no_file).unwrap()
    }

    fn tr_err(args: &[&str]) -> FtError {
        translate(&sv(args), &no_file).unwrap_err()
    }

    fn with_yaml(yaml: &'static str) -> impl Fn(&Path) -> std::io::Result<String> {
        move |p: &Path| {
            assert_eq!(p, Path::new("ft.yaml"));
            Ok(yaml.to_string())
        }
    }

    #[test]
    fn every_spelling_of_the_heartbeat_timeout() {
        for args in [
            vec!["--ft-rank_heartbeat_timeout", "300", "t.py"],
            vec!["--ft-rank-heartbeat-timeout=300", "t.py"],
            vec!["--ft-rank-heartbeat-timeout", "300", "t.py"],
            vec!["--ft_rank_heartbeat_timeout", "300", "t.py"],
            vec!["--ft_rank_heartbeat_timeout=300", "t.py"],
            vec!["--ft-param-rank_heartbeat_timeout=300", "t.py"],
            vec!["--ft-param-rank_heartbeat_timeout", "300.0", "t.py"],
        ] {
            let t = tr(&args);
            assert_eq!(
                t.args,
                sv(&["--heartbeat-timeout", "300", "t.py"]),
                "{args:?}"
            );
            assert!(t.notes.is_empty());
        }
    }

    #[test]
    fn every_spelling_of_the_initial_timeout() {
        for flag in [
            "--ft-initial_rank_heartbeat_timeout",
            "--ft-initial-rank-heartbeat-timeout",
            "--ft_initial_rank_heartbeat_timeout",
            "--ft-param-initial_rank_heartbeat_timeout",
        ] {
            let t = tr(&[flag, "1800", "t.py"]);
            assert_eq!(t.args, sv(&["--initial-heartbeat-timeout", "1800", "t.py"]));
        }
    }

    #[test]
    fn section_timeouts_in_every_form() {
        for v in [
            "setup:600,step:180,checkpointing:420",
            "setup=600,step=180,checkpointing=420",
            "setup: 600, step: 180, checkpointing: 420",
            "{'setup': 600, 'step': 180, 'checkpointing': 420}",
            "setup:600,step:180,checkpointing:420,",
        ] {
            for flag in ["--ft-rank-section-timeouts", "--ft-rank_section_timeouts"] {
                let t = tr(&[flag, v, "t.py"]);
                assert_eq!(
                    t.args,
                    sv(&[
                        "--section-timeouts",
                        "setup=600,step=180,checkpointing=420",
                        "t.py"
                    ]),
                    "{flag} {v}"
                );
            }
        }
        // A null section is dropped; all null drops the flag.
        let t = tr(&["--ft-rank-section-timeouts=setup:null,step:60", "t.py"]);
        assert_eq!(t.args, sv(&["--section-timeouts", "step=60", "t.py"]));
        let t = tr(&["--ft-rank-section-timeouts", "setup:none", "t.py"]);
        assert_eq!(t.args, sv(&["t.py"]));
        // vigil's warmup key passes through.
        let t = tr(&["--ft-rank-section-timeouts", "warmup:900,step:60", "t.py"]);
        assert_eq!(
            t.args,
            sv(&["--section-timeouts", "warmup=900,step=60", "t.py"])
        );
    }

    #[test]
    fn other_mapped_flags() {
        let t = tr(&[
            "--ft-rank-out-of-section-timeout",
            "120",
            "--ft-safety_factor=3.5",
            "--ft-rank-termination-signal",
            "signal.SIGKILL",
            "t.py",
        ]);
        assert_eq!(
            t.args,
            sv(&[
                "--out-of-section-timeout",
                "120",
                "--safety-factor",
                "3.5",
                "--rank-termination-signal",
                "SIGKILL",
                "t.py"
            ])
        );
        for (given, want) in [
            ("SIGKILL", "SIGKILL"),
            ("sigterm", "SIGTERM"),
            ("KILL", "SIGKILL"),
            ("9", "9"),
            ("Signals.SIGINT", "SIGINT"),
        ] {
            let t = tr(&["--ft-rank_termination_signal", given, "t.py"]);
            assert_eq!(t.args[1], want);
        }
    }

    #[test]
    fn null_timeouts_drop_the_flag() {
        for v in ["null", "None", "none", ""] {
            let t = tr(&["--ft-rank-heartbeat-timeout", v, "t.py"]);
            assert_eq!(t.args, sv(&["t.py"]), "{v:?}");
        }
    }

    #[test]
    fn flags_without_effect_become_notes() {
        let t = tr(&[
            "--ft-workload-check-interval",
            "5",
            "--ft-log-level=DEBUG",
            "--ft-log_level",
            "INFO",
            "--ft-pci-topo-file",
            "/etc/topo.xml",
            "--ft-link-down-path-template",
            "/sys/x",
            "--ft-restart-policy",
            "min-healthy",
            "--ft-node-health-check-endpoint",
            "/var/run/nvhcd.sock",
            "--nproc-per-node",
            "2",
            "t.py",
        ]);
        assert_eq!(t.args, sv(&["--nproc-per-node", "2", "t.py"]));
        let joined = t.notes.join("\n");
        assert_eq!(t.notes.len(), 6, "{joined}");
        assert!(t.notes[0].starts_with("--ft-workload-check-interval 5: accepted, no effect"));
        assert!(joined.contains("deadline-driven"));
        // The last --ft-log-level wins, as with argparse.
        assert!(joined.contains("--ft-log_level INFO: accepted"));
        assert!(!joined.contains("DEBUG"));
        assert!(joined.contains("--ft-pci-topo-file /etc/topo.xml: accepted"));
        // A boolean flag alone means true; a boolean after it is its value.
        let t = tr(&["--ft-enable-nic-healthcheck", "t.py"]);
        assert_eq!(t.args, sv(&["--health-check=true", "t.py"]));
        let t = tr(&["--ft-enable-nic-monitor", "false", "t.py"]);
        assert_eq!(t.args, sv(&["--health-check=false", "t.py"]));
        assert!(joined.contains("min-healthy"));
        assert!(t.notes.iter().all(|n| !n.contains('\n')));
    }

    #[test]
    fn the_checkpoint_file_brings_nvrx_tracker_default_unless_a_count_is_given() {
        let t = tr(&["--ft-checkpoint-iteration-file", "it.txt", "t.py"]);
        assert_eq!(
            t.args,
            sv(&[
                "--checkpoint-iteration-file",
                "it.txt",
                "--max-no-progress",
                "2",
                "--min-progress-steps",
                "1",
                "t.py"
            ])
        );
        let t = tr(&[
            "--ft-checkpoint-iteration-file",
            "it.txt",
            "--ft-max-no-progress-cycles",
            "5",
            "t.py",
        ]);
        assert_eq!(
            t.args.iter().filter(|a| *a == "--max-no-progress").count(),
            1
        );
        assert!(t.args.contains(&"5".to_string()));
        let t = tr(&[
            "--max-no-progress",
            "4",
            "--ft-checkpoint-iteration-file",
            "x",
            "t.py",
        ]);
        assert!(!t.args.contains(&"2".to_string()), "{:?}", t.args);
        // vigil's own flag keeps vigil's default.
        let t = tr(&["--checkpoint-iteration-file", "x", "t.py"]);
        assert_eq!(t.args, sv(&["--checkpoint-iteration-file", "x", "t.py"]));
    }

    #[test]
    fn every_known_flag_is_accepted() {
        for opt in OPTS {
            let flag = format!("--ft-{}", opt.field.replace('_', "-"));
            let value = match opt.kind {
                Kind::Timeout | Kind::Float | Kind::Positive => "7",
                Kind::Int | Kind::Count | Kind::CountOrOff => "3",
                Kind::Bool => "false",
                Kind::Str => "/x",
                Kind::Signal => "SIGTERM",
                Kind::LogLevel => "WARNING",
                Kind::Sections => "step:9",
                Kind::Choice(c) => c[0],
            };
            let t = translate(&sv(&[&flag, value, "t.py"]), &no_file)
                .unwrap_or_else(|e| panic!("{flag}: {e}"));
            let want = match opt.effect {
                Effect::Map(_) if matches!(opt.kind, Kind::Bool) => (2, 0),
                // With NVRx's default count (2) and any growth as progress for its tracker.
                Effect::Map("--checkpoint-iteration-file") => (7, 0),
                Effect::Map(_) => (3, 0),
                Effect::Note(_) => (1, 1),
            };
            assert_eq!((t.args.len(), t.notes.len()), want, "{flag}: {t:?}");
            assert_eq!(t.args.last().unwrap(), "t.py");
        }
        // Spellings that are not field names.
        let t = tr(&[
            "--ft-storage-health-check-path",
            "/a,/b",
            "--restart_policy",
            "any-failed",
            "t.py",
        ]);
        assert_eq!(t.args, sv(&["--health-storage-path", "/a,/b", "t.py"]));
        assert_eq!(t.notes.len(), 1);
        let t = tr(&[
            "--ft-ignore-missing-cfg",
            "--ignore-missing-fault-tol-cfg",
            "t.py",
        ]);
        assert_eq!(t.args, sv(&["t.py"]));
    }

    #[test]
    fn nemo_run_line() {
        let line = "--ft-rank_heartbeat_timeout 300 --ft-initial_rank_heartbeat_timeout 1800 --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29500 --nnodes 2 --nproc-per-node 8 --node-rank 0 train.py --cfg x";
        let args: Vec<&str> = line.split(' ').collect();
        let t = tr(&args);
        assert_eq!(
            t.args,
            sv(&[
                "--max-restarts",
                "3",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "10.0.0.1:29500",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "8",
                "--node-rank",
                "0",
                "--initial-heartbeat-timeout",
                "1800",
                "--heartbeat-timeout",
                "300",
                "train.py",
                "--cfg",
                "x"
            ])
        );
        assert!(t.notes.is_empty());
        // vigil's own parser takes the result.
        use clap::Parser;
        let mut full = vec!["vigil".to_string(), "run".to_string()];
        full.extend(t.args);
        let cli = crate::cli::Cli::try_parse_from(full).unwrap();
        let crate::cli::Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.heartbeat_timeout, Some(300.0));
        assert_eq!(run.initial_heartbeat_timeout, Some(1800.0));
        assert_eq!(run.max_restarts, 3);
        assert_eq!(run.training_script, "train.py");
        assert_eq!(run.training_script_args, sv(&["--cfg", "x"]));
    }

    #[test]
    fn nemo_launcher_line_with_cfg_file() {
        // NeMo-Launcher: --fault-tol-cfg-path=$FAULT_TOL_CFG_PATH --ignore-missing-fault-tol-cfg
        let args = sv(&[
            "--fault-tol-cfg-path=/nope.yaml",
            "--ignore-missing-fault-tol-cfg",
            "--rdzv_id=42",
            "--rdzv_backend=c10d",
            "--nnodes=1",
            "--nproc_per_node=2",
            "--max-restarts=1",
            "t.py",
        ]);
        let t = translate(&args, &no_file).unwrap();
        assert_eq!(t.args, args[2..].to_vec());
        assert_eq!(t.notes.len(), 1);
        assert!(t.notes[0].contains("/nope.yaml"), "{:?}", t.notes);
    }

    #[test]
    fn script_args_pass_through_untouched() {
        let t = tr(&[
            "--ft-rank-heartbeat-timeout",
            "60",
            "-m",
            "pkg.train",
            "--ft-rank_heartbeat_timeout",
            "5",
            "--ft-bogus",
            "--ft-cfg-path",
            "missing.yaml",
            "--heartbeat-timeout",
            "1",
        ]);
        assert_eq!(
            t.args,
            sv(&[
                "-m",
                "--heartbeat-timeout",
                "60",
                "pkg.train",
                "--ft-rank_heartbeat_timeout",
                "5",
                "--ft-bogus",
                "--ft-cfg-path",
                "missing.yaml",
                "--heartbeat-timeout",
                "1"
            ])
        );
        // After `--` everything is the script's, and mapped flags go before the `--`.
        let t = tr(&["--ft-safety-factor", "2", "--", "t.py", "--ft-x"]);
        assert_eq!(
            t.args,
            sv(&["--safety-factor", "2", "--", "t.py", "--ft-x"])
        );
    }

    #[test]
    fn values_of_vigil_flags_are_not_the_script() {
        let t = tr(&[
            "-r",
            "3",
            "--log-dir",
            "/logs",
            "--standalone",
            "-t3",
            "--role=trainer",
            "--ft-rank-heartbeat-timeout",
            "9",
            "t.py",
        ]);
        assert_eq!(
            t.args,
            sv(&[
                "-r",
                "3",
                "--log-dir",
                "/logs",
                "--standalone",
                "-t3",
                "--role=trainer",
                "--heartbeat-timeout",
                "9",
                "t.py"
            ])
        );
    }

    #[test]
    fn explicit_vigil_flags_win() {
        let t = tr(&[
            "--ft-rank-heartbeat-timeout",
            "300",
            "--heartbeat_timeout",
            "60",
            "--ft-safety-factor=2",
            "--safety-factor=4",
            "t.py",
        ]);
        assert_eq!(
            t.args,
            sv(&["--heartbeat_timeout", "60", "--safety-factor=4", "t.py"])
        );
        assert_eq!(t.notes.len(), 2);
        assert!(t.notes[0].contains("--heartbeat-timeout given explicitly wins"));
    }

    const YAML: &str = "\
fault_tolerance:
  initial_rank_heartbeat_timeout: 600
  rank_heartbeat_timeout: 300
  rank_section_timeouts:
    setup: 600
    step: 180
    checkpointing: null
  rank_out_of_section_timeout: null
  safety_factor: 5.0
  rank_termination_signal: SIGTERM
  workload_check_interval: 5.0
  log_level: 20
  node_health_check_interval: 10.0
  restart_policy: any-failed
  some_future_key: 1
";

    #[test]
    fn yaml_config_is_mapped() {
        let t = translate(&sv(&["--ft-cfg-path", "ft.yaml", "t.py"]), &with_yaml(YAML)).unwrap();
        assert_eq!(
            t.args,
            sv(&[
                "--initial-heartbeat-timeout",
                "600",
                "--heartbeat-timeout",
                "300",
                "--section-timeouts",
                "setup=600,step=180",
                "--safety-factor",
                "5",
                "--rank-termination-signal",
                "SIGTERM",
                "t.py"
            ])
        );
        // Defaults restated in the file print nothing; real changes and unknown keys do.
        assert_eq!(t.notes.len(), 2, "{:?}", t.notes);
        assert!(t.notes[0].starts_with("fault_tolerance.some_future_key in ft.yaml: not"));
        assert_eq!(
            t.notes[1],
            format!("fault_tolerance.node_health_check_interval: 10.0 in ft.yaml: accepted, no effect: {NO_NODE_CHECK}")
        );
    }

    #[test]
    fn command_line_overrides_yaml_and_vigil_overrides_both() {
        let t = translate(
            &sv(&[
                "--ft-cfg_path=ft.yaml",
                "--ft-rank-heartbeat-timeout",
                "100",
                "--ft-initial-rank-heartbeat-timeout=null",
                "--ft-rank-section-timeouts",
                "step:30",
                "--safety-factor",
                "2",
                "t.py",
            ]),
            &with_yaml(YAML),
        )
        .unwrap();
        assert_eq!(
            t.args,
            sv(&[
                "--safety-factor",
                "2",
                "--heartbeat-timeout",
                "100",
                "--section-timeouts",
                "step=30",
                "--rank-termination-signal",
                "SIGTERM",
                "t.py"
            ])
        );
    }

    #[test]
    fn nested_section_and_deprecated_path_flag() {
        let yaml =
            "trainer:\n  plugins:\n    - fault_tolerance:\n        rank_heartbeat_timeout: 42\n";
        let t = translate(
            &sv(&["--fault-tol-cfg-path", "ft.yaml", "t.py"]),
            &with_yaml(yaml),
        )
        .unwrap();
        assert_eq!(t.args, sv(&["--heartbeat-timeout", "42", "t.py"]));
    }

    #[test]
    fn missing_config() {
        let e = tr_err(&["--ft-cfg-path", "/no/such.yaml", "t.py"]);
        let msg = e.to_string();
        assert!(msg.contains("/no/such.yaml") && msg.contains("--ignore-missing-fault-tol-cfg"));
        assert!(msg.contains("--ft-cfg-path"));
        assert!(!msg.contains('\n'));
        // The ignore flag may come before or after the path.
        for args in [
            vec![
                "--ignore-missing-fault-tol-cfg",
                "--ft-cfg-path",
                "/no/such.yaml",
                "t.py",
            ],
            vec![
                "--ft-cfg-path",
                "/no/such.yaml",
                "--ft-ignore-missing-cfg",
                "t.py",
            ],
        ] {
            let t = tr(&args);
            assert_eq!(t.args, sv(&["t.py"]));
            assert_eq!(t.notes.len(), 1);
        }
        // A file without the section.
        let read = with_yaml("trainer:\n  max_steps: 10\n");
        let e = translate(&sv(&["--ft-cfg-path", "ft.yaml", "t.py"]), &read).unwrap_err();
        assert_eq!(
            e,
            FtError::CfgNoSection {
                path: "ft.yaml".into()
            }
        );
        let t = translate(
            &sv(&[
                "--ft-cfg-path",
                "ft.yaml",
                "--ignore-missing-fault-tol-cfg",
                "t.py",
            ]),
            &read,
        )
        .unwrap();
        assert_eq!(t.args, sv(&["t.py"]));
        // Broken YAML is an error even with the ignore flag.
        let read = with_yaml("fault_tolerance: [unclosed\n");
        let e = translate(
            &sv(&[
                "--ft-cfg-path",
                "ft.yaml",
                "--ignore-missing-fault-tol-cfg",
                "t.py",
            ]),
            &read,
        )
        .unwrap_err();
        assert!(matches!(e, FtError::CfgInvalid { .. }), "{e}");
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn bad_values_name_flag_and_value() {
        let e = tr_err(&["--ft-safety-factor", "abc", "t.py"]);
        assert_eq!(
            e.to_string(),
            "bad value `abc` for --ft-safety-factor: expected a number > 0"
        );
        for args in [
            vec!["--ft-rank-heartbeat-timeout=-5", "t.py"],
            vec!["--ft-rank-heartbeat-timeout", "soon", "t.py"],
            vec!["--ft-rank-termination-signal", "SIGBOGUS", "t.py"],
            vec!["--ft-rank-section-timeouts", "step", "t.py"],
            vec!["--ft-rank-section-timeouts", "step:abc", "t.py"],
            vec!["--ft-log-level", "LOUD", "t.py"],
            vec!["--ft-restart-policy", "sometimes", "t.py"],
            vec!["--ft-workload-check-interval", "x", "t.py"],
            vec!["--ft-segment", "1.5", "t.py"],
        ] {
            let e = tr_err(&args);
            assert!(matches!(e, FtError::BadValue { .. }), "{args:?}: {e}");
            let bad_value = args[0].split_once('=').map_or(args[1], |(_, v)| v);
            assert!(e.to_string().contains(bad_value), "{e}");
        }
        let read = with_yaml("fault_tolerance:\n  safety_factor: abc\n");
        let e = translate(&sv(&["--ft-cfg-path", "ft.yaml", "t.py"]), &read).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad value `abc` for fault_tolerance.safety_factor in ft.yaml: expected a number > 0"
        );
    }

    #[test]
    fn unknown_flag_suggests_the_closest() {
        let e = tr_err(&["--ft-rank-heartbeat-timout", "5", "t.py"]);
        assert_eq!(
            e,
            FtError::UnknownFlag {
                flag: "--ft-rank-heartbeat-timout".into(),
                suggestion: "--ft-rank-heartbeat-timeout".into()
            }
        );
        let e = tr_err(&["--ft_initial_heartbeat_timeout=5", "t.py"]);
        assert!(e
            .to_string()
            .contains("did you mean `--ft-initial-rank-heartbeat-timeout`?"));
        let e = tr_err(&["--ft-param-safety_factr", "5", "t.py"]);
        assert!(e.to_string().contains("`--ft-safety-factor`"), "{e}");
    }

    #[test]
    fn missing_value() {
        let e = tr_err(&["--ft-rank-heartbeat-timeout"]);
        assert_eq!(
            e.to_string(),
            "`--ft-rank-heartbeat-timeout` needs a value: give `--ft-rank-heartbeat-timeout VALUE` or `--ft-rank-heartbeat-timeout=VALUE`"
        );
    }

    #[test]
    fn a_following_flag_is_not_a_value() {
        let e = tr_err(&["--ft-cfg-path", "--nnodes", "2", "t.py"]);
        assert!(matches!(e, FtError::MissingValue { .. }), "{e}");
        // A negative number is a value (and a bad one here).
        let e = tr_err(&["--ft-rank-heartbeat-timeout", "-1", "t.py"]);
        assert!(matches!(e, FtError::BadValue { .. }), "{e}");
    }

    #[test]
    fn no_script_still_translates() {
        let t = tr(&["--ft-rank-heartbeat-timeout", "5", "--help"]);
        assert_eq!(t.args, sv(&["--help", "--heartbeat-timeout", "5"]));
    }

    #[test]
    fn value_flags_come_from_clap_with_aliases_that_differ_only_in_underscores() {
        use clap::CommandFactory;
        let cmd = crate::cli::Cli::command();
        let run = cmd.find_subcommand("run").expect("run subcommand");
        for arg in run.get_arguments() {
            if let Some(long) = arg.get_long() {
                for alias in arg.get_all_aliases().unwrap_or_default() {
                    assert_eq!(alias.replace('_', "-"), long.replace('_', "-"));
                }
            }
            if let (Some(short), true) = (arg.get_short(), arg.get_action().takes_values()) {
                let long = arg.get_long().map(|l| l.replace('_', "-"));
                assert_eq!(
                    value_short(short),
                    long.as_deref(),
                    "-{short} takes a value"
                );
            }
        }
        assert!(takes_value("max-restarts") && takes_value("nproc-per-node"));
        assert!(!takes_value("standalone") && !takes_value("no-python"));
        assert_eq!(
            (value_short('r'), value_short('t')),
            (Some("redirects"), Some("tee"))
        );
        assert_eq!(value_short('m'), None);
    }

    #[test]
    fn an_unambiguous_prefix_is_the_flag_and_an_ambiguous_one_is_refused() {
        let t = tr(&["--max-restart", "2", "--nproc", "4", "t.py"]);
        assert_eq!(
            t.args[..t.script_at],
            sv(&["--max-restarts", "2", "--nproc-per-node", "4"])
        );
        let t = tr(&["--max_restart=2", "t.py"]);
        assert_eq!(t.args[..t.script_at], sv(&["--max-restarts=2"]));
        let e = tr_err(&["--master", "x", "t.py"]).to_string();
        assert!(e.contains("--master-addr, --master-port"), "{e}");
        // Unknown flags are left for clap to name.
        let t = tr(&["--bogus", "t.py"]);
        assert_eq!(t.args[..t.script_at], sv(&["--bogus"]));
    }

    fn ft_flag() -> impl Strategy<Value = Vec<String>> {
        prop_oneof![
            (1u32..5000).prop_map(|n| vec!["--ft-rank_heartbeat_timeout".into(), n.to_string()]),
            (1u32..5000).prop_map(|n| vec![format!("--ft-initial-rank-heartbeat-timeout={n}")]),
            (1u32..99).prop_map(|n| vec!["--ft-safety-factor".into(), format!("{n}.5")]),
            Just(vec!["--ft-log-level".to_string(), "DEBUG".to_string()]),
            Just(vec![
                "--ft-rank-section-timeouts=step:60,setup:600".to_string()
            ]),
            Just(vec!["--max-restarts".to_string(), "3".to_string()]),
            Just(vec!["--standalone".to_string()]),
        ]
    }

    proptest! {
        #[test]
        fn tail_is_untouched_and_translation_is_idempotent(
            flags in prop::collection::vec(ft_flag(), 0..6),
            tail in prop::collection::vec("[-a-z_=0-9.:]{0,12}", 0..6),
        ) {
            let mut args: Vec<String> = flags.into_iter().flatten().collect();
            args.push("train.py".into());
            args.extend(tail.iter().cloned());
            let t = translate(&args, &no_file).unwrap();
            let at = t.args.iter().position(|a| a == "train.py").unwrap();
            prop_assert_eq!(&t.args[at + 1..], &tail[..]);
            prop_assert!(t.args[..at].iter().all(|a| !a.starts_with("--ft")));
            let again = translate(&t.args, &no_file).unwrap();
            prop_assert_eq!(again.args, t.args);
            prop_assert!(again.notes.is_empty());
        }
    }
}

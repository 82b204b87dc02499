//! The value of one `vigil run` flag at a time, checked: rank counts against the machine,
//! `--redirects`/`--tee`, `--local-ranks-filter`, `--signals-to-handle`, the output filters and
//! `--rdzv-conf`. Pure: the machine's facts come in a [`Host`].

use crate::values::{err, parse_signal, ConfigError};

use super::Host;

pub fn parse_nproc(s: &str, host: &Host) -> Result<u32, ConfigError> {
    match s {
        "cpu" => Ok(host.cpus.max(1)),
        "gpu" => match (host.gpus)() {
            Ok(n) if n > 0 => Ok(n),
            Ok(_) => err("--nproc-per-node gpu: this node has no NVIDIA GPU; give a number or `cpu`"),
            Err(why) => err(format!(
                "--nproc-per-node gpu: cannot count GPUs ({why}); give a number or `cpu`"
            )),
        },
        "auto" => Ok(match (host.gpus)() {
            Ok(n) if n > 0 => n,
            _ => host.cpus.max(1),
        }),
        n => match n.parse::<u32>() {
            Ok(0) => err("--nproc-per-node 0: a node needs at least one rank; give 1 or more"),
            Ok(n) => Ok(n),
            Err(_) => err(format!(
                "--nproc-per-node {n:?} is not valid: give a positive integer, `cpu`, `gpu` or `auto`"
            )),
        },
    }
}

/// Ranks a node may run per CPU (or per GPU, where it has more GPUs than CPUs): oversubscribing
/// CPUs for tests is common, a thousand ranks on a laptop is a typo.
pub const RANKS_PER_CPU: u32 = 16;
/// File descriptors the agent holds per rank (two pipes, two log files, the rank's socket, spare).
pub const FDS_PER_RANK: u64 = 8;
/// File descriptors the agent keeps for itself (store, event log, listeners, watchdog).
pub const FDS_RESERVED: u64 = 64;

/// Refuses a rank count the node cannot run, before any rank starts: more than
/// [`RANKS_PER_CPU`] per CPU or GPU, or more than the open-file limit lets the agent watch.
pub fn check_nproc(nproc: u32, host: &Host) -> Result<(), ConfigError> {
    let cpu_cap = host.cpus.max(1).saturating_mul(RANKS_PER_CPU);
    if nproc > cpu_cap {
        let gpus = (host.gpus)().unwrap_or(0);
        let cap = host.cpus.max(gpus).max(1).saturating_mul(RANKS_PER_CPU);
        if nproc > cap {
            return err(format!(
                "--nproc-per-node {nproc}: more ranks than this node can run ({} CPUs, {gpus} GPUs; vigil allows {RANKS_PER_CPU} ranks per CPU or GPU); give at most {cap}",
                host.cpus
            ));
        }
    }
    let fd_cap = host.nofile.saturating_sub(FDS_RESERVED) / FDS_PER_RANK;
    if u64::from(nproc) > fd_cap {
        return err(format!(
            "--nproc-per-node {nproc}: the open-file limit ({}) lets vigil watch at most {fd_cap} ranks ({FDS_PER_RANK} descriptors each); raise it with `ulimit -n` or give fewer ranks",
            host.nofile
        ));
    }
    Ok(())
}

/// torchrun's `--redirects`/`--tee` value: `0..3` for every rank, or `local_rank:value,...`.
/// Returns, per local rank, (stdout, stderr) selected.
pub fn parse_std_spec(flag: &str, s: &str, nproc: u32) -> Result<Vec<(bool, bool)>, ConfigError> {
    let value = |v: &str| -> Result<(bool, bool), ConfigError> {
        match v.trim() {
            "0" => Ok((false, false)),
            "1" => Ok((true, false)),
            "2" => Ok((false, true)),
            "3" => Ok((true, true)),
            _ => err(format!(
                "{flag} {s:?}: each value must be 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"
            )),
        }
    };
    let s = s.trim();
    if !s.contains(':') {
        return Ok(vec![
            value(if s.is_empty() { "0" } else { s })?;
            nproc as usize
        ]);
    }
    let mut out = vec![(false, false); nproc as usize];
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((lr, v)) = part.split_once(':') else {
            return err(format!(
                "{flag} {s:?}: expected local_rank:value pairs such as 0:3,1:2"
            ));
        };
        let lr: usize = lr
            .trim()
            .parse()
            .map_err(|_| ConfigError(format!("{flag} {s:?}: {lr:?} is not a local rank")))?;
        if lr >= out.len() {
            return err(format!(
                "{flag} {s:?}: local rank {lr} does not exist (this node runs {nproc})"
            ));
        }
        out[lr] = value(v)?;
    }
    Ok(out)
}

pub fn parse_ranks_filter(s: &str, nproc: u32) -> Result<Option<Vec<u32>>, ConfigError> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p.parse::<u32>() {
            Ok(r) if r < nproc => out.push(r),
            Ok(r) => {
                return err(format!(
                    "--local-ranks-filter {s:?}: local rank {r} does not exist (this node runs {nproc})"
                ))
            }
            Err(_) => {
                return err(format!(
                    "--local-ranks-filter {s:?}: {p:?} is not a local rank; give a list such as 0,2"
                ))
            }
        }
    }
    Ok(Some(out))
}

/// `--signals-to-handle SIGTERM,SIGINT`: signal numbers, in order, without repeats. The agent
/// cannot catch SIGKILL or SIGSTOP, needs SIGCHLD itself, and lets the synchronous fault signals
/// (SIGSEGV, SIGBUS, SIGILL, SIGFPE) kill it, as its own faults.
pub fn parse_signal_list(s: &str) -> Result<Vec<i32>, ConfigError> {
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let n = parse_signal("--signals-to-handle", name)?;
        if [
            libc::SIGKILL,
            libc::SIGSTOP,
            libc::SIGCHLD,
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
        ]
        .contains(&n)
        {
            return err(format!(
                "--signals-to-handle {s:?}: vigil cannot handle {name}; list signals such as SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
            ));
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

/// torchrun's `--duplicate-std*-filters` list: comma-separated, `,,` stands for a comma. Empty
/// items are dropped (torchrun would match every line with one), so `""` copies nothing.
pub fn parse_filters(s: &str) -> Vec<String> {
    const HOLD: &str = "\u{0}";
    s.replace(",,", HOLD)
        .split(',')
        .map(|p| p.replace(HOLD, ","))
        .filter(|p| !p.is_empty())
        .collect()
}

/// `--rdzv-conf key=value,...`: the keys vigil uses (`join_timeout`); others are accepted and
/// ignored, as torchrun's backends ignore keys they do not know.
pub fn parse_rdzv_conf(s: &str) -> Result<Vec<(String, String)>, ConfigError> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| {
                    ConfigError(format!(
                        "--rdzv-conf {s:?}: {p:?} is not key=value; give e.g. join_timeout=900"
                    ))
                })
        })
        .collect()
}

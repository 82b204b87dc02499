//! Turning `vigil run`'s flags into a checked launch plan, and the environment each rank gets.
//! Everything here is pure: the facts it needs from the machine (CPU and GPU counts, environment
//! variables) are passed in.

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::RunArgs;
use crate::job::state::{Identity, TimeoutsPlace};
use crate::supervise::monitor::{parse_section_timeouts, Timeouts};
use crate::values::{err, parse_signal, seconds, ConfigError, MAX_SECONDS};

/// Which of a rank's streams reach the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Console {
    pub stdout: bool,
    pub stderr: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LaunchConfig {
    pub nproc: u32,
    /// Every agent of the job, standbys included.
    pub nnodes: u32,
    /// The nodes that run ranks; `nnodes - active` standbys (hot spares).
    pub active_nodes: u32,
    /// `--segment`: node ids in blocks of this many are close (hot spares without topology).
    pub segment: Option<u32>,
    pub node_rank: u32,
    pub role: String,
    /// `TORCHELASTIC_RUN_ID`: the job identity, else (one node, as torchrun) a fresh uuid, else
    /// `none` (several nodes without an id, as torchrun's static rendezvous).
    pub run_id: String,
    /// The job's identity (`--rdzv-id`, Slurm, NGC): only a job with one loads saved state.
    pub job_id: Option<String>,
    /// What the ranks run, as saved state records it: the script's absolute path, `-m module`,
    /// or the command.
    pub program: String,
    /// Node rank 0's host name or address, where vigil's store runs.
    pub master_addr: String,
    /// The store's port; `None`: a free one (single node without --master-port).
    pub master_port: Option<u16>,
    /// `master_addr` is a Slurm node name: resolve it through Slurm if DNS does not know it.
    pub master_is_slurm_node: bool,
    /// How long the nodes wait for each other at a rendezvous.
    pub join_timeout: Duration,
    /// How long a silent peer agent has before it counts as lost.
    pub node_timeout: Duration,
    pub max_restarts: u32,
    pub workers_stop_timeout: Duration,
    /// Grace between a forwarded signal and SIGKILL (torchrun's --shutdown-timeout).
    pub term_timeout: Duration,
    /// Signals the agent catches and forwards to the ranks (torchrun's --signals-to-handle).
    pub signals: Vec<i32>,
    /// The flag as given; ranks see it as TORCHELASTIC_SIGNALS_TO_HANDLE, as under torchrun.
    pub signals_to_handle: String,
    /// `--log-line-prefix-template`; `None`: torchrun's default `[${role_name}${local_rank}]:`.
    pub prefix_template: Option<String>,
    /// Lines containing any of these are copied to `attempt_<n>/filtered_std{out,err}.log`.
    pub dup_stdout: Vec<String>,
    pub dup_stderr: Vec<String>,
    /// Every rank gets LOCAL_RANK=0 and only its own GPU.
    pub virtual_local_rank: bool,
    /// The wait before each restart (`--restart-backoff*`).
    pub backoff: crate::supervise::Backoff,
    /// Program and arguments of every rank.
    pub command: Vec<String>,
    /// What the failure summary calls the job (`train.py FAILED`).
    pub entrypoint_name: String,
    pub log_dir: Option<PathBuf>,
    pub event_log: Option<PathBuf>,
    /// Per local rank.
    pub console: Vec<Console>,
    pub timeouts: Timeouts,
    pub warmup_steps: u32,
    pub safety_factor: f64,
    pub termination_signal: i32,
    pub stack_wait: Duration,
    /// Where calculated timeouts are loaded from and saved to.
    pub timeouts_file: TimeoutsPlace,
    /// What happens across allocations: when this one ends, the stop lead, the requeue limits.
    pub allocation: AllocationPlan,
    /// Straggler scoring and what to do about stragglers (docs/stragglers.md).
    pub straggler: StragglerPlan,
    /// NVML, health checks, GPU memory reclaim, NUMA binding (perf/).
    pub gpu: crate::perf::GpuConfig,
}

/// `vigil run`'s straggler settings.
#[derive(Debug, Clone, PartialEq)]
pub struct StragglerPlan {
    /// Between two job-wide reports (node rank 0).
    pub interval: Duration,
    /// Below this relative or individual score a rank is a straggler.
    pub threshold: f64,
    /// Stop at an agreed step and requeue without the straggler's node.
    pub stop: bool,
    /// The section whose durations are a rank's step times when it sends no step timings.
    pub section: String,
}

/// When the allocation ends, as the flags or Slurm say.
#[derive(Debug, Clone, PartialEq)]
pub enum EndSpec {
    /// Nothing says: no stop ahead of an end.
    Unknown,
    /// `--end-time`, or Slurm's `SLURM_JOB_END_TIME`.
    At(std::time::SystemTime),
    /// `--time-limit`: this long after the agent started.
    After(Duration),
}

/// `vigil run`'s across-allocations settings (docs/allocations.md).
#[derive(Debug, Clone, PartialEq)]
pub struct AllocationPlan {
    pub end: EndSpec,
    /// `--end-time` or `--time-limit` said it (fixed), rather than Slurm (re-read as it moves).
    pub end_from_flags: bool,
    /// Under Slurm, the job whose end time is re-read (`squeue`) and which is requeued.
    pub slurm_job_id: Option<String>,
    /// The floor of the stop lead (`--stop-lead`).
    pub stop_lead: Duration,
    pub limits: crate::allocation::policy::Limits,
    /// Where the ledger lives: `--state-dir`, else the job's state dir, else (no job identity)
    /// `None`: the run directory.
    pub state_dir: Option<PathBuf>,
    /// Whose state it is (`None`: a job without an identity).
    pub identity: Option<Identity>,
}

/// What the machine says, for resolving `--nproc-per-node cpu|gpu|auto` and the interpreter.
pub struct Host<'a> {
    pub cpus: u32,
    /// The agent's open-file limit (soft RLIMIT_NOFILE), which bounds the ranks it can watch.
    pub nofile: u64,
    /// GPU count, or why it is unknown.
    pub gpus: &'a dyn Fn() -> Result<u32, String>,
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The wall clock now: an `--end-time` already past is refused.
    pub now: std::time::SystemTime,
    /// The agent's working directory (`None`: unknown, removed).
    pub cwd: Option<PathBuf>,
}

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

/// A rank's console prefix from torchrun's `--log-line-prefix-template`, substituted like
/// Python's `string.Template.safe_substitute`: `$name` and `${name}` for `role_name`, `rank`,
/// `local_rank` and `hostname`; `$$` is `$`; anything else stays as written.
pub fn render_prefix(
    template: Option<&str>,
    role: &str,
    rank: u32,
    local_rank: u32,
    hostname: &str,
) -> String {
    let Some(t) = template else {
        return format!("[{role}{local_rank}]:");
    };
    let value = |name: &str| -> Option<String> {
        match name {
            "role_name" => Some(role.to_string()),
            "rank" => Some(rank.to_string()),
            "local_rank" => Some(local_rank.to_string()),
            "hostname" => Some(hostname.to_string()),
            _ => None,
        }
    };
    let is_start = |c: char| c.is_ascii_alphabetic() || c == '_';
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::new();
    let mut rest = t;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(braced) = after.strip_prefix('{') {
            let name_len = braced.find('}').filter(|&n| {
                n > 0 && braced[..n].starts_with(is_start) && braced[..n].chars().all(is_ident)
            });
            match name_len.and_then(|n| value(&braced[..n]).map(|v| (n, v))) {
                Some((n, v)) => {
                    out.push_str(&v);
                    rest = &braced[n + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            let n = if after.starts_with(is_start) {
                after.find(|c: char| !is_ident(c)).unwrap_or(after.len())
            } else {
                0
            };
            match (n > 0).then(|| value(&after[..n])).flatten() {
                Some(v) => {
                    out.push_str(&v);
                    rest = &after[n..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        }
    }
    out.push_str(rest);
    out
}

/// torchrun's `--virtual-local-rank`: the GPU a local rank may see, from the agent's
/// HIP_VISIBLE_DEVICES (if set and not empty) or CUDA_VISIBLE_DEVICES, else the local rank itself.
/// Returns the variable to follow and the device, or why this rank has no GPU.
pub fn virtual_device(
    local_rank: u32,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let (var, list) = match env("HIP_VISIBLE_DEVICES").filter(|v| !v.is_empty()) {
        Some(v) => ("HIP_VISIBLE_DEVICES", Some(v)),
        None => ("CUDA_VISIBLE_DEVICES", env("CUDA_VISIBLE_DEVICES")),
    };
    match list {
        None => Ok(local_rank.to_string()),
        Some(l) => {
            let devices: Vec<&str> = l.split(',').collect();
            devices
                .get(local_rank as usize)
                .map(|d| d.trim().to_string())
                .ok_or_else(|| {
                    ConfigError(format!(
                        "--virtual-local-rank: local rank {local_rank} has no GPU in {var}={l}; give --nproc-per-node {} or list more devices",
                        devices.len()
                    ))
                })
        }
    }
}

/// The grace after a forwarded signal: --term-timeout, else --shutdown-timeout, else
/// TORCH_ELASTIC_SHUTDOWN_TIMEOUT (as torchrun), else 30 s.
fn term_timeout(
    a: &RunArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Duration, ConfigError> {
    if let (Some(t), Some(s)) = (a.term_timeout, a.shutdown_timeout) {
        if t != s {
            return err(format!(
                "--term-timeout {t} and --shutdown-timeout {s} name the same grace period; give one of them"
            ));
        }
    }
    let v = match a.term_timeout.or(a.shutdown_timeout) {
        Some(v) => v,
        None => match env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
            Some(e) => seconds(&e).map_err(|fix| {
                ConfigError(format!(
                    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT={e:?} is not valid: {fix}"
                ))
            })?,
            None => 30.0,
        },
    };
    secs("--shutdown-timeout", v)
}

fn secs(flag: &str, v: f64) -> Result<Duration, ConfigError> {
    if v.is_finite() && (0.0..=MAX_SECONDS).contains(&v) {
        Ok(Duration::from_secs_f64(v))
    } else {
        err(format!(
            "{flag} {v}: give a number of seconds from 0 to {MAX_SECONDS:.0} (a year)"
        ))
    }
}

/// The program and arguments each rank runs, as torchrun builds them.
pub fn rank_command(a: &RunArgs, python: &str) -> Result<Vec<String>, ConfigError> {
    let mut cmd: Vec<String> = match (a.module, a.no_python, a.run_path) {
        (true, true, _) => {
            return err("-m and --no-python cannot be used together: -m runs a module with Python")
        }
        (_, true, true) => {
            return err("--run-path and --no-python cannot be used together: --run-path runs a Python file")
        }
        (true, _, true) => return err("-m and --run-path cannot be used together"),
        (true, false, false) => vec![python.into(), "-u".into(), "-m".into(), a.training_script.clone()],
        (false, true, false) => vec![a.training_script.clone()],
        (false, false, true) => vec![
            python.into(),
            "-u".into(),
            "-c".into(),
            // sys.path[0] as under torchrun, whose ranks run this from its own script in the
            // interpreter's bin directory.
            "import os, runpy, sys; sys.argv = sys.argv[1:]; sys.path[0] = os.path.dirname(sys.executable); runpy.run_path(sys.argv[0], run_name='__main__')".into(),
            a.training_script.clone(),
        ],
        (false, false, false) => vec![python.into(), "-u".into(), a.training_script.clone()],
    };
    cmd.extend(a.training_script_args.iter().cloned());
    Ok(cmd)
}

/// torchrun's rule for `TORCHELASTIC_RUN_ID` when no id is given: a fresh uuid for
/// `--standalone`, and for one node with the default static rendezvous and neither an endpoint
/// nor a master port (torchrun then runs a standalone rendezvous); `--rdzv-id`'s default `none`
/// in every other case.
fn torchrun_draws_run_id(a: &RunArgs, nnodes: u32) -> bool {
    a.standalone
        || (a.rdzv_backend == "static"
            && a.rdzv_endpoint.trim().is_empty()
            && a.master_port.is_none()
            && nnodes == 1)
}

/// A fresh uuid for `TORCHELASTIC_RUN_ID`, as torchrun gives a one-node job without an id.
fn fresh_run_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            format!("{:x}-{:x}", t.as_nanos(), std::process::id())
        })
}

/// The program a job runs, as saved state records it (so another script's state is not used).
fn program_identity(a: &RunArgs) -> String {
    if a.module {
        format!("-m {}", a.training_script)
    } else {
        std::fs::canonicalize(&a.training_script)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| a.training_script.clone())
    }
}

fn opt_secs(flag: &str, v: Option<f64>) -> Result<Option<Duration>, ConfigError> {
    match v {
        None => Ok(None),
        Some(x) if x.is_finite() && x > 0.0 && x <= MAX_SECONDS => {
            Ok(Some(Duration::from_secs_f64(x)))
        }
        Some(x) => err(format!(
            "{flag} {x}: give a positive number of seconds up to {MAX_SECONDS:.0} (a year), or leave it out to disable the check"
        )),
    }
}

pub fn resolve_timeouts(a: &RunArgs) -> Result<Timeouts, ConfigError> {
    let (sections, warmup) = match &a.section_timeouts {
        Some(s) => parse_section_timeouts(s).map_err(ConfigError)?,
        None => Default::default(),
    };
    Ok(Timeouts {
        initial: opt_secs("--initial-heartbeat-timeout", a.initial_heartbeat_timeout)?,
        heartbeat: opt_secs("--heartbeat-timeout", a.heartbeat_timeout)?,
        sections,
        out_of_section: opt_secs("--out-of-section-timeout", a.out_of_section_timeout)?,
        warmup,
    })
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

fn join_timeout(a: &RunArgs) -> Result<Duration, ConfigError> {
    let from_conf = parse_rdzv_conf(&a.rdzv_conf)?
        .into_iter()
        .find(|(k, _)| k == "join_timeout")
        .map(|(_, v)| {
            seconds(&v).map_err(|fix| ConfigError(format!("--rdzv-conf join_timeout={v:?}: {fix}")))
        })
        .transpose()?;
    let v = a.join_timeout.or(from_conf).unwrap_or(600.0);
    opt_secs("--join-timeout", Some(v)).map(|d| d.unwrap_or_default())
}

pub fn resolve(a: &RunArgs, host: &Host) -> Result<LaunchConfig, ConfigError> {
    let nodes = crate::job::nodes::discover(
        &crate::job::nodes::NodeFlags {
            nnodes: a.nnodes.as_deref(),
            node_rank: a.node_rank,
            master_addr: a.master_addr.as_deref(),
            master_port: a.master_port,
            rdzv_endpoint: &a.rdzv_endpoint,
            rdzv_id: &a.rdzv_id,
            standalone: a.standalone,
        },
        host.env,
    )?;
    match a.rdzv_backend.as_str() {
        "static" | "c10d" => {}
        other => {
            return err(format!(
                "--rdzv-backend {other:?} is not supported: use `static` or `c10d`"
            ))
        }
    }
    if a.training_script.trim().is_empty() {
        return err("no training script given: vigil run [flags] script.py [args]");
    }
    if a.role.is_empty() {
        return err("--role must not be empty");
    }
    let nproc = parse_nproc(&a.nproc_per_node, host)?;
    check_nproc(nproc, host)?;
    if a.virtual_local_rank {
        virtual_device(nproc - 1, host.env)?;
    }
    let redirects = parse_std_spec("--redirects", &a.redirects, nproc)?;
    let tee = parse_std_spec("--tee", &a.tee, nproc)?;
    let filter = parse_ranks_filter(&a.local_ranks_filter, nproc)?;
    let console = (0..nproc as usize)
        .map(|lr| {
            let shown = filter.as_ref().is_none_or(|f| f.contains(&(lr as u32)));
            Console {
                stdout: shown && (tee[lr].0 || !redirects[lr].0),
                stderr: shown && (tee[lr].1 || !redirects[lr].1),
            }
        })
        .collect();
    let python = (host.env)("PYTHON_EXEC").unwrap_or_else(|| "python3".into());
    let command = rank_command(a, &python)?;
    let entrypoint_name = std::path::Path::new(&a.training_script)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| a.training_script.clone());
    let active_nodes = match a.spare_nodes {
        0 => nodes.active,
        n if nodes.active != nodes.nnodes => {
            return err(format!(
                "--spare-nodes {n} and --nnodes {} both say how many nodes wait as standbys: give one of them",
                a.nnodes.as_deref().unwrap_or("")
            ))
        }
        n if n >= nodes.nnodes => {
            return err(format!(
                "--spare-nodes {n} leaves no node to run ranks in a {}-node job: give at most {}",
                nodes.nnodes,
                nodes.nnodes - 1
            ))
        }
        n => nodes.nnodes - n,
    };
    let identity = Identity::resolve(nodes.job_id.as_deref(), host.env);
    let slurm_job_id = (host.env)("SLURM_JOB_ID").filter(|s| !s.trim().is_empty());
    let state_dir = a.state_dir.clone().or_else(|| {
        let base = state_base(a, slurm_job_id.is_some(), host);
        identity
            .as_ref()
            .map(|i| crate::job::state::job_state_dir(&base, &i.key()))
    });
    let stop_lead = secs("--stop-lead", a.stop_lead)?;
    let end = end_spec(a, host)?;
    check_flag_end(a, &end, stop_lead, host.now)?;
    Ok(LaunchConfig {
        nproc,
        nnodes: nodes.nnodes,
        active_nodes,
        segment: a.segment.filter(|k| *k > 0),
        node_rank: nodes.node_rank,
        role: a.role.clone(),
        run_id: match &nodes.job_id {
            Some(id) => id.clone(),
            None if torchrun_draws_run_id(a, nodes.nnodes) => fresh_run_id(),
            None => "none".into(),
        },
        job_id: nodes.job_id.clone(),
        program: program_identity(a),
        master_addr: nodes.head_host,
        master_port: nodes.port,
        master_is_slurm_node: nodes.slurm_head,
        join_timeout: join_timeout(a)?,
        node_timeout: opt_secs("--node-timeout", Some(a.node_timeout))?.unwrap_or_default(),
        max_restarts: a.max_restarts,
        workers_stop_timeout: secs("--workers-stop-timeout", a.workers_stop_timeout)?,
        term_timeout: term_timeout(a, host.env)?,
        signals: parse_signal_list(&a.signals_to_handle)?,
        signals_to_handle: a.signals_to_handle.clone(),
        // As torchrun: the flag (or PET_*), else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE.
        prefix_template: Some(a.log_line_prefix_template.clone())
            .filter(|t| !t.is_empty())
            .or_else(|| (host.env)("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
            .filter(|t| !t.is_empty()),
        dup_stdout: parse_filters(&a.duplicate_stdout_filters),
        dup_stderr: parse_filters(&a.duplicate_stderr_filters),
        virtual_local_rank: a.virtual_local_rank,
        backoff: crate::supervise::Backoff {
            base: secs("--restart-backoff", a.restart_backoff)?,
            cap: secs("--restart-backoff-max", a.restart_backoff_max)?,
            reset_after: secs("--restart-backoff-reset", a.restart_backoff_reset)?,
        },
        command,
        entrypoint_name,
        log_dir: a.log_dir.clone(),
        event_log: a.event_log.clone(),
        console,
        timeouts: resolve_timeouts(a)?,
        warmup_steps: a.warmup_steps,
        safety_factor: if a.safety_factor.is_finite() && a.safety_factor >= 1.0 {
            a.safety_factor
        } else {
            return err(format!(
                "--safety-factor {}: give a number >= 1.0",
                a.safety_factor
            ));
        },
        termination_signal: parse_signal("--rank-termination-signal", &a.rank_termination_signal)?,
        stack_wait: secs("--stack-dump-timeout", a.stack_dump_timeout)?,
        timeouts_file: TimeoutsPlace::resolve(
            a.timeouts_file.as_deref(),
            state_dir.as_deref().filter(|_| identity.is_some()),
        ),
        gpu: gpu_config(a).map_err(ConfigError)?,
        allocation: AllocationPlan {
            end,
            end_from_flags: a.end_time.is_some() || a.time_limit.is_some(),
            slurm_job_id,
            stop_lead,
            limits: crate::allocation::policy::Limits {
                max_requeues: a.max_requeues,
                max_no_progress: a.max_no_progress,
                min_progress_steps: u64::from(a.min_progress_steps),
                no_restart_exit_code: a.no_restart_exit_code,
            },
            state_dir,
            identity,
        },
        straggler: StragglerPlan {
            interval: match secs("--straggler-report-interval", a.straggler_report_interval)? {
                d if d.is_zero() => return err(
                    "--straggler-report-interval 0: give the seconds between reports, such as 300",
                ),
                d => d,
            },
            threshold: a.straggler_threshold,
            stop: a.stop_if_straggler,
            section: a.straggler_section.clone(),
        },
    })
}

/// Where a job's state directory is made when `--state-dir` is not given: `--log-dir`; else,
/// under Slurm, the job's working directory (`--chdir`, else the submit directory: where Slurm
/// writes the job's output; node rank 0 of the next allocation may be on another host, whose
/// `$TMPDIR` is not this one's), else its submit directory; else `$TMPDIR`.
fn state_base(a: &RunArgs, slurm: bool, host: &Host) -> PathBuf {
    let var = |k: &str| (host.env)(k).filter(|v| !v.trim().is_empty());
    let slurm_dir = || {
        host.cwd
            .clone()
            .or_else(|| var("SLURM_SUBMIT_DIR").map(PathBuf::from))
    };
    a.log_dir
        .clone()
        .or_else(|| slurm.then(slurm_dir).flatten())
        .unwrap_or_else(|| PathBuf::from(var("TMPDIR").unwrap_or_else(|| "/tmp".into())))
}

/// An end given by flags that leaves no time before the stop lead is refused
/// ([`crate::allocation::endtime::check_flag_end`]).
fn check_flag_end(
    a: &RunArgs,
    end: &EndSpec,
    lead: Duration,
    now: std::time::SystemTime,
) -> Result<(), ConfigError> {
    use crate::allocation::endtime::{check_flag_end, FlagEnd};
    let flag = match (end, &a.end_time, &a.time_limit) {
        (EndSpec::At(t), Some(v), _) => FlagEnd::At(*t, v),
        (EndSpec::After(d), _, Some(v)) => FlagEnd::After(*d, v),
        _ => return Ok(()),
    };
    check_flag_end(&flag, lead, now).map_err(|e| ConfigError(e.to_string()))
}

/// When the allocation ends: `--end-time`, `--time-limit`, else Slurm's `SLURM_JOB_END_TIME`
/// (Slurm >= 23.02; older ones are asked with `squeue` at start, by the runtime).
fn end_spec(a: &RunArgs, host: &Host) -> Result<EndSpec, ConfigError> {
    use crate::allocation::endtime;
    match (&a.end_time, &a.time_limit) {
        (Some(_), Some(_)) => {
            err("--end-time and --time-limit both say when the allocation ends: give one of them")
        }
        (Some(t), None) => endtime::parse_end_time(t)
            .map(EndSpec::At)
            .map_err(|e| ConfigError(e.to_string())),
        (None, Some(d)) => endtime::parse_time_limit(d)
            .map(EndSpec::After)
            .map_err(|e| ConfigError(e.to_string())),
        (None, None) => Ok(endtime::parse_slurm_end_env(
            (host.env)("SLURM_JOB_END_TIME").as_deref(),
        )
        .map_or(EndSpec::Unknown, EndSpec::At)),
    }
}

/// Everything a rank's environment depends on besides the launch plan.
pub struct RankSlot<'a> {
    pub local_rank: u32,
    /// This node's group rank in the attempt (its node rank, unless a standby took a lost node's
    /// place).
    pub group_rank: u32,
    pub restart_count: u32,
    /// Global rank of this node's local rank 0, and the job's rank count, from the rendezvous.
    pub rank_offset: u32,
    pub world_size: u32,
    /// vigil's store, as the ranks reach it.
    pub master_addr: &'a str,
    pub master_port: u16,
    pub error_file: &'a str,
}

/// The variables vigil sets for one rank, exactly as torchrun names them. The agent's own
/// environment is inherited underneath; `env` reads it for the defaults that depend on it.
pub fn worker_env(
    cfg: &LaunchConfig,
    slot: &RankSlot,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    let world = slot.world_size;
    let rank = slot.rank_offset + slot.local_rank;
    let mut v: Vec<(&str, String)> = vec![
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", slot.local_rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_WORLD_SIZE", cfg.nproc.to_string()),
        ("GROUP_RANK", slot.group_rank.to_string()),
        ("GROUP_WORLD_SIZE", cfg.active_nodes.to_string()),
        ("ROLE_RANK", rank.to_string()),
        ("ROLE_NAME", cfg.role.clone()),
        ("ROLE_WORLD_SIZE", world.to_string()),
        ("MASTER_ADDR", slot.master_addr.to_string()),
        ("MASTER_PORT", slot.master_port.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", slot.restart_count.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", cfg.max_restarts.to_string()),
        ("TORCHELASTIC_RUN_ID", cfg.run_id.clone()),
        // MASTER_ADDR:MASTER_PORT is vigil's store on node rank 0: ranks connect to it as
        // clients (torch then prefixes their keys with /worker/attempt_<n>).
        ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
        (
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            env("TORCH_NCCL_ASYNC_ERROR_HANDLING").unwrap_or_else(|| "1".into()),
        ),
        ("TORCHELASTIC_ERROR_FILE", slot.error_file.into()),
        (
            "TORCHELASTIC_SIGNALS_TO_HANDLE",
            cfg.signals_to_handle.clone(),
        ),
        // What the shim's StragglerDetectionCallback compares its own arguments with.
        (
            "VIGIL_STRAGGLER_INTERVAL",
            cfg.straggler.interval.as_secs_f64().to_string(),
        ),
        (
            "VIGIL_STRAGGLER_THRESHOLD",
            cfg.straggler.threshold.to_string(),
        ),
        (
            "VIGIL_STOP_IF_STRAGGLER",
            u8::from(cfg.straggler.stop).to_string(),
        ),
    ];
    if cfg.nproc > 1 && env("OMP_NUM_THREADS").is_none() {
        v.push(("OMP_NUM_THREADS", "1".into()));
    }
    if cfg.virtual_local_rank {
        // As torchrun: the rank sees only its own GPU, as device 0. `resolve` checked that the
        // agent's device list covers every local rank.
        if let Some(lr) = v.iter_mut().find(|(k, _)| *k == "LOCAL_RANK") {
            lr.1 = "0".into();
        }
        if let Ok(dev) = virtual_device(slot.local_rank, env) {
            if env("HIP_VISIBLE_DEVICES").is_some_and(|h| !h.is_empty()) {
                v.push(("HIP_VISIBLE_DEVICES", dev.clone()));
            }
            v.push(("CUDA_VISIBLE_DEVICES", dev));
        }
    }
    v.into_iter().map(|(k, val)| (k.to_string(), val)).collect()
}

/// The GPU side of `vigil run` (perf/): NVML library, health check, memory reclaim, NUMA binding.
fn gpu_config(a: &RunArgs) -> Result<crate::perf::GpuConfig, String> {
    use crate::perf::{gpu, numa};
    Ok(crate::perf::GpuConfig {
        nvml_lib: gpu::nvml_lib(a.nvml_lib.as_deref()),
        health_check: a.health_check,
        health_storage: a.health_storage_path.clone(),
        reclaim_timeout: Duration::from_secs_f64(a.gpu_memory_reclaim_timeout),
        reclaim_tolerance_mib: a.gpu_memory_tolerance_mb as u64,
        // A poll every few milliseconds would only burn the CPU the ranks are about to need.
        reclaim_poll: Duration::from_secs_f64(a.gpu_memory_poll_interval.max(0.05)),
        numa: a
            .numa_binding
            .as_deref()
            .map(numa::Mode::parse)
            .transpose()?,
        numa_strict: a.numa_bind_strict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(a: &[&str]) -> RunArgs {
        let mut full = vec!["vigil", "run"];
        full.extend_from_slice(a);
        match crate::cli::Cli::try_parse_from(full).unwrap().command {
            crate::cli::Command::Run(r) => *r,
            _ => unreachable!(),
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn host_with(gpus: &dyn Fn() -> Result<u32, String>) -> Host<'_> {
        Host {
            cpus: 6,
            nofile: 1024,
            gpus,
            env: &no_env,
            now: std::time::SystemTime::now(),
            cwd: None,
        }
    }

    proptest::proptest! {
        #[test]
        fn a_template_without_dollars_is_the_prefix(t in "[^$]{0,40}", rank in 0u32..10_000) {
            proptest::prop_assert_eq!(render_prefix(Some(&t), "r", rank, rank % 8, "h"), t);
        }

        #[test]
        fn rendering_never_panics_and_keeps_text_around_placeholders(
            a in "[^$]{0,10}", b in "[^$]{0,10}", junk in "[$a-z{}_]{0,12}", rank in 0u32..100,
        ) {
            let t = format!("{a}${{rank}}{b}{junk}");
            let out = render_prefix(Some(&t), "role", rank, 0, "host");
            let want_start = format!("{a}{rank}{b}");
            proptest::prop_assert!(out.starts_with(&want_start), "{} -> {}", t, out);
        }

        #[test]
        fn filters_round_trip_through_torchruns_comma_escape(
            items in proptest::collection::vec("[a-z ,=]{1,8}", 0..5),
        ) {
            // Items that start or end with a comma are ambiguous in torchrun's format too.
            let items: Vec<String> = items
                .into_iter()
                .filter(|i| !i.starts_with(',') && !i.ends_with(','))
                .collect();
            let joined = items.iter().map(|i| i.replace(',', ",,")).collect::<Vec<_>>().join(",");
            proptest::prop_assert_eq!(parse_filters(&joined), items);
        }
    }

    #[test]
    fn signal_lists_like_torchrun() {
        assert_eq!(
            parse_signal_list("SIGTERM,SIGINT,SIGHUP,SIGQUIT").unwrap(),
            vec![libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT]
        );
        assert_eq!(
            parse_signal_list(" SIGUSR1 , usr2,SIGUSR1,15").unwrap(),
            vec![libc::SIGUSR1, libc::SIGUSR2, libc::SIGTERM]
        );
        assert_eq!(parse_signal_list("").unwrap(), Vec::<i32>::new());
        for bad in [
            "SIGKILL",
            "SIGTERM,SIGSTOP",
            "SIGCHLD",
            "SIGSEGV",
            "SIGNOPE",
            "SIGTERM;SIGINT",
        ] {
            let e = parse_signal_list(bad).unwrap_err().0;
            assert!(e.contains("--signals-to-handle"), "{e}");
        }
    }

    #[test]
    fn duplicate_filters_like_torchrun() {
        assert_eq!(parse_filters("apple,orange"), vec!["apple", "orange"]);
        assert_eq!(parse_filters("a,,b,c"), vec!["a,b", "c"]);
        assert_eq!(parse_filters(""), Vec::<String>::new());
    }

    #[test]
    fn prefix_templates_like_string_template_safe_substitute() {
        let r = |t: Option<&str>| render_prefix(t, "trainer", 13, 3, "node7");
        assert_eq!(r(None), "[trainer3]:");
        assert_eq!(r(Some("${hostname}:${rank}: ")), "node7:13: ");
        assert_eq!(r(Some("[$role_name-$local_rank/$rank]")), "[trainer-3/13]");
        // `$$` is a dollar; unknown or malformed placeholders stay as written.
        assert_eq!(
            r(Some("$$${rank} ${nope} $nope ${ $ ${rank")),
            "$13 ${nope} $nope ${ $ ${rank"
        );
        assert_eq!(r(Some("${rank}x${local_rank}日本")), "13x3日本");
    }

    #[test]
    fn virtual_local_rank_picks_the_ranks_own_device() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(virtual_device(2, &no_env).unwrap(), "2");
        let cuda = env(&[("CUDA_VISIBLE_DEVICES", "4, 6")]);
        assert_eq!(virtual_device(1, &cuda).unwrap(), "6");
        let e = virtual_device(2, &cuda).unwrap_err().0;
        assert!(e.contains("CUDA_VISIBLE_DEVICES=4, 6"), "{e}");
        let hip = env(&[
            ("HIP_VISIBLE_DEVICES", "7,8"),
            ("CUDA_VISIBLE_DEVICES", "0"),
        ]);
        assert_eq!(virtual_device(1, &hip).unwrap(), "8");
        let c = resolve(
            &args(&["--nproc-per-node", "2", "--virtual-local-rank", "t.py"]),
            &host_with(&|| Ok(0)),
        )
        .unwrap();
        let slot = RankSlot {
            local_rank: 1,
            group_rank: 0,
            restart_count: 0,
            rank_offset: 0,
            world_size: 2,
            master_addr: "h",
            master_port: 1,
            error_file: "e",
        };
        let v: std::collections::HashMap<_, _> = worker_env(&c, &slot, &hip).into_iter().collect();
        assert_eq!(v["LOCAL_RANK"], "0");
        assert_eq!(v["RANK"], "1");
        assert_eq!(v["HIP_VISIBLE_DEVICES"], "8");
        assert_eq!(v["CUDA_VISIBLE_DEVICES"], "8");
    }

    #[test]
    fn shutdown_timeout_precedence() {
        let none = || Ok(0);
        let grace = |a: &[&str], e: &dyn Fn(&str) -> Option<String>| {
            let h = Host {
                cpus: 6,
                nofile: 1024,
                gpus: &none,
                env: e,
                now: std::time::SystemTime::now(),
                cwd: None,
            };
            let mut full = a.to_vec();
            full.push("t.py");
            resolve(&args(&full), &h).map(|c| c.term_timeout.as_secs_f64())
        };
        let shut = |k: &str| (k == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT").then(|| "7".to_string());
        assert_eq!(grace(&[], &no_env).unwrap(), 30.0);
        assert_eq!(grace(&[], &shut).unwrap(), 7.0);
        assert_eq!(grace(&["--shutdown-timeout", "3"], &shut).unwrap(), 3.0);
        assert_eq!(grace(&["--term-timeout", "4"], &shut).unwrap(), 4.0);
        assert_eq!(
            grace(&["--term-timeout", "4", "--shutdown_timeout", "4"], &no_env).unwrap(),
            4.0
        );
        assert!(grace(&["--term-timeout", "4", "--shutdown-timeout", "5"], &no_env).is_err());
        let bad = |k: &str| (k == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT").then(|| "1e30".to_string());
        assert!(grace(&[], &bad)
            .unwrap_err()
            .0
            .contains("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"));
    }

    #[test]
    fn nproc_ceiling_follows_cpus_gpus_and_the_file_limit() {
        let no_gpu = || Ok(0);
        let eight = || Ok(8);
        let host = |cpus, nofile, gpus| Host {
            cpus,
            nofile,
            gpus,
            env: &no_env,
            now: std::time::SystemTime::now(),
            cwd: None,
        };
        assert!(check_nproc(32, &host(2, 4096, &no_gpu)).is_ok());
        let e = check_nproc(33, &host(2, 4096, &no_gpu)).unwrap_err().0;
        assert!(e.contains("give at most 32"), "{e}");
        // More GPUs than CPUs: the GPU count sets the ceiling.
        assert!(check_nproc(128, &host(1, 4096, &eight)).is_ok());
        assert!(check_nproc(129, &host(1, 4096, &eight)).is_err());
        // (1024 - 64) / 8 = 120 ranks fit the file limit.
        assert!(check_nproc(120, &host(64, 1024, &no_gpu)).is_ok());
        let e = check_nproc(121, &host(64, 1024, &no_gpu)).unwrap_err().0;
        assert!(e.contains("ulimit -n") && e.contains("at most 120"), "{e}");
        assert!(check_nproc(1, &host(1, 0, &no_gpu)).is_err());
    }

    #[test]
    fn nproc_forms() {
        let none = || Ok(0);
        let four = || Ok(4);
        let broken = || Err("libnvidia-ml.so not found".to_string());
        assert_eq!(parse_nproc("3", &host_with(&none)), Ok(3));
        assert_eq!(parse_nproc("cpu", &host_with(&none)), Ok(6));
        assert_eq!(parse_nproc("auto", &host_with(&none)), Ok(6));
        assert_eq!(parse_nproc("auto", &host_with(&four)), Ok(4));
        assert_eq!(parse_nproc("gpu", &host_with(&four)), Ok(4));
        let e = parse_nproc("gpu", &host_with(&broken)).unwrap_err().0;
        assert!(e.contains("libnvidia-ml.so") && e.contains("cpu"), "{e}");
        assert!(parse_nproc("0", &host_with(&none))
            .unwrap_err()
            .0
            .contains("at least one"));
        assert!(parse_nproc("two", &host_with(&none)).is_err());
    }

    #[test]
    fn std_specs() {
        assert_eq!(parse_std_spec("-r", "3", 2).unwrap(), vec![(true, true); 2]);
        assert_eq!(
            parse_std_spec("-r", "0:1,2:2", 3).unwrap(),
            vec![(true, false), (false, false), (false, true)]
        );
        assert!(parse_std_spec("-r", "4", 2).is_err());
        assert!(parse_std_spec("-r", "5:1", 2)
            .unwrap_err()
            .0
            .contains("does not exist"));
    }

    #[test]
    fn console_follows_redirects_tee_and_filter() {
        let none = || Ok(0);
        let c = resolve(
            &args(&[
                "--nproc-per-node",
                "3",
                "-r",
                "0:1,1:3",
                "-t",
                "1:2",
                "--local-ranks-filter",
                "0,1",
                "t.py",
            ]),
            &host_with(&none),
        )
        .unwrap();
        assert_eq!(
            c.console[0],
            Console {
                stdout: false,
                stderr: true
            }
        );
        assert_eq!(
            c.console[1],
            Console {
                stdout: false,
                stderr: true
            }
        );
        assert_eq!(
            c.console[2],
            Console {
                stdout: false,
                stderr: false
            }
        );
    }

    #[test]
    fn commands_like_torchrun() {
        let none = || Ok(0);
        let h = host_with(&none);
        assert_eq!(
            resolve(&args(&["t.py", "a"]), &h).unwrap().command,
            ["python3", "-u", "t.py", "a"]
        );
        assert_eq!(
            resolve(&args(&["-m", "pkg.mod", "a"]), &h).unwrap().command,
            ["python3", "-u", "-m", "pkg.mod", "a"]
        );
        assert_eq!(
            resolve(&args(&["--no-python", "echo", "a"]), &h)
                .unwrap()
                .command,
            ["echo", "a"]
        );
        let env = |k: &str| (k == "PYTHON_EXEC").then(|| "/opt/py".to_string());
        let h2 = Host {
            cpus: 1,
            nofile: 1024,
            gpus: &none,
            env: &env,
            now: std::time::SystemTime::now(),
            cwd: None,
        };
        assert_eq!(
            resolve(&args(&["t.py"]), &h2).unwrap().command[0],
            "/opt/py"
        );
        assert!(resolve(&args(&["-m", "--no-python", "x"]), &h).is_err());
    }

    #[test]
    fn a_slurm_jobs_state_lives_by_its_submit_directory_under_its_cluster() {
        let none = || Ok(0);
        let slurm = |k: &str| {
            [
                ("SLURM_JOB_ID", "1"),
                ("SLURM_NNODES", "1"),
                ("SLURM_JOB_NODELIST", "n1"),
                ("SLURM_CLUSTER_NAME", "alpha"),
                ("SLURM_SUBMIT_DIR", "/home/u/exp"),
                ("TMPDIR", "/tmp/node-local"),
            ]
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
        };
        let h = Host {
            env: &slurm,
            ..host_with(&none)
        };
        let c = resolve(&args(&["t.py"]), &h).unwrap();
        let dir = PathBuf::from("/home/u/exp/vigil-job-alpha-1");
        assert_eq!(c.allocation.state_dir.as_ref(), Some(&dir));
        // The job's working directory (sbatch --chdir) first: its output is there.
        let h = Host {
            env: &slurm,
            cwd: Some("/lustre/run".into()),
            ..host_with(&none)
        };
        let c = resolve(&args(&["t.py"]), &h).unwrap();
        let dir = PathBuf::from("/lustre/run/vigil-job-alpha-1");
        assert_eq!(c.allocation.state_dir.as_ref(), Some(&dir));
        assert_eq!(c.timeouts_file.load, Some(dir.join("timeouts.json")));
        assert!(c.allocation.identity.as_ref().unwrap().first_allocation);
        assert_eq!(c.run_id, "1", "TORCHELASTIC_RUN_ID stays Slurm's id");
        // --log-dir is the job's output: its state goes there; --state-dir holds both.
        let c = resolve(&args(&["--log-dir", "/shared/logs", "t.py"]), &h).unwrap();
        assert_eq!(
            c.allocation.state_dir,
            Some(PathBuf::from("/shared/logs/vigil-job-alpha-1"))
        );
        let c = resolve(&args(&["--state-dir", "/s", "t.py"]), &h).unwrap();
        assert_eq!(c.allocation.state_dir, Some(PathBuf::from("/s")));
        assert_eq!(
            c.timeouts_file.load,
            Some(PathBuf::from("/s/timeouts.json"))
        );
        // Outside Slurm: $TMPDIR, as before; without an identity, no state dir.
        let tmp = |k: &str| (k == "TMPDIR").then(|| "/t".to_string());
        let h = Host {
            env: &tmp,
            ..host_with(&none)
        };
        let c = resolve(&args(&["--rdzv-id", "r", "t.py"]), &h).unwrap();
        assert_eq!(
            c.allocation.state_dir,
            Some(PathBuf::from("/t/vigil-job-r"))
        );
        let c = resolve(&args(&["t.py"]), &h).unwrap();
        assert_eq!((c.allocation.state_dir, c.timeouts_file.load), (None, None));
    }

    #[test]
    fn an_end_that_leaves_no_time_before_the_stop_lead_is_refused() {
        let none = || Ok(0);
        let h = host_with(&none);
        let refused = |a: &[&str]| {
            let mut full = a.to_vec();
            full.push("t.py");
            resolve(&args(&full), &h).unwrap_err().0
        };
        let e = refused(&["--time-limit", "40s"]);
        assert!(
            e.contains("--time-limit 40s is not longer than the stop lead (60s")
                && e.contains("--stop-lead 10"),
            "{e}"
        );
        assert!(refused(&["--time-limit", "20s", "--stop-lead", "20"]).contains("--time-limit 20s"));
        for past in ["1000", "2020-01-01T00:00:00Z"] {
            let e = refused(&["--end-time", past]);
            assert!(e.contains("that time has passed"), "{e}");
        }
        let soon = (h.now + Duration::from_secs(30))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            .to_string();
        assert!(refused(&["--end-time", &soon]).contains("not more than the stop lead"));
        // A lead that leaves less than half is capped at run time, not refused here.
        for ok in [
            &["--time-limit", "61s"][..],
            &["--time-limit", "1m", "--stop-lead", "20"],
            &["--end-time", &soon, "--stop-lead", "10"],
        ] {
            let mut full = ok.to_vec();
            full.push("t.py");
            assert!(resolve(&args(&full), &h).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn monitoring_flags() {
        let none = || Ok(0);
        let c = resolve(
            &args(&[
                "--heartbeat-timeout",
                "2.5",
                "--section-timeouts",
                "step=60,warmup=600",
                "--rank-termination-signal",
                "KILL",
                "--log-dir",
                "/l",
                "--rdzv-id",
                "j/1",
                "t.py",
            ]),
            &host_with(&none),
        )
        .unwrap();
        assert_eq!(c.timeouts.heartbeat, Some(Duration::from_millis(2500)));
        assert_eq!(c.timeouts.sections["step"], Duration::from_secs(60));
        assert_eq!(c.timeouts.warmup, Some(Duration::from_secs(600)));
        assert_eq!(c.termination_signal, libc::SIGKILL);
        assert_eq!(
            c.timeouts_file.load,
            Some(PathBuf::from("/l/vigil-job-j_1/timeouts.json"))
        );
        assert_eq!(c.run_id, "j/1");
        assert_eq!(parse_signal("x", "15"), Ok(15));
        assert_eq!(parse_signal("x", "signal.SIGTERM"), Ok(15));
        assert!(parse_signal("--rank-termination-signal", "SIGNOPE")
            .unwrap_err()
            .0
            .contains("SIGNOPE"));
        assert!(resolve(
            &args(&["--heartbeat-timeout", "0", "t.py"]),
            &host_with(&none)
        )
        .is_err());
    }

    #[test]
    fn multi_node_needs_to_know_its_place() {
        let none = || Ok(0);
        let e = resolve(&args(&["--nnodes", "2", "t.py"]), &host_with(&none))
            .unwrap_err()
            .0;
        assert!(e.contains("--nnodes 2") && e.contains("--node-rank"), "{e}");
        let c = resolve(
            &args(&[
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--rdzv-endpoint",
                "head:7000",
                "--rdzv-conf",
                "join_timeout=45,read_timeout=9",
                "t.py",
            ]),
            &host_with(&none),
        )
        .unwrap();
        assert_eq!((c.nnodes, c.node_rank), (2, 1));
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("head", Some(7000))
        );
        assert_eq!(c.join_timeout, Duration::from_secs(45));
        assert!(resolve(&args(&["--rdzv-conf", "oops", "t.py"]), &host_with(&none)).is_err());
    }

    #[test]
    fn env_matches_torchrun() {
        let none = || Ok(0);
        let c = resolve(
            &args(&[
                "--nproc-per-node",
                "2",
                "--rdzv-id",
                "job7",
                "--max-restarts",
                "3",
                "t.py",
            ]),
            &host_with(&none),
        )
        .unwrap();
        let slot = RankSlot {
            local_rank: 1,
            group_rank: c.node_rank,
            restart_count: 2,
            rank_offset: 4,
            world_size: 6,
            master_addr: "10.0.0.9",
            master_port: 4000,
            error_file: "/e.json",
        };
        let env: std::collections::HashMap<_, _> =
            worker_env(&c, &slot, &no_env).into_iter().collect();
        let want = [
            ("RANK", "5"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "6"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "0"),
            ("GROUP_WORLD_SIZE", "1"),
            ("ROLE_RANK", "5"),
            ("ROLE_NAME", "default"),
            ("ROLE_WORLD_SIZE", "6"),
            ("MASTER_ADDR", "10.0.0.9"),
            ("MASTER_PORT", "4000"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
            ("TORCHELASTIC_MAX_RESTARTS", "3"),
            ("TORCHELASTIC_RUN_ID", "job7"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            ("TORCHELASTIC_ERROR_FILE", "/e.json"),
            ("OMP_NUM_THREADS", "1"),
            (
                "TORCHELASTIC_SIGNALS_TO_HANDLE",
                "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
            ),
        ];
        for (k, v) in want {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        let set = |k: &str| (k == "OMP_NUM_THREADS").then(|| "8".to_string());
        let env2 = worker_env(&c, &slot, &set);
        assert!(
            !env2.iter().any(|(k, _)| k == "OMP_NUM_THREADS"),
            "a user's OMP_NUM_THREADS is kept"
        );
    }
}

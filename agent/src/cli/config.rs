//! Turning `vigil run`'s flags into a checked launch plan, and the environment each rank gets.
//! Everything here is pure: the facts it needs from the machine (CPU and GPU counts, environment
//! variables) are passed in.

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::RunArgs;
use crate::job::state::{Identity, TimeoutsPlace};
use crate::perf::gpu::GpuError;
use crate::supervise::monitor::{parse_section_timeouts, Timeouts};
use crate::values::{err, parse_signal, seconds, ConfigError, MAX_SECONDS};

mod flags;
mod rank_env;

pub use flags::{
    check_nproc, parse_filters, parse_nproc, parse_ranks_filter, parse_rdzv_conf,
    parse_signal_list, parse_std_spec, FDS_PER_RANK, FDS_RESERVED, RANKS_PER_CPU,
};
pub use rank_env::{generation_env, render_prefix, virtual_device, worker_env, RankSlot};

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
    /// 0 until the c10d rendezvous hands it out, when `node_rank_by_rdzv`.
    pub node_rank: u32,
    /// No node rank anywhere: the c10d rendezvous hands it out at start (job/nodes.rs).
    pub node_rank_by_rdzv: bool,
    /// `--nnodes MIN:MAX`: once MIN nodes joined the first rendezvous, how long it waits for
    /// more before it starts with those present (`--rdzv-conf last_call_timeout`).
    pub last_call: Duration,
    /// `--rdzv-conf is_host=...` (torch's): whether this agent hosts the store when the
    /// rendezvous hands out node ranks; `None`: it does if it can bind the endpoint.
    pub rdzv_is_host: Option<bool>,
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
    /// Node rank 0: how often it says who a rendezvous waits for (30 s; a hidden variable,
    /// `VIGIL_TEST_JOIN_NOTE_PERIOD_MS`, shortens it for tests).
    pub join_note_every: Duration,
    /// How long a silent peer agent has before it counts as lost.
    pub node_timeout: Duration,
    pub max_restarts: u32,
    /// `--in-process-restarts`, `--abort-timeout` (docs/inprocess.md).
    pub in_process: crate::supervise::generation::InProcessConfig,
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
    /// `--calculate-timeouts`.
    pub calculate_timeouts: bool,
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
    /// `--metrics-port`: serve Prometheus metrics on this port (0: any free one).
    pub metrics_port: Option<u16>,
    /// `--metrics-textfile`: write them into this directory for node_exporter.
    pub metrics_textfile: Option<PathBuf>,
    /// NVRx's console lines and cycle info files.
    pub nvrx: crate::nvrx::NvrxPlan,
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
    /// `state_dir` is one every node of the job may share: given with `--state-dir`, or a Slurm
    /// job's (under its working directory). Outside Slurm a derived one lies under each node's
    /// own `--log-dir` or `$TMPDIR`, which the nodes need not share.
    pub state_dir_shared: bool,
    /// Whose state it is (`None`: a job without an identity).
    pub identity: Option<Identity>,
}

/// What the machine says, for resolving `--nproc-per-node cpu|gpu|auto` and the interpreter.
pub struct Host<'a> {
    pub cpus: u32,
    /// The agent's open-file limit (soft RLIMIT_NOFILE), which bounds the ranks it can watch.
    pub nofile: u64,
    /// GPU count, or why it is unknown.
    pub gpus: &'a dyn Fn() -> Result<u32, GpuError>,
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The wall clock now: an `--end-time` already past is refused.
    pub now: std::time::SystemTime,
    /// The agent's working directory (`None`: unknown, removed).
    pub cwd: Option<PathBuf>,
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
        Some(s) => parse_section_timeouts(s)?,
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

/// torchrun's `last_call_timeout` (`--rdzv-conf`), 30 s as in torch's dynamic rendezvous.
fn last_call(a: &RunArgs) -> Result<Duration, ConfigError> {
    let Some(v) = parse_rdzv_conf(&a.rdzv_conf)?
        .into_iter()
        .find(|(k, _)| k == "last_call_timeout")
        .map(|(_, v)| v)
    else {
        return Ok(Duration::from_secs(30));
    };
    let s = seconds(&v)
        .map_err(|fix| ConfigError(format!("--rdzv-conf last_call_timeout={v:?}: {fix}")))?;
    secs("--rdzv-conf last_call_timeout", s)
}

/// torch's `is_host` (`--rdzv-conf`), read as torch's `get_as_bool` reads it.
fn rdzv_is_host(a: &RunArgs) -> Result<Option<bool>, ConfigError> {
    let Some(v) = parse_rdzv_conf(&a.rdzv_conf)?
        .into_iter()
        .find(|(k, _)| k == "is_host")
        .map(|(_, v)| v)
    else {
        return Ok(None);
    };
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" => Ok(Some(true)),
        "0" | "false" | "f" | "no" | "n" => Ok(Some(false)),
        _ => err(format!(
            "--rdzv-conf is_host={v:?} is not a boolean: give is_host=true or is_host=false"
        )),
    }
}

/// `vigil run`'s flags, checked and resolved against the machine (`host`) into the launch plan.
/// The first problem found is the error, in the order the flags are checked below.
pub fn resolve(a: &RunArgs, host: &Host) -> Result<LaunchConfig, ConfigError> {
    let nodes = crate::job::nodes::discover(&node_flags(a), host.env)?;
    check_launch(a)?;
    let nproc = parse_nproc(&a.nproc_per_node, host)?;
    check_nproc(nproc, host)?;
    if a.virtual_local_rank {
        virtual_device(nproc - 1, host.env)?;
    }
    let console = consoles(a, nproc)?;
    let python = (host.env)("PYTHON_EXEC").unwrap_or_else(|| "python3".into());
    let command = rank_command(a, &python)?;
    let active_nodes = active_nodes(a, &nodes)?;
    let allocation = allocation_plan(a, host, nodes.job_id.as_deref())?;
    Ok(LaunchConfig {
        nproc,
        nnodes: nodes.nnodes,
        active_nodes,
        segment: a.segment.filter(|k| *k > 0),
        node_rank: nodes.node_rank,
        node_rank_by_rdzv: nodes.rank_by_rdzv,
        last_call: last_call(a)?,
        rdzv_is_host: rdzv_is_host(a)?,
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
        join_note_every: crate::job::rendezvous::absent::join_note_period(
            (host.env)(crate::job::rendezvous::absent::JOIN_NOTE_PERIOD_ENV).as_deref(),
        ),
        node_timeout: opt_secs("--node-timeout", Some(a.node_timeout))?.unwrap_or_default(),
        max_restarts: a.max_restarts,
        in_process: crate::supervise::generation::InProcessConfig {
            restarts: a.in_process_restarts,
            abort_timeout: secs("--abort-timeout", a.abort_timeout)?,
        },
        workers_stop_timeout: secs("--workers-stop-timeout", a.workers_stop_timeout)?,
        term_timeout: term_timeout(a, host.env)?,
        signals: parse_signal_list(&a.signals_to_handle)?,
        signals_to_handle: a.signals_to_handle.clone(),
        prefix_template: prefix_template(a, host),
        dup_stdout: parse_filters(&a.duplicate_stdout_filters),
        dup_stderr: parse_filters(&a.duplicate_stderr_filters),
        virtual_local_rank: a.virtual_local_rank,
        backoff: backoff(a)?,
        command,
        entrypoint_name: entrypoint_name(&a.training_script),
        log_dir: a.log_dir.clone(),
        event_log: a.event_log.clone(),
        console,
        timeouts: resolve_timeouts(a)?,
        warmup_steps: a.warmup_steps,
        safety_factor: safety_factor(a.safety_factor)?,
        calculate_timeouts: a.calculate_timeouts,
        termination_signal: parse_signal("--rank-termination-signal", &a.rank_termination_signal)?,
        stack_wait: secs("--stack-dump-timeout", a.stack_dump_timeout)?,
        timeouts_file: TimeoutsPlace::resolve(
            a.timeouts_file.as_deref(),
            allocation
                .state_dir
                .as_deref()
                .filter(|_| allocation.identity.is_some()),
        ),
        gpu: gpu_config(a).map_err(|e| ConfigError(e.to_string()))?,
        allocation,
        straggler: straggler_plan(a)?,
        metrics_port: a.metrics_port,
        metrics_textfile: a.metrics_textfile.clone(),
        nvrx: crate::nvrx::NvrxPlan {
            restarter_log: a.nvrx_restarter_log,
            progress_file: a
                .checkpoint_iteration_file
                .as_deref()
                .map(|f| host.cwd.clone().unwrap_or_default().join(f)),
            cycle_info: a.cycle_info_dir.as_deref().map(|d| {
                let cwd = host.cwd.clone().unwrap_or_default();
                crate::nvrx::cycle_info::CycleInfoPlan::new(d, &cwd, host.env)
            }),
        },
    })
}

fn node_flags(a: &RunArgs) -> crate::job::nodes::NodeFlags<'_> {
    crate::job::nodes::NodeFlags {
        nnodes: a.nnodes.as_deref(),
        node_rank: a.node_rank,
        master_addr: a.master_addr.as_deref(),
        master_port: a.master_port,
        rdzv_endpoint: &a.rdzv_endpoint,
        rdzv_id: &a.rdzv_id,
        standalone: a.standalone,
        rdzv_backend: &a.rdzv_backend,
    }
}

/// The rendezvous backend, the training script and the role: what must be there at all.
fn check_launch(a: &RunArgs) -> Result<(), ConfigError> {
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
    Ok(())
}

/// Which streams of each local rank reach the console: `--redirects` sends a stream to its file
/// only, `--tee` to both, `--local-ranks-filter` keeps the other ranks off the console.
fn consoles(a: &RunArgs, nproc: u32) -> Result<Vec<Console>, ConfigError> {
    let redirects = parse_std_spec("--redirects", &a.redirects, nproc)?;
    let tee = parse_std_spec("--tee", &a.tee, nproc)?;
    let filter = parse_ranks_filter(&a.local_ranks_filter, nproc)?;
    Ok((0..nproc as usize)
        .map(|lr| {
            let shown = filter.as_ref().is_none_or(|f| f.contains(&(lr as u32)));
            Console {
                stdout: shown && (tee[lr].0 || !redirects[lr].0),
                stderr: shown && (tee[lr].1 || !redirects[lr].1),
            }
        })
        .collect())
}

/// The nodes that run ranks: all but `--spare-nodes` (or the standbys `--nnodes MIN:MAX` left).
fn active_nodes(a: &RunArgs, nodes: &crate::job::nodes::Nodes) -> Result<u32, ConfigError> {
    match a.spare_nodes {
        0 => Ok(nodes.active),
        n if nodes.active != nodes.nnodes => err(format!(
            "--spare-nodes {n} and --nnodes {} both say how many nodes wait as standbys: give one of them",
            a.nnodes.as_deref().unwrap_or("")
        )),
        n if n >= nodes.nnodes => err(format!(
            "--spare-nodes {n} leaves no node to run ranks in a {}-node job: give at most {}",
            nodes.nnodes,
            nodes.nnodes - 1
        )),
        n => Ok(nodes.nnodes - n),
    }
}

/// What the failure summary calls the job: the script's file name (`train.py`).
fn entrypoint_name(script: &str) -> String {
    std::path::Path::new(script)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| script.to_string())
}

/// As torchrun: the flag (or PET_*), else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE.
fn prefix_template(a: &RunArgs, host: &Host) -> Option<String> {
    Some(a.log_line_prefix_template.clone())
        .filter(|t| !t.is_empty())
        .or_else(|| (host.env)("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
        .filter(|t| !t.is_empty())
}

fn backoff(a: &RunArgs) -> Result<crate::supervise::Backoff, ConfigError> {
    Ok(crate::supervise::Backoff {
        base: secs("--restart-backoff", a.restart_backoff)?,
        cap: secs("--restart-backoff-max", a.restart_backoff_max)?,
        reset_after: secs("--restart-backoff-reset", a.restart_backoff_reset)?,
    })
}

fn safety_factor(f: f64) -> Result<f64, ConfigError> {
    if f.is_finite() && f >= 1.0 {
        Ok(f)
    } else {
        err(format!("--safety-factor {f}: give a number >= 1.0"))
    }
}

/// The across-allocations plan: whose state it is and where it lives, when the allocation ends
/// (an end given by flags that leaves no time for the stop lead is refused), the requeue limits.
fn allocation_plan(
    a: &RunArgs,
    host: &Host,
    job_id: Option<&str>,
) -> Result<AllocationPlan, ConfigError> {
    let identity = Identity::resolve(job_id, host.env);
    let slurm_job_id = (host.env)("SLURM_JOB_ID").filter(|s| !s.trim().is_empty());
    let under_slurm = slurm_job_id.is_some();
    let state_dir = a.state_dir.clone().or_else(|| {
        let base = state_base(a, slurm_job_id.is_some(), host);
        identity
            .as_ref()
            .map(|i| crate::job::state::job_state_dir(&base, &i.key()))
    });
    let stop_lead = secs("--stop-lead", a.stop_lead)?;
    let end = end_spec(a, host)?;
    check_flag_end(a, &end, stop_lead, host.now)?;
    Ok(AllocationPlan {
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
        state_dir_shared: state_dir.is_some() && (a.state_dir.is_some() || under_slurm),
        state_dir,
        identity,
    })
}

fn straggler_plan(a: &RunArgs) -> Result<StragglerPlan, ConfigError> {
    let interval = secs("--straggler-report-interval", a.straggler_report_interval)?;
    if interval.is_zero() {
        return err("--straggler-report-interval 0: give the seconds between reports, such as 300");
    }
    Ok(StragglerPlan {
        interval,
        threshold: a.straggler_threshold,
        stop: a.stop_if_straggler,
        section: a.straggler_section.clone(),
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

/// The GPU side of `vigil run` (perf/): NVML library, health check, memory reclaim, NUMA binding.
fn gpu_config(a: &RunArgs) -> Result<crate::perf::GpuConfig, crate::perf::numa::UnknownMode> {
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

    fn host_with(gpus: &dyn Fn() -> Result<u32, GpuError>) -> Host<'_> {
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
        let broken = || {
            Err(GpuError::Off(crate::perf::gpu::NvmlOff::NoDriver(
                nvml_wrapper::error::NvmlError::LibraryNotFound,
            )))
        };
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
        assert!(
            c.allocation.state_dir_shared,
            "a Slurm job's: the store's secret may live there"
        );
        let c = resolve(&args(&["--state-dir", "/s", "t.py"]), &h).unwrap();
        assert_eq!(c.allocation.state_dir, Some(PathBuf::from("/s")));
        assert!(c.allocation.state_dir_shared);
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
        // Each node's own $TMPDIR (or --log-dir): no secret is kept there.
        assert!(!c.allocation.state_dir_shared);
        let c = resolve(&args(&["--state-dir", "/s", "--rdzv-id", "r", "t.py"]), &h).unwrap();
        assert!(c.allocation.state_dir_shared);
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
    fn c10d_hands_out_node_ranks_and_min_max_has_a_last_call() {
        let none = || Ok(0);
        let resolved = |a: &[&str]| resolve(&args(a), &host_with(&none));
        let c = resolved(&[
            "--nnodes",
            "1:4",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "head:29400",
            "t.py",
        ])
        .unwrap();
        assert!(c.node_rank_by_rdzv);
        assert_eq!((c.nnodes, c.active_nodes), (4, 1));
        assert_eq!(c.last_call, Duration::from_secs(30), "torch's default");
        let c = resolved(&[
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--rdzv-endpoint",
            "head",
            "--rdzv-conf",
            "last_call_timeout=2.5,join_timeout=9",
            "t.py",
        ])
        .unwrap();
        assert!(!c.node_rank_by_rdzv);
        assert_eq!(c.last_call, Duration::from_millis(2500));
        assert_eq!(c.rdzv_is_host, None);
        let host = |v: &str| {
            let conf = format!("is_host={v}");
            resolved(&["--rdzv-conf", &conf, "t.py"]).map(|c| c.rdzv_is_host)
        };
        assert_eq!(host("True").unwrap(), Some(true));
        assert_eq!(host("0").unwrap(), Some(false));
        let e = host("maybe").unwrap_err().0;
        assert!(e.contains("is_host=\"maybe\" is not a boolean"), "{e}");
        let e = resolved(&["--rdzv-conf", "last_call_timeout=soon", "t.py"])
            .unwrap_err()
            .0;
        assert!(
            e.starts_with("--rdzv-conf last_call_timeout=\"soon\": give a number of seconds"),
            "{e}"
        );
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

//! The event loop of one node: turns the outside world (child exits, signals, deadlines) into
//! supervisor events and carries out the supervisor's actions. All decisions live in
//! `supervisor`; this file only does I/O.

pub mod ipc_server;
pub mod output;
pub mod proc;
pub mod stacks;
pub mod summary;

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::AsyncReadExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::cli::config::{worker_env, LaunchConfig, RankSlot};
use crate::job::rendezvous::{self, CoordConfig, FromCoord, HeadSide};
use crate::job::state::{self, Provenance};
use crate::supervise::monitor::Timeouts;
use crate::supervise::{
    Action, Event, JobEnd, JobRequest, Outcome, Record, StopReason, Supervisor, SupervisorConfig,
};
use crate::values::file_safe;
use ipc_server::{IpcIn, Shared};
use output::{ConsoleStream, Dup, LineSplitter, LogFile, Sink, Tail};
use proc::Watchdog;
use stacks::StackReport;
use summary::FailedRank;

/// How long to wait, once everything is reaped, for rank output still in the pipes.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// How long, at exit, to wait for a console that is not being read.
const CONSOLE_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// At most one refused-connection notice on the console per this long; the rest are counted.
const REFUSED_NOTICE_WINDOW: Duration = Duration::from_secs(10);
/// The loop wakes at least this often, so a longer gap means the agent itself was not running
/// (SIGSTOP, `scontrol suspend`, a frozen VM): that time is not counted against any rank.
const CLOCK_TICK: Duration = Duration::from_millis(200);
const SUSPEND_SLACK: Duration = Duration::from_millis(800);

/// Monotonic time minus the time the agent was suspended: the clock every timeout runs on.
struct JobClock {
    paused: Duration,
    last_wake: Instant,
}

impl JobClock {
    fn new() -> Self {
        JobClock {
            paused: Duration::ZERO,
            last_wake: Instant::now(),
        }
    }

    /// Called on every wake-up; returns the job time now and how long a suspension just ended, if any.
    fn wake(&mut self) -> (Instant, Option<Duration>) {
        let now = Instant::now();
        let gap = now.saturating_duration_since(self.last_wake);
        self.last_wake = now;
        let mut suspended = None;
        if gap > CLOCK_TICK + SUSPEND_SLACK {
            let away = gap - CLOCK_TICK;
            self.paused += away;
            suspended = Some(away);
        }
        (now - self.paused, suspended)
    }

    fn to_real(&self, job: Instant) -> Instant {
        job + self.paused
    }
}

/// Who this node's saved state says wrote it.
fn provenance(cfg: &LaunchConfig) -> Provenance {
    Provenance {
        job_id: cfg.job_id.clone(),
        program: cfg.program.clone(),
        nnodes: cfg.nnodes,
        nproc_per_node: cfg.nproc,
    }
}

/// A problem found before any rank starts; printed as one line, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartError(pub String);

/// Creates the run directory, `<log_dir or $TMPDIR>/vigil_<job id or script>_<UTC time>_<hex>/`:
/// a person finds a job's directory by its id or its script, and when it ran; the hex part keeps
/// two agents that start in the same second apart.
pub fn make_run_dir(cfg: &LaunchConfig) -> Result<PathBuf, StartError> {
    let (base, flag) = match &cfg.log_dir {
        Some(d) => (d.clone(), "--log-dir"),
        None => (std::env::temp_dir(), "the temp dir ($TMPDIR)"),
    };
    let now = SystemTime::now();
    let nanos = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let suffix = format!("{:06x}", ((std::process::id() << 16) ^ nanos) & 0xff_ffff);
    let name = run_dir_name(cfg.job_id.as_deref(), &cfg.program, now, &suffix);
    let dir = base.join(name);
    fs::create_dir_all(&dir).map_err(|e| {
        StartError(format!(
            "{flag} {}: cannot create {}: {e}; choose a directory you can write",
            base.display(),
            dir.display()
        ))
    })?;
    // Ranks may change directory; every path they are given must be absolute.
    fs::canonicalize(&dir).map_err(|e| StartError(format!("cannot resolve {}: {e}", dir.display())))
}

/// `vigil_<id or script stem>_<YYYYMMDD-HHMMSS>_<suffix>`.
fn run_dir_name(job_id: Option<&str>, program: &str, now: SystemTime, suffix: &str) -> String {
    let who = job_id
        .map(str::to_string)
        .unwrap_or_else(|| match program.strip_prefix("-m ") {
            Some(module) => module.rsplit('.').next().unwrap_or(module).to_string(),
            None => Path::new(program)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        });
    let stamp: String = humantime::format_rfc3339_seconds(now)
        .to_string()
        .chars()
        .filter_map(|c| match c {
            '0'..='9' => Some(c),
            'T' => Some('-'),
            _ => None,
        })
        .collect();
    format!("vigil_{}_{stamp}_{suffix}", file_safe(&who))
}

/// Checks that every rank's command can be executed, before anything starts.
pub fn check_command(
    cfg: &LaunchConfig,
    script_is_file: bool,
    script: &str,
) -> Result<(), StartError> {
    let prog = &cfg.command[0];
    if proc::find_program(prog, std::env::var("PATH").ok().as_deref()).is_none() {
        let hint = if script_is_file {
            "; set PYTHON_EXEC to a Python interpreter or put python3 on PATH"
        } else {
            "; check the command name and PATH"
        };
        return Err(StartError(format!(
            "cannot execute {prog:?}: not found or not executable{hint}"
        )));
    }
    if script_is_file && !Path::new(script).is_file() {
        let cwd = std::env::current_dir().unwrap_or_default();
        return Err(StartError(format!(
            "training script {script:?} not found (looked in {}); give a path to an existing file",
            cwd.display()
        )));
    }
    Ok(())
}

struct EventLog {
    file: Option<File>,
    host: String,
    node_rank: u32,
}

impl EventLog {
    fn write(&mut self, rec: &Record) {
        self.write_value(serde_json::to_value(rec).unwrap_or_default());
    }

    fn write_value(&mut self, mut v: serde_json::Value) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        if let Some(o) = v.as_object_mut() {
            o.insert("ts".into(), ts.into());
            o.insert("host".into(), self.host.clone().into());
            o.insert("node_rank".into(), self.node_rank.into());
        }
        if let Some(f) = &mut self.file {
            let mut line = v.to_string();
            line.push('\n');
            if let Err(e) = f.write_all(line.as_bytes()) {
                console_note(&format!(
                    "cannot write the event log ({e}); continuing without it"
                ));
                self.file = None;
            }
        }
    }
}

struct Agent {
    cfg: LaunchConfig,
    run_dir: PathBuf,
    host: String,
    events: EventLog,
    watchdog: Option<Watchdog>,
    /// How every process the ranks started is found again at the end of an attempt.
    containment: proc::Containment,
    /// stderr tails of the current cycle's ranks.
    tails: Vec<Tail>,
    readers: Vec<JoinHandle<()>>,
    queue: VecDeque<Event>,
    outcome: Option<Outcome>,
    shared: Rc<Shared>,
    socket: PathBuf,
    stacks_tx: mpsc::UnboundedSender<(u32, u32, StackReport)>,
    /// Stack reports per (cycle, local rank), for the failure summary.
    stack_reports: Vec<(u32, u32, StackReport)>,
    coord: mpsc::UnboundedSender<JobRequest>,
    /// vigil's store as the ranks reach it (MASTER_ADDR, MASTER_PORT).
    store_for_ranks: (String, u16),
    /// Rank log files could not be created once already (said once).
    log_create_failed: bool,
    /// The current cycle's assignment from the rendezvous.
    rank_offset: u32,
    world_size: u32,
    /// The job's restart budget (node rank 0's).
    max_restarts: u32,
    /// Set when the supervisor decided to leave the job.
    leave: Option<JobRequest>,
    /// How the last cycle ended, when another node ended it.
    peer_end: Option<JobEnd>,
}

fn console_note(msg: &str) {
    output::note(msg);
}

fn note_refused(n: u64) {
    console_note(&format!(
        "refused {n} more connection(s) on the ranks' socket (each is in the event log)"
    ));
}

/// A line for the console's stderr (never blocks: see `output`).
fn console_err(line: String) {
    output::console_text(ConsoleStream::Stderr, &(line + "\n"));
}

fn describe_timeouts(t: &Timeouts) -> String {
    let f =
        |d: Option<Duration>| d.map_or("off".to_string(), |d| format!("{:.2}s", d.as_secs_f64()));
    let mut s = format!(
        "initial {}, heartbeat {}, out-of-section {}",
        f(t.initial),
        f(t.heartbeat),
        f(t.out_of_section)
    );
    for (k, v) in &t.sections {
        s.push_str(&format!(", section {k} {:.2}s", v.as_secs_f64()));
    }
    if let Some(w) = t.warmup {
        s.push_str(&format!(", warmup {:.2}s", w.as_secs_f64()));
    }
    s
}

impl Agent {
    fn attempt_dir(&self, cycle: u32, local_rank: u32) -> PathBuf {
        self.run_dir
            .join(format!("attempt_{cycle}"))
            .join(local_rank.to_string())
    }

    fn spawn_cycle(&mut self, cycle: u32) {
        self.tails = (0..self.cfg.nproc).map(|_| Tail::default()).collect();
        // Pumps of earlier attempts that reached end-of-file need no waiting for at exit.
        self.readers.retain(|h| !h.is_finished());
        self.shared.cycle.set(cycle);
        *self.shared.rank_pids.borrow_mut() = vec![None; self.cfg.nproc as usize];
        let env_of = |k: &str| std::env::var(k).ok();
        let dups = [
            (&self.cfg.dup_stdout, "filtered_stdout.log"),
            (&self.cfg.dup_stderr, "filtered_stderr.log"),
        ]
        .map(|(filters, name)| {
            (!filters.is_empty()).then(|| {
                let dir = self.run_dir.join(format!("attempt_{cycle}"));
                let file = fs::create_dir_all(&dir)
                    .and_then(|_| File::create(dir.join(name)))
                    .ok();
                Dup {
                    filters: Rc::new(filters.clone()),
                    file: Rc::new(std::cell::RefCell::new(file)),
                }
            })
        });
        let hostname = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        for lr in 0..self.cfg.nproc {
            let dir = self.attempt_dir(cycle, lr);
            let error_file = dir.join("error.json");
            // A log directory that is full, read-only or gone costs the log files, not the job.
            let open_log = |name: &str| -> std::io::Result<LogFile> {
                fs::create_dir_all(&dir)?;
                let path = dir.join(name);
                Ok(LogFile {
                    file: File::create(&path)?,
                    path,
                })
            };
            let (out_log, err_log) = match (open_log("stdout.log"), open_log("stderr.log")) {
                (Ok(o), Ok(e)) => (Some(o), Some(e)),
                (Err(e), _) | (_, Err(e)) => {
                    if !self.log_create_failed {
                        self.log_create_failed = true;
                        console_note(&format!(
                            "cannot create the rank logs in {}: {e}; ranks run without log files \
                             (free space or fix --log-dir; the console still shows their output)",
                            dir.display()
                        ));
                    }
                    (None, None)
                }
            };
            let error_file_s = error_file.to_string_lossy().into_owned();
            let slot = RankSlot {
                local_rank: lr,
                restart_count: cycle,
                rank_offset: self.rank_offset,
                world_size: self.world_size,
                master_addr: &self.store_for_ranks.0,
                master_port: self.store_for_ranks.1,
                error_file: &error_file_s,
            };
            let mut env = worker_env(&self.cfg, &slot, &env_of);
            env.push((
                "VIGIL_RUN_DIR".into(),
                self.run_dir.to_string_lossy().into_owned(),
            ));
            env.push((
                "VIGIL_SOCKET".into(),
                self.socket.to_string_lossy().into_owned(),
            ));
            env.push((
                "VIGIL_STACK_FILE".into(),
                dir.join("stacks.txt").to_string_lossy().into_owned(),
            ));
            env.push(self.containment.env());
            match proc::spawn_rank(&self.cfg.command, &env, self.containment.cgroup()) {
                Ok(sp) => {
                    if let Some(w) = &mut self.watchdog {
                        w.guard(sp.pid);
                    }
                    self.shared.rank_pids.borrow_mut()[lr as usize] = Some(sp.pid);
                    let prefix = crate::cli::config::render_prefix(
                        self.cfg.prefix_template.as_deref(),
                        &self.cfg.role,
                        self.rank_offset + lr,
                        lr,
                        &hostname,
                    );
                    let console = self.cfg.console[lr as usize];
                    self.readers.push(pump(
                        sp.stdout,
                        Sink {
                            prefix: prefix.clone(),
                            console: console.stdout.then_some(ConsoleStream::Stdout),
                            file: out_log,
                            tail: None,
                            dup: dups[0].clone(),
                        },
                    ));
                    self.readers.push(pump(
                        sp.stderr,
                        Sink {
                            prefix,
                            console: console.stderr.then_some(ConsoleStream::Stderr),
                            file: err_log,
                            tail: Some(self.tails[lr as usize].clone()),
                            dup: dups[1].clone(),
                        },
                    ));
                    self.queue.push_back(Event::RankSpawned {
                        local_rank: lr,
                        pid: sp.pid,
                    });
                }
                Err(e) => {
                    self.queue.push_back(Event::SpawnFailed {
                        local_rank: lr,
                        error: format!("cannot execute {:?}: {e}", self.cfg.command[0]),
                    });
                    return;
                }
            }
        }
    }

    fn note(&self, rec: &Record) {
        match rec {
            Record::CycleStart { cycle, nproc, .. } => console_note(&format!(
                "starting {nproc} rank(s){}, attempt {cycle} (restarts left: {}); logs in {}",
                if self.cfg.nnodes > 1 {
                    format!(
                        " as ranks {}-{} of {}",
                        self.rank_offset,
                        self.rank_offset + nproc - 1,
                        self.world_size
                    )
                } else {
                    String::new()
                },
                self.max_restarts.saturating_sub(*cycle),
                self.run_dir.display()
            )),
            Record::CycleEnded { cycle, end } => match end {
                JobEnd::Done => {}
                JobEnd::Failed { node, reason } if *node != self.cfg.node_rank => {
                    console_note(&format!(
                        "attempt {cycle} failed on node {node}: {reason}; every node stops its ranks"
                    ))
                }
                JobEnd::Stopped { node, reason, .. } if *node != self.cfg.node_rank => {
                    console_note(&format!(
                        "the job is stopping ({reason}, on node {node}); stopping this node's ranks"
                    ))
                }
                JobEnd::Lost { reason } => console_note(&format!(
                    "{reason}; stopping this node's ranks, the job ends (requeue it to go on)"
                )),
                _ => {}
            },
            Record::RankExited {
                rank,
                pid,
                exit_code,
                signal,
                expected: false,
                ..
            } => console_note(&format!(
                "rank {rank} (pid {pid}) failed: {}",
                match (exit_code, signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (_, Some(s)) => format!("killed by {}", crate::values::signal_name(*s)),
                    _ => "unknown".into(),
                }
            )),
            Record::Stop {
                reason,
                signal,
                grace_ms,
                pids,
                ..
            } if !pids.is_empty() => console_note(&format!(
                "stopping {} rank(s) {}: {} then SIGKILL after {:.1}s",
                pids.len(),
                match reason {
                    StopReason::RankFailed => "after a rank failed",
                    StopReason::Signal => "on a signal to the agent",
                    StopReason::SpawnFailed => "after a rank could not start",
                    StopReason::Peer => "as the job's other nodes do",
                },
                crate::values::signal_name(*signal),
                *grace_ms as f64 / 1000.0
            )),
            Record::Escalate { pids, .. } => console_note(&format!(
                "{} rank(s) still running after the grace period: SIGKILL",
                pids.len()
            )),
            Record::RankSpawnFailed { error, .. } => console_note(error),
            Record::Hang { rank, pid, hang, .. } => console_note(&format!(
                "rank {rank} (pid {pid}) is hung: {} of {:.1}s passed (silent for {:.1}s){}; capturing its stacks",
                hang.timeout,
                hang.limit_ms as f64 / 1000.0,
                hang.silent_ms as f64 / 1000.0,
                if hang.stopped {
                    ", its process is stopped (SIGSTOP?)"
                } else {
                    ""
                }
            )),
            Record::Restart {
                to_cycle,
                ran_ms,
                backoff_ms,
                ..
            } if *backoff_ms > 0 => console_note(&format!(
                "attempt {} failed after {:.1}s; waiting {:.1}s before attempt {to_cycle} (restart back-off)",
                to_cycle - 1,
                *ran_ms as f64 / 1000.0,
                *backoff_ms as f64 / 1000.0
            )),
            Record::TimeoutsUpdated { source, timeouts } => console_note(&format!(
                "timeouts ({source}): {}",
                describe_timeouts(timeouts)
            )),
            _ => {}
        }
    }

    fn execute(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                // Leaving waits until the loop is over (the output drained).
                Action::Job(leave @ JobRequest::Leave { .. }) => self.leave = Some(leave),
                Action::Job(req) => {
                    let _ = self.coord.send(req);
                }
                Action::SpawnCycle { cycle } => self.spawn_cycle(cycle),
                Action::SignalGroups { pgids, signal } => {
                    for p in pgids {
                        proc::signal_group(p, signal);
                    }
                }
                Action::ReapGroups { pgids } => {
                    for p in &pgids {
                        proc::signal_group(*p, libc::SIGKILL);
                    }
                    self.sweep(self.shared.cycle.get());
                    for p in pgids {
                        if let Some(w) = &mut self.watchdog {
                            w.release(p);
                        }
                    }
                }
                Action::Record(rec) => {
                    self.note(&rec);
                    self.events.write(&rec);
                }
                Action::Finish(o) => self.outcome = Some(o),
                Action::CaptureStacks {
                    local_rank,
                    pid,
                    via_shim,
                } => {
                    let dir = self.attempt_dir(self.shared.cycle.get(), local_rank);
                    let cycle = self.shared.cycle.get();
                    let wait = self.cfg.stack_wait;
                    let tx = self.stacks_tx.clone();
                    tokio::task::spawn_local(async move {
                        let report = stacks::capture(pid, &dir, via_shim, wait).await;
                        let _ = tx.send((cycle, local_rank, report));
                    });
                }
                Action::ProbeStopped { ranks } => {
                    let stopped = ranks
                        .into_iter()
                        .filter(|(_, pid)| matches!(proc::process_state(*pid), Some('T' | 't')))
                        .map(|(lr, _)| lr)
                        .collect();
                    self.queue.push_back(Event::Probed { stopped });
                }
                Action::SendToRank { local_rank, msg } => self.shared.send(local_rank, msg),
                Action::SendToAll(msg) => self.shared.send_all(&msg),
                Action::SaveTimeouts(t) => {
                    let path = self.cfg.timeouts_file.save_path(&self.run_dir);
                    if let Err(e) = state::save_timeouts(&path, &provenance(&self.cfg), &t) {
                        console_note(&format!(
                            "cannot save calculated timeouts to {}: {e}",
                            path.display()
                        ));
                    }
                }
            }
        }
    }

    /// Kills whatever the ranks left running outside their process groups (daemons that called
    /// setsid, double forks) and says so. Called once no rank of the attempt runs, so every child
    /// of the agent but the watchdog is such a leftover.
    fn sweep(&mut self, cycle: u32) {
        let spare: Vec<i32> = self.watchdog.iter().map(Watchdog::pid).collect();
        let me = std::process::id() as i32;
        let killed = self.containment.sweep(Some((me, &spare)));
        if killed > 0 {
            console_note(&format!(
                "killed {killed} process(es) the ranks of attempt {cycle} left running outside their process groups"
            ));
            self.events.write_value(serde_json::json!({
                "event": "leftovers_killed", "cycle": cycle, "count": killed,
            }));
        }
    }

    fn on_stacks(&mut self, cycle: u32, local_rank: u32, report: StackReport) {
        let rank = self.rank_offset + local_rank;
        let mut msg = format!("rank {rank} stacks captured");
        match &report.python {
            Some(p) => msg.push_str(&format!(" (Python: {})", p.display())),
            None => msg.push_str(&format!(" (no Python stacks: {})", report.missing)),
        }
        if let Some(p) = &report.proc {
            msg.push_str(&format!(", kernel view: {}", p.display()));
        }
        if !report.innermost.is_empty() {
            msg.push_str("; innermost frames:");
            for f in &report.innermost {
                msg.push_str(&format!("\n    {f}"));
            }
        }
        console_note(&msg);
        let v = serde_json::json!({
            "event": "stacks",
            "cycle": cycle,
            "local_rank": local_rank,
            "rank": rank,
            "python_stacks": report.python,
            "proc_stacks": report.proc,
            "innermost": report.innermost,
        });
        self.events.write_value(v);
        self.stack_reports.push((cycle, local_rank, report));
    }

    fn failure_summary(&self, sup: &Supervisor, now_i: Instant) -> String {
        let now_s = SystemTime::now();
        let failed: Vec<FailedRank> = sup
            .failures()
            .iter()
            .map(|f| {
                let error_path = self.attempt_dir(f.cycle, f.local_rank).join("error.json");
                let error = fs::read_to_string(&error_path)
                    .ok()
                    .and_then(|t| summary::parse_error_file(&t));
                let when = now_s - now_i.saturating_duration_since(f.at);
                let stacks = self
                    .stack_reports
                    .iter()
                    .find(|(c, lr, _)| *c == f.cycle && *lr == f.local_rank)
                    .map(|(_, _, r)| r.clone());
                FailedRank {
                    time: humantime::format_rfc3339_seconds(when).to_string(),
                    host: self.host.clone(),
                    rank: f.rank,
                    local_rank: f.local_rank,
                    how: f.how,
                    hang: f.hang.clone(),
                    stacks,
                    pid: f.pid,
                    error_file: error
                        .as_ref()
                        .map(|_| error_path.to_string_lossy().into_owned()),
                    error,
                    stderr_tail: self
                        .tails
                        .get(f.local_rank as usize)
                        .map(|t| t.borrow().iter().cloned().collect())
                        .unwrap_or_default(),
                }
            })
            .collect();
        let elsewhere = match &self.peer_end {
            Some(JobEnd::Failed { node, reason }) if failed.is_empty() => Some(format!(
                "on node {node}: {reason} (its agent's log has the details)"
            )),
            _ => None,
        };
        summary::render(
            &self.cfg.entrypoint_name,
            sup.cycle(),
            &failed,
            elsewhere.as_deref(),
        )
    }
}

/// Where this node's agent reaches vigil's store, where the ranks reach it, and, on node rank 0,
/// the store itself.
struct StoreSetup {
    client_addr: SocketAddr,
    for_ranks: (String, u16),
    head: Option<HeadSide>,
    /// What this node's agent proves to the store (docs/store.md, "Who may use the store").
    secret: Option<Arc<[u8]>>,
}

/// The environment variable that carries the job's store secret to every node's agent.
pub const SECRET_ENV: &str = "VIGIL_STORE_SECRET";

/// Takes the job's store secret out of the environment, so that no rank inherits it. Call before
/// any other thread starts. A secret too short to be one is a one-line error.
pub fn take_store_secret() -> Result<Option<Vec<u8>>, String> {
    use std::os::unix::ffi::OsStrExt;
    let Some(v) = std::env::var_os(SECRET_ENV) else {
        return Ok(None);
    };
    std::env::remove_var(SECRET_ENV);
    vigil_store::auth::check_secret(v.as_bytes()).map(|s| Some(s.to_vec()))
}

/// Where node rank 0 listens: one node, loopback only; several, the address `MASTER_ADDR`
/// resolved to (`head`). `master_is_literal`: the user gave that address as an IP, not a name.
fn bind_addr(nnodes: u32, head: SocketAddr, master_is_literal: bool) -> SocketAddr {
    let port = head.port();
    let loopback: std::net::IpAddr = match head {
        SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
    };
    if nnodes == 1 {
        return SocketAddr::new(loopback, port);
    }
    // A name that this machine alone resolves to loopback (Debian's 127.0.1.1 for its own
    // hostname) says nothing about where the other nodes reach it.
    if head.ip().is_loopback() && !master_is_literal {
        return SocketAddr::new(unspecified(head), port);
    }
    head
}

fn unspecified(a: SocketAddr) -> std::net::IpAddr {
    match a {
        SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    }
}

/// At most one console line per this long about connections the store closed.
const DROP_NOTE_EVERY: Duration = Duration::from_secs(10);

/// Tells the console why the store closed a connection, at most once per [`DROP_NOTE_EVERY`].
fn drop_notice() -> vigil_store::DropNotice {
    let last: std::sync::Mutex<(Option<Instant>, u64)> = std::sync::Mutex::new((None, 0));
    Arc::new(move |peer, why| {
        let mut g = last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if g.0.is_some_and(|t| now.duration_since(t) < DROP_NOTE_EVERY) {
            g.1 += 1;
            return;
        }
        let more = std::mem::take(&mut g.1);
        g.0 = Some(now);
        drop(g);
        console_note(&format!(
            "vigil's store closed the connection from {peer}: {why}{}",
            if more > 0 {
                format!(" ({more} more closed since the last note)")
            } else {
                String::new()
            }
        ));
    })
}

fn scontrol_show_node(name: &str) -> Option<String> {
    let out = std::process::Command::new("scontrol")
        .args(["show", "node", name, "-o"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn setup_store(cfg: &LaunchConfig, secret: Option<Vec<u8>>) -> Result<StoreSetup, String> {
    let port = cfg.master_port.unwrap_or(0);
    let head = crate::job::nodes::resolve_head(
        &cfg.master_addr,
        port,
        cfg.master_is_slurm_node,
        &scontrol_show_node,
    )?;
    if cfg.node_rank != 0 {
        return Ok(StoreSetup {
            client_addr: head,
            for_ranks: (head.ip().to_string(), head.port()),
            head: None,
            secret: secret.map(Arc::from),
        });
    }
    let secret = match secret {
        Some(s) => s,
        // Alone, this agent is the store's only agent: a secret of its own is enough.
        None if cfg.nnodes == 1 => vigil_store::auth::random_secret()
            .map_err(|e| format!("cannot draw a random secret for vigil's store: {e}"))?,
        None => {
            console_note(&format!(
                "{SECRET_ENV} is not set: anyone who can reach vigil's store can read and change the agents' control keys; export {SECRET_ENV}=$(openssl rand -hex 32) in the job script so that every node inherits the same one"
            ));
            Vec::new()
        }
    };
    let secret = (!secret.is_empty()).then(|| Arc::<[u8]>::from(secret));
    let literal = cfg.master_addr.parse::<std::net::IpAddr>().is_ok();
    let mut bind = bind_addr(cfg.nnodes, head, literal);
    let host = |bind| {
        host_store(
            bind,
            cfg.node_timeout,
            secret.as_deref().map(<[u8]>::to_vec),
        )
    };
    let mut hosted = host(bind);
    if matches!(&hosted, Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable) {
        // MASTER_ADDR is not an address of this machine (NAT, a proxy, a wrong name).
        console_note(&format!(
            "{} (MASTER_ADDR) is not an address of this machine, so vigil's store listens on every address of it",
            head.ip()
        ));
        bind = SocketAddr::new(unspecified(head), port);
        hosted = host(bind);
    }
    let (bound, keys, leases) = hosted.map_err(|e| {
        format!(
            "cannot listen on {bind} for vigil's store: {e}; {}",
            if e.kind() == std::io::ErrorKind::AddrInUse {
                "another program uses that port: give a free one with --master-port"
            } else {
                "give an address of this machine with --master-addr"
            }
        )
    })?;
    let client_addr = match bound {
        SocketAddr::V4(a) if a.ip().is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], a.port()))
        }
        SocketAddr::V6(a) if a.ip().is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port()))
        }
        a => a,
    };
    // Alone, the ranks reach the store where it listens: on loopback.
    let ranks_ip = if cfg.nnodes == 1 {
        bind.ip()
    } else {
        head.ip()
    };
    Ok(StoreSetup {
        client_addr,
        for_ranks: (ranks_ip.to_string(), bound.port()),
        head: Some(HeadSide { keys, leases }),
        secret,
    })
}

/// A running store: its address, its key space and the other agents' lease events.
pub type HostedStore = (
    SocketAddr,
    vigil_store::KeySpace,
    mpsc::UnboundedReceiver<vigil_store::LeaseEvent>,
);

/// Runs vigil's store on a thread of its own, so that the ranks' and agents' requests are
/// answered whatever the agent's event loop is busy with. With a `secret`, only agents that
/// prove they hold it may use the `/vigil/` keys.
pub fn host_store(
    bind: SocketAddr,
    peer_timeout: Duration,
    secret: Option<Vec<u8>>,
) -> std::io::Result<HostedStore> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("vigil-store".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                let mut server = match vigil_store::StoreServer::bind(bind).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                server.set_peer_timeout(Some(peer_timeout));
                server.set_secret(secret);
                server.on_drop(drop_notice());
                let leases = server.lease_events();
                let hosted = server.local_addr().map(|a| (a, server.key_space(), leases));
                let ok = hosted.is_ok();
                let _ = tx.send(hosted);
                if ok {
                    server.serve().await;
                }
            });
        })?;
    rx.recv()
        .unwrap_or_else(|_| Err(std::io::Error::other("the store's thread ended")))
}

fn pump(fd: OwnedFd, mut sink: Sink) -> JoinHandle<()> {
    tokio::task::spawn_local(async move {
        let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
            return;
        };
        let mut splitter = LineSplitter::default();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rx.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    sink.write(&mut splitter, &[], true);
                    return;
                }
                Ok(n) => sink.write(&mut splitter, &buf[..n], false),
            }
        }
    })
}

/// Runs the job on this node and returns the agent's exit status.
pub fn run(cfg: LaunchConfig, run_dir: PathBuf) -> i32 {
    // Before any thread starts: the environment is not thread-safe to change.
    let secret = match take_store_secret() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vigil: error: {e}");
            return 2;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            console_err(format!("vigil: error: cannot start the event loop: {e}"));
            return 70;
        }
    };
    let local = tokio::task::LocalSet::new();
    let code = local.block_on(&rt, agent_main(cfg, run_dir, secret));
    // The console may be stalled (a stuck srun, `| less`): give it a while, then exit anyway.
    output::flush_console(CONSOLE_FLUSH_TIMEOUT);
    code
}

async fn agent_main(cfg: LaunchConfig, run_dir: PathBuf, secret: Option<Vec<u8>>) -> i32 {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    let event_path = cfg
        .event_log
        .clone()
        .unwrap_or_else(|| run_dir.join("events.jsonl"));
    let event_file = match OpenOptions::new()
        .create(true)
        .append(true)
        .open(&event_path)
    {
        Ok(f) => f,
        Err(e) => {
            console_err(format!(
                "vigil: error: cannot write the event log {}: {e}; choose a writable --log-dir or --event-log",
                event_path.display()
            ));
            return 2;
        }
    };
    if let Err(e) = proc::become_subreaper() {
        console_note(&format!(
            "cannot become a child subreaper ({e}); orphaned rank descendants are reaped by init"
        ));
    }
    let containment = proc::Containment::create();
    let watchdog = match Watchdog::start(&containment) {
        Ok(w) => Some(w),
        Err(e) => {
            console_note(&format!("cannot start the watchdog ({e}); ranks still die with the agent, their children may not"));
            None
        }
    };
    let mut sigs = Vec::new();
    // torchrun's --signals-to-handle: the others keep their default action.
    for num in cfg.signals.clone() {
        match signal(SignalKind::from_raw(num)) {
            Ok(s) => sigs.push((s, num)),
            Err(e) => {
                console_err(format!(
                    "vigil: error: cannot install a signal handler: {e}"
                ));
                return 70;
            }
        }
    }
    let Ok(mut sigchld) = signal(SignalKind::child()) else {
        console_err("vigil: error: cannot watch child processes (SIGCHLD)".to_string());
        return 70;
    };
    let shared = Rc::new(Shared::default());
    let (ipc_tx, mut ipc_rx) = mpsc::channel(ipc_server::QUEUE);
    let mut refused = ipc_server::NoticeLimit::new(REFUSED_NOTICE_WINDOW);
    let server = match ipc_server::start(&std::env::temp_dir(), shared.clone(), ipc_tx) {
        Ok(s) => s,
        Err(e) => {
            console_err(format!(
                "vigil: error: cannot create the ranks' socket under {}: {e}; set TMPDIR to a writable local directory",
                std::env::temp_dir().display()
            ));
            return 2;
        }
    };
    let (stacks_tx, mut stacks_rx) = mpsc::unbounded_channel();

    let store = match setup_store(&cfg, secret) {
        Ok(s) => s,
        Err(e) => {
            console_err(format!("vigil: error: {e}"));
            return 2;
        }
    };
    let (coord_tx, coord_rx_req) = mpsc::unbounded_channel();
    let (coord_ev_tx, mut coord_rx) = mpsc::unbounded_channel();
    let coord_cfg = CoordConfig {
        nnodes: cfg.nnodes,
        node_rank: cfg.node_rank,
        nproc: cfg.nproc,
        store: store.client_addr,
        join_timeout: cfg.join_timeout,
        peer_timeout: cfg.node_timeout,
        host: host.clone(),
        max_restarts: cfg.max_restarts,
        secret: store.secret.clone(),
    };
    if cfg.nnodes > 1 {
        console_note(&format!(
            "node {} of {}; vigil's store is at {}:{}{}",
            cfg.node_rank,
            cfg.nnodes,
            store.for_ranks.0,
            store.for_ranks.1,
            if cfg.node_rank == 0 { " (here)" } else { "" }
        ));
    }
    let coordinator = tokio::task::spawn_local(rendezvous::run(
        coord_cfg,
        store.head,
        coord_rx_req,
        coord_ev_tx,
    ));

    let mut agent = Agent {
        events: EventLog {
            file: Some(event_file),
            host: host.clone(),
            node_rank: cfg.node_rank,
        },
        host,
        run_dir,
        watchdog,
        containment,
        tails: Vec::new(),
        readers: Vec::new(),
        queue: VecDeque::new(),
        outcome: None,
        shared,
        socket: server.path.clone(),
        stacks_tx,
        stack_reports: Vec::new(),
        log_create_failed: false,
        coord: coord_tx,
        store_for_ranks: store.for_ranks,
        rank_offset: 0,
        world_size: cfg.nproc * cfg.nnodes,
        max_restarts: cfg.max_restarts,
        leave: None,
        peer_end: None,
        cfg,
    };
    agent.events.write_value(serde_json::json!({
        "event": "containment",
        "cgroup": agent.containment.cgroup(),
    }));
    agent.events.write_value(serde_json::json!({
        "event": "nodes",
        "nnodes": agent.cfg.nnodes,
        "store": format!("{}:{}", agent.store_for_ranks.0, agent.store_for_ranks.1),
        "run_id": agent.cfg.run_id,
    }));
    // Node rank 0 keeps the job's calculated timeouts and hands them to every node.
    let calculated = match (&agent.cfg.timeouts_file.load, agent.cfg.node_rank) {
        (Some(path), 0) => state::load_timeouts(path, &provenance(&agent.cfg), &console_note),
        _ => None,
    };
    let mut clock = JobClock::new();
    let (mut sup, first) = Supervisor::new(SupervisorConfig {
        nproc: agent.cfg.nproc,
        rank_offset: 0,
        max_restarts: agent.cfg.max_restarts,
        node_rank: agent.cfg.node_rank,
        saves_timeouts: agent.cfg.node_rank == 0,
        workers_stop_timeout: agent.cfg.workers_stop_timeout,
        term_timeout: agent.cfg.term_timeout,
        timeouts: agent.cfg.timeouts.clone(),
        warmup_steps: agent.cfg.warmup_steps,
        safety_factor: agent.cfg.safety_factor,
        termination_signal: agent.cfg.termination_signal,
        stack_wait: agent.cfg.stack_wait,
        calculated,
        backoff: agent.cfg.backoff,
    });
    agent.execute(first);
    let mut ticker = tokio::time::interval(CLOCK_TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        let (now, suspended) = clock.wake();
        if let Some(away) = suspended {
            let v = serde_json::json!({"event": "suspended", "seconds": away.as_secs_f64()});
            agent.events.write_value(v);
            console_note(&format!(
                "the agent was suspended for {:.1}s; that time does not count against any timeout",
                away.as_secs_f64()
            ));
        }
        while let Some(ev) = agent.queue.pop_front() {
            let actions = sup.handle(now, ev);
            agent.execute(actions);
        }
        if agent.outcome.is_some() {
            break;
        }
        let deadline = sup.next_deadline().map(|d| clock.to_real(d));
        let sleep = tokio::time::sleep_until(
            deadline
                .map(tokio::time::Instant::from_std)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600)),
        );
        let sig_futs = futures_signal(&mut sigs);
        tokio::select! {
            _ = sigchld.recv() => {
                for (pid, how) in proc::reap_all() {
                    agent.queue.push_back(Event::Reaped { pid, how });
                }
            }
            num = sig_futs => agent.queue.push_back(Event::Signal(num)),
            Some(m) = ipc_rx.recv() => match m {
                IpcIn::Message { cycle, local_rank, msg } if cycle == sup.cycle() => {
                    agent.queue.push_back(Event::Message { local_rank, msg });
                }
                IpcIn::Closed { cycle, local_rank } if cycle == sup.cycle() => {
                    agent.queue.push_back(Event::Disconnected { local_rank });
                }
                IpcIn::Message { .. } | IpcIn::Closed { .. } => {}
                IpcIn::Rejected { peer_pid, reason } => {
                    if refused.admit(Instant::now()) {
                        console_note(&format!("refused a connection on the ranks' socket: {reason}"));
                    }
                    agent.events.write_value(serde_json::json!({
                        "event": "ipc_rejected", "peer_pid": peer_pid, "reason": reason,
                    }));
                }
            },
            Some(m) = coord_rx.recv() => match m {
                FromCoord::Joined { cycle, rank_offset, world_size, max_restarts, calculated } => {
                    agent.rank_offset = rank_offset;
                    agent.world_size = world_size;
                    agent.max_restarts = max_restarts;
                    agent.queue.push_back(Event::Joined { cycle, rank_offset, max_restarts, calculated });
                }
                FromCoord::CycleEnded { cycle, end } => {
                    if end != JobEnd::Done {
                        agent.peer_end = Some(end.clone());
                    }
                    agent.queue.push_back(Event::CycleEnded { cycle, end });
                }
                FromCoord::JobTimeouts {
                    cycle,
                    round,
                    timeouts,
                } => {
                    agent.queue.push_back(Event::JobTimeouts {
                        cycle,
                        round,
                        timeouts,
                    });
                }
                FromCoord::Lost { reason, requeue } => {
                    agent.queue.push_back(Event::CoordinationLost { reason, requeue });
                }
            },
            Some((cycle, local_rank, report)) = stacks_rx.recv() => {
                agent.on_stacks(cycle, local_rank, report);
                if cycle == sup.cycle() {
                    agent.queue.push_back(Event::StacksCaptured { local_rank });
                }
            }
            _ = ticker.tick() => {
                if let Some(n) = refused.due(Instant::now(), false) {
                    note_refused(n);
                }
            }
            _ = sleep, if deadline.is_some() => agent.queue.push_back(Event::Tick),
        }
        if deadline.is_some_and(|d| Instant::now() >= d) && agent.queue.is_empty() {
            agent.queue.push_back(Event::Tick);
        }
    }

    if let Some(n) = refused.due(Instant::now(), true) {
        note_refused(n);
    }
    let readers = std::mem::take(&mut agent.readers);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        for r in readers {
            let _ = r.await;
        }
    })
    .await;
    if let Some(leave) = agent.leave.take() {
        // The coordinator returns once this node has left the job (node rank 0: once the others
        // have, or one node timeout).
        if agent.coord.send(leave).is_ok() {
            let bound = agent.cfg.node_timeout + Duration::from_secs(1);
            let _ = tokio::time::timeout(bound, coordinator).await;
        }
    }
    // Nothing the ranks started outlives the agent, whichever way the job ended.
    agent.sweep(sup.cycle());
    agent.containment.remove();
    let outcome = agent.outcome.clone().unwrap_or(Outcome::Succeeded);
    let (job_now, _) = clock.wake();
    match &outcome {
        Outcome::Succeeded if agent.cfg.nnodes > 1 => console_note(&format!(
            "every rank on all {} nodes finished successfully",
            agent.cfg.nnodes
        )),
        Outcome::Succeeded => console_note("all ranks finished successfully"),
        Outcome::Failed { .. } => {
            output::console_text(ConsoleStream::Stderr, &agent.failure_summary(&sup, job_now))
        }
        Outcome::Signaled { signal } => console_note(&format!(
            "stopped by {}; exit status {}",
            crate::values::signal_name(*signal),
            outcome.exit_code()
        )),
        Outcome::SpawnFailed { error, .. } => console_err(format!("vigil: error: {error}")),
        Outcome::PeerStopped {
            node,
            reason,
            exit_code,
        } => console_note(&format!(
            "stopped because node {node} stopped the job ({reason}); exit status {exit_code}"
        )),
        Outcome::Lost {
            reason,
            requeue: true,
        } => console_err(format!(
            "vigil: {reason}; exit status {}: requeue the job to go on",
            outcome.exit_code()
        )),
        Outcome::Lost {
            reason,
            requeue: false,
        } => console_err(format!("vigil: error: {reason}")),
    }
    drop(server);
    outcome.exit_code()
}

/// Waits for the first of the agent's stop signals and returns its number.
async fn futures_signal(sigs: &mut [(tokio::signal::unix::Signal, i32)]) -> i32 {
    std::future::poll_fn(|cx| {
        for (s, num) in sigs.iter_mut() {
            if let std::task::Poll::Ready(Some(())) = s.poll_recv(cx) {
                return std::task::Poll::Ready(*num);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_listens_where_the_nodes_need_it() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        // Alone: loopback, whatever MASTER_ADDR says.
        assert_eq!(bind_addr(1, a("10.1.2.3:5000"), true), a("127.0.0.1:5000"));
        assert_eq!(bind_addr(1, a("[fd00::1]:5000"), true), a("[::1]:5000"));
        // Several: MASTER_ADDR's address.
        assert_eq!(bind_addr(4, a("10.1.2.3:5000"), false), a("10.1.2.3:5000"));
        assert_eq!(bind_addr(2, a("127.0.0.1:5000"), true), a("127.0.0.1:5000"));
        // A name only this machine resolves to loopback: every address.
        assert_eq!(bind_addr(2, a("127.0.1.1:5000"), false), a("0.0.0.0:5000"));
    }

    #[test]
    fn run_directories_say_whose_and_when() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(
            run_dir_name(None, "/w/my train.py", t, "abc123"),
            "vigil_my_train_20261118-110640_abc123"
        );
        assert_eq!(
            run_dir_name(None, "-m pkg.trainer", t, "1"),
            "vigil_trainer_20261118-110640_1"
        );
        assert_eq!(
            run_dir_name(Some("4242"), "/w/train.py", t, "1"),
            "vigil_4242_20261118-110640_1"
        );
    }
}

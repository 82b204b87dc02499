//! The runtime of one node, the edges: turns the outside world (child exits, signals, deadlines,
//! the ranks' socket, the other nodes) into supervisor events and carries out the supervisor's
//! actions. All decisions live in `supervise`; nothing here decides.
//!
//! - `mod.rs`: `run` and the event loop (`agent_main`).
//! - `agent.rs`: carrying out actions (spawn a cycle, signal, sweep, stacks).
//! - `report.rs`: all console text about the job; `summary.rs`: the failure summary's text.
//! - `clock.rs`: the job's clock, which skips the agent's own suspension.
//! - `prelaunch.rs`: run directory and checks before any rank starts.
//! - `eventlog.rs`: `events.jsonl`. `store_host.rs`: hosting and finding vigil's store.
//! - `slurm_job.rs`: the Slurm job: the window after its SIGTERM, the exclusions the partition
//!   can spare, the requeue (by `scontrol`, or by the batch script inside a container).
//! - `gpuwatch.rs`: the node's GPUs (NVML samples, XID events) while the job runs.
//! - `perf.rs`: `steps` records, step times for straggler scores, the job's straggler report.
//! - `proc.rs`: process groups, containment, the watchdog. `output.rs`: rank output to logs and
//!   console. `ipc_server.rs`: the ranks' socket. `stacks.rs`: capturing a hung rank's stacks.

mod agent;
mod allocation;
mod clock;
mod eventlog;
mod gate;
mod gpuwatch;
pub mod ipc_server;
pub mod output;
mod perf;
mod prelaunch;
pub mod proc;
mod report;
mod slurm_job;
pub mod stacks;
mod store_host;
pub mod summary;

pub use allocation::prepare_state;
use clock::{JobClock, CLOCK_TICK};
use eventlog::EventLog;
use prelaunch::provenance;
pub use prelaunch::{check_command, make_run_dir, StartError};
use report::{console_err, console_note, note_refused};
use store_host::setup_store;
pub use store_host::{host_store, take_store_secret, HostedStore, SECRET_ENV};

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::AsyncReadExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::cli::config::{worker_env, LaunchConfig, RankSlot};
use crate::cli::derive::CoordFacts;
use crate::job::rendezvous::{self, FromCoord};
use crate::job::state;
use crate::supervise::monitor::Timeouts;
use crate::supervise::{
    Action, Event, JobEnd, JobRequest, Outcome, Record, StopReason, Supervisor,
};
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
struct Agent {
    cfg: LaunchConfig,
    run_dir: PathBuf,
    host: String,
    events: EventLog,
    watchdog: Option<Watchdog>,
    /// How each attempt of the job ended (node rank 0 blames nodes from it).
    cycle_ends: Vec<(u32, JobEnd)>,
    /// Children of the agent that are its own commands (`squeue`), not a rank's leftovers.
    helper_pids: Arc<std::sync::Mutex<Vec<i32>>>,
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
    /// This node's slot (GROUP_RANK) in the current cycle: its node rank, unless it took a lost
    /// node's place (hot spares).
    group_rank: u32,
    world_size: u32,
    /// The job's restart budget (node rank 0's).
    max_restarts: u32,
    /// Set when the supervisor decided to leave the job.
    leave: Option<JobRequest>,
    /// How the last cycle ended, when another node ended it.
    peer_end: Option<JobEnd>,
    /// The job refused this agent (a stray, a wrong secret, a taken node rank): its one line is
    /// the error at exit, with no note about stopping ranks it never had.
    refused: bool,
    steps_log: perf::StepsLog,
    /// Standbys promoted so far (node rank 0), for the ledger.
    promotions: Vec<crate::allocation::ledger::Promotion>,
    /// What asked for the stop under way (`time-limit`, `SIGTERM`, ...), for the console.
    stop_trigger: Option<String>,
    stragglers: perf::Stragglers,
    /// The node's GPUs, when NVML is there.
    gpus: gpuwatch::GpuWatch,
    /// This node's straggler summaries, to node rank 0 through the store.
    share: mpsc::UnboundedSender<Vec<u8>>,
    /// Where the checks before a rendezvous report (`gate.rs`).
    gate_tx: mpsc::UnboundedSender<gate::GateOut>,
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
    // Slurm's name for the node when there is one: what `ExcNodeList` and `sinfo` call it (several
    // slurmd may share one machine).
    let host = std::env::var("SLURMD_NODENAME")
        .ok()
        .filter(|n| !n.trim().is_empty())
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .map(|h| h.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "unknown".into());
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
    let mut watchdog = match Watchdog::start(&containment) {
        Ok(w) => Some(w),
        Err(e) => {
            console_note(&format!("cannot start the watchdog ({e}); ranks still die with the agent, their children may not"));
            None
        }
    };
    let mut sigs = Vec::new();
    // torchrun's --signals-to-handle: the others keep their default action. SIGUSR1 and SIGUSR2
    // always ask for a stop at a step (Slurm's `--signal=USR1@N`); their default would kill the
    // agent and with it the job.
    let mut handled = cfg.signals.clone();
    for extra in [libc::SIGUSR1, libc::SIGUSR2] {
        if !handled.contains(&extra) {
            handled.push(extra);
        }
    }
    for num in handled {
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
    if let Some(w) = &mut watchdog {
        // A SIGKILLed agent cannot remove its socket directory; the watchdog does.
        w.remove_on_exit(server.dir());
    }
    let (stacks_tx, mut stacks_rx) = mpsc::unbounded_channel();
    let (gpu_tx, mut gpu_rx) = mpsc::unbounded_channel();
    let (report_tx, mut report_rx) = mpsc::unbounded_channel();
    let (gate_tx, mut gate_rx) = mpsc::unbounded_channel();

    let store = match setup_store(&cfg, secret) {
        Ok(s) => s,
        Err(e) => {
            console_err(format!("vigil: error: {e}"));
            return 2;
        }
    };
    let (coord_tx, coord_rx_req) = mpsc::unbounded_channel();
    let (coord_ev_tx, mut coord_rx) = mpsc::unbounded_channel();
    let coord_cfg = cfg.coord_config(CoordFacts {
        host: host.clone(),
        store: store.client_addr,
        secret: store.secret.clone(),
        topology: std::env::var("SLURM_TOPOLOGY_ADDR")
            .ok()
            .filter(|t| !t.trim().is_empty()),
    });
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
    let (share, mut shared_rx) =
        crate::job::exchange::start(coord_cfg.clone(), cfg.straggler.interval);
    // Node rank 0 reads which nodes' ranks failed in each attempt when it blames nodes.
    let head_keys = store.head.as_ref().map(|h| h.keys.clone());
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
        helper_pids: Default::default(),
        cycle_ends: Vec::new(),
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
        group_rank: cfg.node_rank,
        world_size: cfg.nproc * cfg.active_nodes,
        max_restarts: cfg.max_restarts,
        leave: None,
        peer_end: None,
        refused: false,
        steps_log: Default::default(),
        promotions: Vec::new(),
        stop_trigger: None,
        stragglers: perf::Stragglers::new(cfg.straggler.clone(), cfg.nproc),
        gpus: gpuwatch::GpuWatch::start(cfg.gpu.nvml_lib.clone(), gpu_tx),
        share,
        gate_tx,
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
    let signal_window = slurm_job::signal_window(&agent.cfg);
    let (mut sup, first) = Supervisor::new(agent.cfg.supervisor_config(calculated));
    agent.execute(first);
    let started_wall = SystemTime::now();
    let mut endw = allocation::EndWatch::start(
        &agent.cfg,
        allocation::carried_lead(&agent.cfg, &agent.run_dir),
    );
    endw.helpers = agent.helper_pids.clone();
    if let Some(ev) = endw.tick(&sup, clock.wake().0) {
        agent.queue.push_back(ev);
    }
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
            // A signal to the agent gets Slurm's window (a SIGTERM far from the allocation's end
            // is no time limit's: slurm_job::SignalWindow); a stop a peer asked for or one ahead
            // of the end keeps --term-timeout and the lead.
            sup.set_term_timeout(match ev {
                Event::Signal(_) => signal_window.at(endw.end(), SystemTime::now()),
                _ => agent.cfg.term_timeout,
            });
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
                IpcIn::Message { cycle, local_rank, msg, at } if cycle == sup.cycle() => {
                    agent.stragglers.on_msg(at, local_rank, &msg);
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
                FromCoord::Joined { cycle, group_rank, rank_offset, world_size, max_restarts, calculated } => {
                    agent.rank_offset = rank_offset;
                    agent.group_rank = group_rank;
                    agent.stragglers.new_attempt();
                    agent.world_size = world_size;
                    agent.max_restarts = max_restarts;
                    agent.queue.push_back(Event::Joined { cycle, rank_offset, world_size, max_restarts, calculated });
                }
                FromCoord::CycleEnded { cycle, end } => {
                    agent.cycle_ends.push((cycle, end.clone()));
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
                    agent.refused |= !requeue;
                    agent.queue.push_back(Event::CoordinationLost { reason, requeue });
                }
                FromCoord::StopAsked { cycle, trigger } => {
                    agent.queue.push_back(Event::StopAsked { cycle, trigger });
                }
                FromCoord::Promoted { cycle, promotions } => {
                    for p in &promotions {
                        agent.promotions.push(crate::allocation::ledger::Promotion {
                            cycle, slot: p.slot, lost: p.lost, standby: p.standby,
                        });
                    }
                    for p in promotions {
                        console_note(&format!(
                            "attempt {cycle}: standby node {} takes the place of lost node {} (group rank {})",
                            p.standby, p.lost, p.slot
                        ));
                        agent.events.write_value(serde_json::json!({
                            "event": "promotion", "cycle": cycle, "slot": p.slot,
                            "lost": p.lost, "standby": p.standby,
                        }));
                    }
                }
                FromCoord::Standby { cycle } => {
                    agent.queue.push_back(Event::Standby { cycle });
                }
                FromCoord::StopStep { cycle, step } => {
                    agent.queue.push_back(Event::StopStep { cycle, step });
                }
            },
            Some(m) = shared_rx.recv() => match m {
                crate::job::exchange::FromExchange::Collected(all) => {
                    let threshold = agent.stragglers.threshold();
                    let tx = report_tx.clone();
                    let (host, node) = (agent.host.clone(), agent.cfg.node_rank);
                    tokio::task::spawn_blocking(move || {
                        if let Some(mut r) = perf::report(threshold, &all) {
                            // 10 MB for 100,000 ranks: serialised here, not on the event loop.
                            eventlog::stamp(&mut r.record, &host, node);
                            let line = r.record.to_string();
                            let _ = tx.send((r, line));
                        }
                    });
                }
                crate::job::exchange::FromExchange::Trouble(why) => console_note(&format!(
                    "cannot share straggler summaries through the store ({why}); reports may miss nodes until it works again"
                )),
            },
            Some((r, line)) = report_rx.recv() => {
                output::console_text(ConsoleStream::Stderr, &r.text);
                agent.events.write_line(line);
                if !r.nodes.is_empty() {
                    agent.queue.push_back(Event::Stragglers { nodes: r.nodes });
                }
            }
            Some(out) = gate_rx.recv() => {
                if let Some(ev) = agent.on_gate(out) {
                    agent.queue.push_back(ev);
                }
            }
            Some(m) = gpu_rx.recv() => {
                if let Some(ev) = agent.on_gpu(m) {
                    agent.queue.push_back(ev);
                }
            }
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
                endw.maybe_reread();
                if let Some(v) = agent.steps_log.due(now, sup.cycle(), sup.step_range()) {
                    agent.events.write_value(v);
                }
                let gpus = &agent.gpus;
                let gpu_of = |lr: u32| gpus.explain(lr);
                if let Some(s) = agent.stragglers.share_due(now, agent.cfg.node_rank, &agent.host, agent.rank_offset, &gpu_of) {
                    let _ = agent.share.send(s);
                }
                // `now` from the top of this turn: waking the clock here would hide a suspension.
                if let Some(ev) = endw.tick(&sup, now) {
                    agent.queue.push_back(ev);
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
    // A rank's last steps may still sit in its socket when its exit was reaped first: count them,
    // so the ledger's highest step is the one the ranks reached.
    while let Ok(m) = ipc_rx.try_recv() {
        if let IpcIn::Message {
            cycle,
            local_rank,
            msg,
            at,
        } = m
        {
            if cycle == sup.cycle() {
                sup.note_late_step(at, local_rank, &msg);
            }
        }
    }
    if let Some(mut leave) = agent.leave.take() {
        if let JobRequest::Leave { highest_step, .. } = &mut leave {
            *highest_step = sup.highest_step();
        }
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
        Outcome::NoProgress { attempts, step } => {
            output::console_text(ConsoleStream::Stderr, &agent.failure_summary(&sup, job_now));
            console_note(&format!(
                "not restarting after {attempts} attempts: the last {n} in a row did not get {m} step(s) past step {} (--max-no-progress {n}, --min-progress-steps {m})",
                step.map_or("none".to_string(), |s| s.to_string()),
                n = agent.cfg.allocation.limits.max_no_progress,
                m = agent.cfg.allocation.limits.min_progress_steps
            ));
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
        Outcome::Stopped { trigger, step } => console_note(&match step {
            Some(s) => format!(
                "stopped for {trigger} at step {s}; exit status {}: run the job again to go on from its checkpoint",
                outcome.exit_code()
            ),
            None => format!(
                "stopped for {trigger}; exit status {}: run the job again to go on",
                outcome.exit_code()
            ),
        }),
    }
    let status = if agent.cfg.node_rank == 0 {
        allocation::conclude(allocation::Ending {
            cfg: &agent.cfg,
            run_dir: &agent.run_dir,
            outcome: &outcome,
            sup: &sup,
            peers_highest: head_keys.as_ref().and_then(|k| {
                k.keys_raw()
                    .iter()
                    .filter(|raw| raw.starts_with(rendezvous::key::HIGHEST_PREFIX_RAW))
                    .filter_map(|raw| k.get_raw(raw))
                    .filter_map(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok())
                    .max()
            }),
            started: started_wall,
            lead: endw.lead(&sup),
            promotions: agent.promotions.clone(),
            blame: {
                use crate::allocation::blame;
                let env = |k: &str| std::env::var(k).ok();
                let failed_on: Vec<(u32, u32)> = head_keys
                    .as_ref()
                    .map(|k| {
                        k.keys_raw()
                            .iter()
                            .filter_map(|raw| rendezvous::key::parse_failed(raw))
                            .collect()
                    })
                    .unwrap_or_default();
                let mut ranks = blame::nodes_to_blame(&blame::Attempts {
                    nnodes: agent.cfg.nnodes,
                    ends: &agent.cycle_ends,
                    failed_on: &failed_on,
                });
                if sup.exclude_asked() {
                    ranks.push(agent.cfg.node_rank);
                }
                for n in sup.blamed_nodes() {
                    if !ranks.contains(n) {
                        ranks.push(*n);
                    }
                }
                blame::names_of(&ranks, &blame::slurm_node_names(&env))
            },
        })
    } else {
        outcome.exit_code()
    };
    drop(server);
    status
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

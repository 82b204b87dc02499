//! The effectors of one node: what the agent holds to carry out the supervisor's actions, and
//! carrying them out: spawning an attempt's ranks, signalling and sweeping process groups, stacks
//! of a hung rank, the event log. The agent is made of parts: its ranks ([`Ranks`]), its outputs
//! ([`Outputs`]), its links to what runs beside the loop ([`Links`]); what its actions lead to
//! goes to the dispatcher's queue of events for the supervisor, which it is handed.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::{self, File};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::eventlog::EventLog;
use super::ipc_server::Shared;
use super::output::{self, ConsoleStream, Dup, LineSplitter, LogFile, Sink, Tail};
use super::prelaunch::provenance;
use super::proc::{self, Watchdog};
use super::report::{self, attempt_dir, console_note, Reporter};
use super::stacks::{self, StackReport};
use super::warm::{self, Warm};
use super::{gate, gpuwatch, perf};
use crate::allocation::ledger::Promotion;
use crate::cli::config::{render_prefix, worker_env, LaunchConfig, RankSlot};
use crate::job::state;
use crate::perf::numa;
use crate::supervise::{Action, Event, JobEnd, JobRequest, Outcome, Placement, Record};

/// What node rank 0 concludes the allocation from, gathered as the job goes.
#[derive(Default)]
pub(super) struct Trail {
    /// How each attempt of the job ended (node rank 0 blames nodes from it).
    pub(super) attempt_ends: Vec<(u32, JobEnd)>,
    /// How the last attempt ended, when another node ended it.
    pub(super) peer_end: Option<JobEnd>,
    /// Standbys promoted so far (node rank 0), for the ledger.
    pub(super) promotions: Vec<Promotion>,
    /// This agent took the coordinator's work over (the store outside the job): it concludes
    /// the allocation in node rank 0's place.
    pub(super) coordinates: bool,
    /// The agent-hosted store: node rank 0 (the store's host) was lost, so no node rank 0 will
    /// record the allocation; a survivor does, once ([`super::allocation::conclude`]).
    pub(super) head_lost: bool,
    /// The number this allocation's ledger record takes, read at the agent's start.
    pub(super) allocation_index: u32,
}

/// The rank processes of this node: how they are started, found again and swept, their output,
/// and the stacks of a hung one.
pub(super) struct Ranks {
    pub(super) watchdog: Option<Watchdog>,
    /// Children of the agent that are its own commands (`squeue`), not a rank's leftovers.
    pub(super) helper_pids: Arc<Mutex<Vec<i32>>>,
    /// How every process the ranks started is found again at the end of an attempt.
    pub(super) containment: proc::Containment,
    /// stderr tails of the current attempt's ranks.
    pub(super) tails: Vec<Tail>,
    pub(super) readers: Vec<JoinHandle<()>>,
    /// The ranks' socket: their pids and the connections to them.
    pub(super) shared: Rc<Shared>,
    pub(super) socket: PathBuf,
    pub(super) stacks_tx: mpsc::UnboundedSender<(u32, u32, StackReport)>,
    /// Stack reports per (attempt, local rank), for the failure summary.
    pub(super) stack_reports: Vec<(u32, u32, StackReport)>,
    /// Rank log files could not be created once already (said once).
    pub(super) log_create_failed: bool,
    /// What the current attempt's ranks were started with, for a rank started again in its
    /// place (an in-process restart).
    io: Option<AttemptIo>,
    /// With in-process restarts: a process ready to take a replaced rank's place (`warm/`).
    warm: Option<Warm>,
}

impl Ranks {
    /// No rank started yet.
    pub(super) fn new(
        containment: proc::Containment,
        watchdog: Option<Watchdog>,
        shared: Rc<Shared>,
        socket: PathBuf,
        stacks_tx: mpsc::UnboundedSender<(u32, u32, StackReport)>,
    ) -> Ranks {
        Ranks {
            watchdog,
            helper_pids: Default::default(),
            containment,
            tails: Vec::new(),
            readers: Vec::new(),
            shared,
            socket,
            stacks_tx,
            stack_reports: Vec::new(),
            log_create_failed: false,
            io: None,
            warm: None,
        }
    }
}

/// What the node writes as the job goes: the event log, the console's lines of records, NVRx's
/// console lines and cycle info files (`crate::nvrx`).
pub(super) struct Outputs {
    pub(super) events: EventLog,
    pub(super) report: Reporter,
    pub(super) nvrx: crate::nvrx::Nvrx,
}

/// The agent's links to what runs beside the loop: the job's coordination, the GPU watch, the
/// checks before a rendezvous, the straggler exchange.
pub(super) struct Links {
    pub(super) coord: mpsc::UnboundedSender<JobRequest>,
    /// The node's GPUs, when NVML is there.
    pub(super) gpus: gpuwatch::GpuWatch,
    /// Where the checks before a rendezvous report (`gate.rs`).
    pub(super) gate_tx: mpsc::UnboundedSender<gate::FromGate>,
    /// This node's straggler summaries, to node rank 0 through the store.
    pub(super) share: mpsc::UnboundedSender<Vec<u8>>,
}

/// The effectors of one node: its ranks, its outputs, its links, and what the job assigned it.
pub(super) struct Agent {
    pub(super) cfg: LaunchConfig,
    pub(super) run_dir: PathBuf,
    pub(super) host: String,
    pub(super) ranks: Ranks,
    pub(super) out: Outputs,
    pub(super) links: Links,
    pub(super) outcome: Option<Outcome>,
    /// vigil's store as the ranks reach it (MASTER_ADDR, MASTER_PORT): this node's ranks' door
    /// (`rank_door.rs`).
    pub(super) store_for_ranks: (String, u16),
    /// vigil's store itself, node rank 0's address as the job names it (the event log's `nodes`
    /// record, the console).
    pub(super) store_at: (String, u16),
    /// Set when the supervisor decided to leave the job.
    pub(super) leave: Option<JobRequest>,
    pub(super) trail: Trail,
    pub(super) steps_log: perf::StepsLog,
    pub(super) stragglers: perf::Stragglers,
}

/// Copies a rank's output pipe into its sink until end-of-file.
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

/// A rank's two log files, or none: a log directory that is full, read-only or gone costs the
/// log files, not the job.
fn open_logs(dir: &Path) -> std::io::Result<(LogFile, LogFile)> {
    let open = |name: &str| -> std::io::Result<LogFile> {
        fs::create_dir_all(dir)?;
        let path = dir.join(name);
        let file = File::create(&path)?;
        Ok(LogFile::new(path, file))
    };
    let (out, err) = (open("stdout.log"), open("stderr.log"));
    Ok((out?, err?))
}

/// What every rank of one attempt shares as it starts.
struct AttemptIo {
    /// Where the ranks stand in the job, as the supervisor says.
    placement: Placement,
    /// `--dup-stdout`/`--dup-stderr` files of the attempt.
    dups: [Option<Dup>; 2],
    numa: Option<Vec<Option<numa::Prepared>>>,
    hostname: String,
}

impl Agent {
    pub(super) fn attempt_dir(&self, attempt: u32, local_rank: u32) -> PathBuf {
        attempt_dir(&self.run_dir, attempt, local_rank)
    }

    pub(super) fn spawn_attempt(
        &mut self,
        attempt: u32,
        placement: Placement,
        queue: &mut VecDeque<Event>,
    ) {
        self.ranks.tails = (0..self.cfg.nproc).map(|_| Tail::default()).collect();
        // Pumps of earlier attempts that reached end-of-file need no waiting for at exit.
        self.ranks.readers.retain(|h| !h.is_finished());
        self.ranks.shared.attempt.set(attempt);
        *self.ranks.shared.rank_pids.borrow_mut() = vec![None; self.cfg.nproc as usize];
        let io = AttemptIo {
            placement,
            dups: self.dups(attempt),
            numa: self.numa(attempt),
            hostname: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        for lr in 0..self.cfg.nproc {
            if !self.spawn_rank(attempt, lr, &io, None, queue) {
                break;
            }
        }
        self.ranks.io = Some(io);
        self.start_warm(attempt);
    }

    /// With in-process restarts, and a rank command that a Python interpreter runs: starts the
    /// process that the next replaced rank becomes, unless one is ready. Its failure to start
    /// costs only speed: a replacement is then started cold.
    fn start_warm(&mut self, attempt: u32) {
        let Some(io) = &self.ranks.io else { return };
        let wanted = self.cfg.in_process.restarts > 0 && io.numa.is_none();
        if !wanted || self.ranks.warm.is_some() {
            return;
        }
        let Some(plan) = warm::plan(&self.cfg.command) else {
            return;
        };
        let Some(imports) = warm::imports(std::env::var(warm::IMPORTS_VAR).ok().as_deref()) else {
            return;
        };
        let dir = self.attempt_dir(attempt, 0);
        let env = warm::warm_env(&self.rank_env(attempt, 0, io.placement, &dir), &imports);
        match Warm::start(&plan, &env, self.ranks.containment.cgroup()) {
            Ok(w) => {
                if let Some(wd) = &mut self.ranks.watchdog {
                    wd.guard(w.pid());
                }
                self.ranks.warm = Some(w);
            }
            Err(e) => console_note(&format!(
                "cannot start a warm process for in-process restarts ({e}); a replaced rank starts cold"
            )),
        }
    }

    /// Ends the warm process, if any, before the ranks' leftovers are swept.
    fn discard_warm(&mut self) {
        if let Some(w) = self.ranks.warm.take() {
            let pid = w.pid();
            w.discard();
            if let Some(wd) = &mut self.ranks.watchdog {
                wd.release(pid);
            }
        }
    }

    /// Starts local rank `lr` of attempt `attempt` again, in its place, at `generation`
    /// (an in-process restart): the attempt's placement and outputs; its logs go to a folder of
    /// the generation's in the rank's attempt folder.
    pub(super) fn respawn_rank(
        &mut self,
        attempt: u32,
        lr: u32,
        generation: (u64, &[u32]),
        queue: &mut VecDeque<Event>,
    ) {
        let Some(io) = self.ranks.io.take() else {
            return;
        };
        // The failed rank's group is gone (the supervisor killed what was left of it): the
        // watchdog no longer guards it, lest its number be another process's later.
        let old = self.ranks.shared.rank_pids.borrow()[lr as usize];
        if let (Some(w), Some(old)) = (&mut self.ranks.watchdog, old) {
            w.release(old);
        }
        self.ranks.tails[lr as usize] = Tail::default();
        self.spawn_rank(attempt, lr, &io, Some(generation), queue);
        self.ranks.io = Some(io);
    }

    /// The attempt's filtered copies of the ranks' output, when asked for.
    fn dups(&self, attempt: u32) -> [Option<Dup>; 2] {
        [
            (&self.cfg.dup_stdout, "filtered_stdout.log"),
            (&self.cfg.dup_stderr, "filtered_stderr.log"),
        ]
        .map(|(filters, name)| {
            (!filters.is_empty()).then(|| {
                let dir = self.run_dir.join(format!("attempt_{attempt}"));
                let file = fs::create_dir_all(&dir)
                    .and_then(|_| File::create(dir.join(name)))
                    .ok();
                Dup {
                    filters: Rc::new(filters.clone()),
                    file: Rc::new(RefCell::new(file)),
                }
            })
        })
    }

    /// `--numa-binding`: where each rank is bound (warnings once, at the first attempt).
    fn numa(&self, attempt: u32) -> Option<Vec<Option<numa::Prepared>>> {
        let g = &self.cfg.gpu;
        g.numa.map(|mode| {
            let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
            let (p, warnings) = numa::prepare(
                g.nvml_lib.as_deref(),
                mode,
                g.numa_strict,
                self.cfg.nproc,
                cvd.as_deref(),
            );
            for w in warnings.iter().filter(|_| attempt == 0) {
                console_note(w);
            }
            p
        })
    }

    /// Starts one rank; false when it could not be (the attempt starts no more ranks).
    fn spawn_rank(
        &mut self,
        attempt: u32,
        lr: u32,
        io: &AttemptIo,
        generation: Option<(u64, &[u32])>,
        queue: &mut VecDeque<Event>,
    ) -> bool {
        let mut dir = self.attempt_dir(attempt, lr);
        if let Some((g, _)) = generation {
            dir = dir.join(format!("generation_{g}"));
        }
        let logs = match open_logs(&dir) {
            Ok((o, e)) => Some((o, e)),
            Err(e) => {
                if !self.ranks.log_create_failed {
                    self.ranks.log_create_failed = true;
                    console_note(&format!(
                        "cannot create the rank logs in {}: {e}; ranks run without log files \
                         (free space or fix --log-dir; the console still shows their output)",
                        dir.display()
                    ));
                }
                None
            }
        };
        let mut env = self.rank_env(attempt, lr, io.placement, &dir);
        if let Some((g, replaced)) = generation {
            env.extend(crate::cli::config::generation_env(g, replaced));
        }
        let numa = io.numa.as_ref().and_then(|n| n[lr as usize].as_ref());
        let warm = generation
            .and_then(|_| self.ranks.warm.take())
            .and_then(|w| w.hand_off(&env).ok());
        let was_warm = warm.is_some();
        let started = warm.map(Ok).unwrap_or_else(|| {
            proc::spawn_rank(
                &self.cfg.command,
                &env,
                self.ranks.containment.cgroup(),
                numa,
            )
        });
        match started {
            Ok(sp) => {
                // A warm process is guarded since it started.
                if let (Some(w), false) = (&mut self.ranks.watchdog, was_warm) {
                    w.guard(sp.pid);
                }
                self.ranks.shared.rank_pids.borrow_mut()[lr as usize] = Some(sp.pid);
                let pid = sp.pid;
                self.start_pumps(lr, sp, logs, io);
                queue.push_back(Event::RankSpawned {
                    local_rank: lr,
                    pid,
                });
                true
            }
            Err(e) => {
                queue.push_back(Event::SpawnFailed {
                    local_rank: lr,
                    error: format!("cannot execute {:?}: {e}", self.cfg.command[0]),
                });
                false
            }
        }
    }

    /// A rank's environment: torchrun's variables and vigil's own.
    fn rank_env(&self, attempt: u32, lr: u32, at: Placement, dir: &Path) -> Vec<(String, String)> {
        let error_file = dir.join("error.json").to_string_lossy().into_owned();
        let slot = RankSlot {
            local_rank: lr,
            group_rank: at.group_rank,
            restart_count: attempt,
            rank_offset: at.rank_offset,
            world_size: at.world_size,
            master_addr: &self.store_for_ranks.0,
            master_port: self.store_for_ranks.1,
            error_file: &error_file,
        };
        let env_of = |k: &str| std::env::var(k).ok();
        let mut env = worker_env(&self.cfg, &slot, &env_of);
        let path = |p: &Path| p.to_string_lossy().into_owned();
        env.push(("VIGIL_RUN_DIR".into(), path(&self.run_dir)));
        env.push(("VIGIL_SOCKET".into(), path(&self.ranks.socket)));
        // The shim refuses to speak another protocol before it connects (docs/protocol.md).
        env.push((
            "VIGIL_PROTOCOL".into(),
            vigil_ipc::PROTOCOL_VERSION.to_string(),
        ));
        env.push(("VIGIL_STACK_FILE".into(), path(&dir.join("stacks.txt"))));
        env.push(self.ranks.containment.env());
        env.extend(self.out.nvrx.rank_env());
        env
    }

    /// Copies a started rank's stdout and stderr to its logs and the console.
    fn start_pumps(
        &mut self,
        lr: u32,
        sp: proc::Spawned,
        logs: Option<(LogFile, LogFile)>,
        io: &AttemptIo,
    ) {
        let (out_log, err_log) = logs.map_or((None, None), |(o, e)| (Some(o), Some(e)));
        let prefix = render_prefix(
            self.cfg.prefix_template.as_deref(),
            &self.cfg.role,
            io.placement.rank_offset + lr,
            lr,
            &io.hostname,
        );
        let console = self.cfg.console[lr as usize];
        self.ranks.readers.push(pump(
            sp.stdout,
            Sink {
                prefix: prefix.clone(),
                console: console.stdout.then_some(ConsoleStream::Stdout),
                file: out_log,
                tail: None,
                dup: io.dups[0].clone(),
            },
        ));
        self.ranks.readers.push(pump(
            sp.stderr,
            Sink {
                prefix,
                console: console.stderr.then_some(ConsoleStream::Stderr),
                file: err_log,
                tail: Some(self.ranks.tails[lr as usize].clone()),
                dup: io.dups[1].clone(),
            },
        ));
    }

    /// Carries out the supervisor's actions; what they lead to (a rank started, a checkpoint
    /// read, stopped ranks found) goes to `queue`, the supervisor's next events.
    pub(super) fn execute(&mut self, actions: Vec<Action>, queue: &mut VecDeque<Event>) {
        for a in actions {
            match a {
                Action::Job(req) => self.request(req),
                Action::SpawnAttempt { attempt, placement } => {
                    self.spawn_attempt(attempt, placement, queue)
                }
                Action::SpawnRank {
                    attempt,
                    local_rank,
                    generation,
                    replaced,
                } => self.respawn_rank(attempt, local_rank, (generation, &replaced), queue),
                Action::SignalGroups { pgids, signal } => {
                    for p in pgids {
                        proc::signal_group(p, signal);
                    }
                }
                Action::ReapGroups { pgids } => self.reap_groups(pgids),
                Action::Record(rec) => {
                    // The next warm process starts once the ranks are back: its imports do not
                    // compete with the recovery.
                    if let Record::GenerationRecovered { attempt, .. } = &rec {
                        self.start_warm(*attempt);
                    }
                    if let Some(text) = self.out.report.line(&rec) {
                        output::console_text(ConsoleStream::Stderr, &text);
                    }
                    let seen = self.out.nvrx.observe(&rec, std::time::SystemTime::now());
                    if let Some(text) = seen.stdout {
                        output::console_text(ConsoleStream::Stdout, &text);
                    }
                    if let Some(note) = seen.note {
                        console_note(&note);
                    }
                    if let Some((at_start, iteration)) = seen.checkpoint {
                        queue.push_back(Event::CheckpointIteration {
                            at_start,
                            iteration,
                        });
                    }
                    self.out.events.write(&rec);
                }
                Action::Finish(o) => self.outcome = Some(o),
                Action::CaptureStacks {
                    local_rank,
                    pid,
                    via_shim,
                } => self.capture_stacks(local_rank, pid, via_shim),
                Action::ProbeStopped { ranks } => {
                    let stopped = ranks
                        .into_iter()
                        .filter(|(_, pid)| matches!(proc::process_state(*pid), Some('T' | 't')))
                        .map(|(lr, _)| lr)
                        .collect();
                    queue.push_back(Event::Probed { stopped });
                }
                Action::SendToRank { local_rank, msg } => self.ranks.shared.send(local_rank, msg),
                Action::SendToAll(msg) => self.ranks.shared.send_all(&msg),
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

    /// A request to the job's coordination, through the checks before a rendezvous when they
    /// are wanted.
    fn request(&mut self, req: JobRequest) {
        match req {
            // Leaving waits until the loop is over (the output drained).
            leave @ JobRequest::Leave { .. } => self.leave = Some(leave),
            JobRequest::Join { attempt, .. } if gate::wanted(&self.cfg.gpu, attempt) => {
                let (nproc, node) = (self.cfg.nproc, self.cfg.node_rank);
                let spares = self.cfg.active_nodes < self.cfg.nnodes;
                gate::start(
                    self.cfg.gpu.clone(),
                    nproc,
                    node,
                    spares,
                    req,
                    self.links.gate_tx.clone(),
                );
            }
            req => {
                let _ = self.links.coord.send(req);
            }
        }
    }

    fn reap_groups(&mut self, pgids: Vec<i32>) {
        for p in &pgids {
            proc::signal_group(*p, libc::SIGKILL);
        }
        self.sweep(self.ranks.shared.attempt.get());
        for p in pgids {
            if let Some(w) = &mut self.ranks.watchdog {
                w.release(p);
            }
        }
    }

    fn capture_stacks(&mut self, local_rank: u32, pid: i32, via_shim: bool) {
        let attempt = self.ranks.shared.attempt.get();
        let dir = self.attempt_dir(attempt, local_rank);
        let wait = self.cfg.stack_wait;
        let tx = self.ranks.stacks_tx.clone();
        tokio::task::spawn_local(async move {
            let report = stacks::capture(pid, &dir, via_shim, wait).await;
            let _ = tx.send((attempt, local_rank, report));
        });
    }

    /// Kills whatever the ranks left running outside their process groups (daemons that called
    /// setsid, double forks) and says so. Called once no rank of the attempt runs, so every child
    /// of the agent but the watchdog is such a leftover.
    pub(super) fn sweep(&mut self, attempt: u32) {
        self.discard_warm();
        let mut spare: Vec<i32> = self.ranks.watchdog.iter().map(Watchdog::pid).collect();
        spare.extend(
            self.ranks
                .helper_pids
                .lock()
                .map(|h| h.clone())
                .unwrap_or_default(),
        );
        let me = std::process::id() as i32;
        let killed = self.ranks.containment.sweep(Some((me, &spare)));
        if killed > 0 {
            console_note(&format!(
                "killed {killed} process(es) the ranks of attempt {attempt} left running outside their process groups"
            ));
            self.out.events.write(&Record::LeftoversKilled {
                attempt,
                count: killed,
            });
        }
    }

    /// `rank_offset`: the global rank of the node's local rank 0 in the attempt.
    pub(super) fn on_stacks(
        &mut self,
        (attempt, local_rank, rank_offset): (u32, u32, u32),
        report: StackReport,
    ) {
        let rank = rank_offset + local_rank;
        console_note(&report::stacks(rank, &report));
        self.out.events.write(&Record::Stacks {
            attempt,
            local_rank,
            rank,
            python_stacks: report.python.clone(),
            proc_stacks: report.proc.clone(),
            innermost: report.innermost.clone(),
        });
        self.ranks.stack_reports.push((attempt, local_rank, report));
    }

    /// Node rank 0: standbys took lost nodes' places.
    pub(super) fn on_promoted(
        &mut self,
        attempt: u32,
        promotions: &[crate::job::spares::Promotion],
    ) {
        for p in promotions {
            let p = Promotion {
                attempt,
                slot: p.slot,
                lost: p.lost,
                standby: p.standby,
            };
            console_note(&report::promotion(&p));
            self.out.events.write(&Record::Promotion {
                attempt,
                slot: p.slot,
                lost: p.lost,
                standby: p.standby,
            });
            self.trail.promotions.push(p);
        }
    }
}

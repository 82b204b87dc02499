//! The allocation's edges on this node: knowing when it ends (flags, Slurm, re-read as it moves)
//! and telling the supervisor when to ask for a stop; and, on node rank 0, the last thing the
//! agent does: the ledger record, and the requeue (`scontrol`) the policy decided.
//!
//! Decisions are elsewhere: the stop itself in `supervise::stopstep`, the lead in
//! `allocation::lead`, the requeue in `allocation::policy`.

use std::sync::mpsc as std_mpsc;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::report::console_note;
use crate::allocation::{endtime, lead, ledger, policy, slurm};
use crate::cli::config::EndSpec;
use crate::cli::config::LaunchConfig;
use crate::job::state;
use crate::supervise::{Event, Outcome, Supervisor};

/// How often Slurm is asked again for the job's end (`scontrol update TimeLimit=` moves it).
const REREAD_EVERY: Duration = Duration::from_secs(60);
/// A Slurm command that takes longer than this is given up.
const SLURM_TIMEOUT: Duration = Duration::from_secs(20);
/// Steps the lead leaves for reaching the stop step (`supervise::AGREEMENT_BUDGET` of steps is
/// what the agreement adds; two more cover a step in flight).
const LEAD_MARGIN_STEPS: u32 = 2;

/// Knows when the allocation ends and when, given the lead, the stop must be asked for.
pub(super) struct EndWatch {
    end: Option<SystemTime>,
    floor: Duration,
    safety_factor: f64,
    /// The lead carried from the job's earlier allocations (their ledger), at least the floor.
    carried: Duration,
    /// The lead last told to the supervisor, and the stop instant told.
    sent: Option<(Option<Instant>, Duration)>,
    slurm_job: Option<String>,
    next_reread: Instant,
    reread: Option<std_mpsc::Receiver<Option<SystemTime>>>,
    /// Pids of Slurm commands in flight: children of the agent that are not a rank's leftovers.
    pub(super) helpers: std::sync::Arc<std::sync::Mutex<Vec<i32>>>,
    /// When the agent started: the allocation it has is from here to `end`.
    started: SystemTime,
    /// Node rank 0 says it when the lead is capped, once.
    tell_cap: bool,
}

impl EndWatch {
    /// Reads the end as the plan says (under Slurm without `SLURM_JOB_END_TIME`, `squeue`, which
    /// is safe here: the loop, which reaps every child, has not started).
    pub(super) fn start(cfg: &LaunchConfig, carried_lead: Option<Duration>) -> EndWatch {
        let plan = &cfg.allocation;
        let now_wall = SystemTime::now();
        let end = match &plan.end {
            EndSpec::At(t) => Some(*t),
            EndSpec::After(d) => now_wall.checked_add(*d),
            // Without Slurm's commands (a container) node rank 0 has said so once (slurm_job).
            EndSpec::Unknown => plan.slurm_job_id.as_deref().filter(|_| super::slurm_job::commands_here()).and_then(|id| {
                match slurm::run_command(&slurm::squeue_end_time(id), SLURM_TIMEOUT)
                    .map_err(|e| e.to_string())
                    .and_then(|out| endtime::parse_squeue_end(&out).map_err(|e| e.to_string()))
                {
                    Ok(t) => t,
                    Err(e) => {
                        console_note(&format!(
                            "cannot learn when the Slurm job ends ({e}); no stop ahead of its time limit unless --end-time or --time-limit is given"
                        ));
                        None
                    }
                }
            }),
        };
        EndWatch {
            end,
            floor: plan.stop_lead,
            safety_factor: cfg.safety_factor,
            carried: carried_lead.unwrap_or_default().max(plan.stop_lead),
            sent: None,
            // Only Slurm's own end moves; an end given by flags is fixed.
            slurm_job: plan.slurm_job_id.clone().filter(|_| !plan.end_from_flags),
            next_reread: Instant::now() + REREAD_EVERY,
            reread: None,
            helpers: Default::default(),
            started: now_wall,
            tell_cap: cfg.node_rank == 0,
        }
    }

    /// When the allocation ends, as far as known.
    pub(super) fn end(&self) -> Option<SystemTime> {
        self.end
    }

    /// The lead now: the carried one, or what this allocation observed, whichever is longer,
    /// capped at half the allocation ([`lead::cap`]).
    pub(super) fn lead(&self, sup: &Supervisor) -> Duration {
        let (lead, _) = self.lead_and_cap(sup);
        lead
    }

    /// The lead, and the uncapped one and the allocation's span when it was capped.
    fn lead_and_cap(&self, sup: &Supervisor) -> (Duration, Option<(Duration, Duration)>) {
        let (ckpt, step) = sup.lead_observed();
        let seen = lead::stop_lead(
            self.floor,
            self.safety_factor,
            ckpt,
            step,
            LEAD_MARGIN_STEPS,
        );
        let lead = seen.max(self.carried);
        let Some(end) = self.end else {
            return (lead, None);
        };
        let span = end.duration_since(self.started).unwrap_or_default();
        match lead::cap(lead, span) {
            Some(capped) => (capped, Some((lead, span))),
            None => (lead, None),
        }
    }

    /// What to tell the supervisor, if anything changed: when to ask for the stop, and the window.
    pub(super) fn tick(&mut self, sup: &Supervisor, job_now: Instant) -> Option<Event> {
        self.poll_reread();
        let end = self.end?;
        let (lead, capped) = self.lead_and_cap(sup);
        if let (Some((full, span)), true) = (capped, self.tell_cap) {
            self.tell_cap = false;
            console_note(&format!(
                "the stop lead of {:.0}s would leave less than half of the allocation ({:.0}s from the agent's start to its end) to train: capped at {:.0}s; give a longer time limit, or a smaller --stop-lead if checkpoints are quicker",
                full.as_secs_f64(),
                span.as_secs_f64(),
                lead.as_secs_f64()
            ));
        }
        let at = lead::when_to_stop(end, lead, SystemTime::now(), job_now);
        // Told again only when it moved by more than a second (wall and monotonic clocks drift).
        let moved = match self.sent {
            Some((Some(prev), prev_lead)) => {
                let d = if at > prev { at - prev } else { prev - at };
                d > Duration::from_secs(1) || prev_lead != lead
            }
            _ => true,
        };
        if !moved {
            return None;
        }
        self.sent = Some((Some(at), lead));
        Some(Event::StopAt {
            at: Some(at),
            window: lead,
        })
    }

    /// Starts a re-read of Slurm's end now and then, on a thread: the command's output is read
    /// there, and its exit status is left to the loop's reaper (which ignores unknown pids).
    pub(super) fn maybe_reread(&mut self) {
        let Some(job) = self.slurm_job.clone() else {
            return;
        };
        if self.reread.is_some() || Instant::now() < self.next_reread {
            return;
        }
        self.next_reread = Instant::now() + REREAD_EVERY;
        let cmd = slurm::squeue_end_time(&job);
        let spawned = std::process::Command::new(&cmd.program)
            .args(&cmd.args)
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn();
        let Ok(mut child) = spawned else {
            return;
        };
        let pid = child.id() as i32;
        self.helpers.lock().map(|mut h| h.push(pid)).ok();
        let helpers = self.helpers.clone();
        let (tx, rx) = std_mpsc::channel();
        self.reread = Some(rx);
        let stdout = child.stdout.take();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut out = String::new();
            let ok = stdout.is_some_and(|mut s| s.read_to_string(&mut out).is_ok());
            let end = ok
                .then(|| endtime::parse_squeue_end(&out).ok().flatten())
                .flatten();
            helpers.lock().map(|mut h| h.retain(|p| *p != pid)).ok();
            let _ = tx.send(end);
        });
        // A squeue that hangs is killed at the bound; its thread then sees end of file. Only one
        // still listed as in flight: a pid that finished may already belong to another process.
        let (bound, listed) = (SLURM_TIMEOUT, self.helpers.clone());
        std::thread::spawn(move || {
            std::thread::sleep(bound);
            if listed.lock().is_ok_and(|h| h.contains(&pid)) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        });
        drop(child);
    }

    fn poll_reread(&mut self) {
        let Some(rx) = &self.reread else {
            return;
        };
        match rx.try_recv() {
            Ok(end) => {
                self.reread = None;
                if let Some(e) = end {
                    if self.end != Some(e) {
                        self.end = Some(e);
                        self.sent = None;
                    }
                }
            }
            Err(std_mpsc::TryRecvError::Empty) => {}
            Err(std_mpsc::TryRecvError::Disconnected) => self.reread = None,
        }
    }
}

/// What node rank 0 knows of the allocation when its agent ends.
pub(super) struct Ending<'a> {
    pub cfg: &'a LaunchConfig,
    pub run_dir: &'a Path,
    pub outcome: &'a Outcome,
    pub sup: &'a Supervisor,
    /// The highest step the other nodes' ranks reported (node rank 0 reads it as they leave).
    pub peers_highest: Option<u64>,
    pub started: SystemTime,
    pub lead: Duration,
    /// Nodes to keep out of the next allocation.
    pub blame: Vec<String>,
    /// Standbys promoted during the allocation (hot spares).
    pub promotions: Vec<ledger::Promotion>,
    /// The number this allocation's record takes, as the ledger stood at the agent's start.
    pub index: u32,
    /// A survivor of node rank 0's loss (the store in the job) records the allocation in its
    /// place: unless a record of it is there already. Node rank 0's own record always goes in,
    /// under the same number, and supersedes a survivor's ([`ledger::of_job`]).
    pub survivor: bool,
}

/// The number the ledger's next record takes for this job, as it stands now.
pub(super) fn next_index(cfg: &LaunchConfig, run_dir: &Path) -> u32 {
    ledger::next_index(&history(cfg, run_dir).0)
}

/// Whether the job's ledger in `dir` already holds allocation `index` of this run (same
/// `SLURM_RESTART_COUNT`): another node concluded it.
fn recorded(cfg: &LaunchConfig, dir: &Path, index: u32) -> bool {
    let Ok((records, _)) = ledger::read(dir) else {
        return false;
    };
    let id = cfg.allocation.identity.as_ref();
    let (mine, _) = ledger::of_job(
        records,
        id.map(|i| i.job_id.as_str()),
        id.and_then(|i| i.cluster.as_deref()),
    );
    let restart_count = restart_count();
    mine.iter()
        .any(|r| r.allocation == index && r.restart_count == restart_count)
}

fn restart_count() -> u32 {
    std::env::var("SLURM_RESTART_COUNT")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The ledger's directory for this job.
pub(super) fn state_dir(cfg: &LaunchConfig, run_dir: &Path) -> PathBuf {
    cfg.allocation
        .state_dir
        .clone()
        .unwrap_or_else(|| run_dir.to_path_buf())
}

/// Makes sure the job's state directory can keep the ledger, before any rank starts (every node:
/// one that cannot is refused on its own, the others must not wait for it), and, on node rank 0
/// in a Slurm job's first allocation, sets aside what another job with the same id left there.
pub fn prepare_state(cfg: &LaunchConfig) -> Result<(), state::Unwritable> {
    let Some(dir) = &cfg.allocation.state_dir else {
        return Ok(());
    };
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    state::check_writable(dir, &format!("{host}-{}", std::process::id()))?;
    let first = cfg
        .allocation
        .identity
        .as_ref()
        .is_some_and(|i| i.first_allocation);
    if cfg.node_rank != 0 || !first {
        return Ok(());
    }
    let mut names = vec![ledger::FILE];
    // Timeouts the user pointed at with --timeouts-file are theirs, not this directory's.
    if cfg.timeouts_file.load.as_deref() == Some(dir.join(state::TIMEOUTS_FILE).as_path()) {
        names.push(state::TIMEOUTS_FILE);
    }
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace(':', "");
    match state::set_aside(dir, &names, &stamp) {
        Ok(None) => Ok(()),
        Ok(Some(to)) => {
            let job =
                cfg.allocation
                    .identity
                    .as_ref()
                    .map_or(String::new(), |i| match &i.cluster {
                        Some(c) => format!("{} of cluster {c}", i.job_id),
                        None => i.job_id.clone(),
                    });
            console_note(&format!(
                "this is the first allocation of Slurm job {job}, but {} already held a job's state: an earlier job with the same id wrote it (ids start again at 1 with a new controller state); moved to {}, nothing of it is used",
                dir.display(),
                to.display()
            ));
            Ok(())
        }
        Err(e) => Err(state::Unwritable {
            dir: dir.clone(),
            why: format!("holds another job's state that cannot be set aside ({e}); move it away"),
        }),
    }
}

/// The ledger's records of this job: none in a first allocation (state there is another job's,
/// and is being set aside), and never another job's (a `--state-dir` shared with it).
pub(super) fn history(cfg: &LaunchConfig, run_dir: &Path) -> (Vec<ledger::Record>, Vec<String>) {
    let id = cfg.allocation.identity.as_ref();
    if id.is_some_and(|i| i.first_allocation) {
        return Default::default();
    }
    let dir = state_dir(cfg, run_dir);
    let (records, mut notes) = match ledger::read(&dir) {
        Ok(r) => r,
        Err(e) => {
            return (
                Vec::new(),
                vec![format!(
                    "cannot read the job's ledger {}: {e}",
                    dir.join(ledger::FILE).display()
                )],
            )
        }
    };
    let (mine, others) = ledger::of_job(
        records,
        id.map(|i| i.job_id.as_str()),
        id.and_then(|i| i.cluster.as_deref()),
    );
    if others > 0 {
        notes.push(format!(
            "{}: {others} record(s) of another job left out (a state directory is one job's)",
            dir.join(ledger::FILE).display()
        ));
    }
    (mine, notes)
}

/// The lead the job's earlier allocations ended with, from its ledger.
pub(super) fn carried_lead(cfg: &LaunchConfig, run_dir: &Path) -> Option<Duration> {
    let (records, _) = history(cfg, run_dir);
    let last = records.last()?.stop_lead_s;
    (last.is_finite() && last > 0.0 && last <= crate::values::MAX_SECONDS)
        .then(|| Duration::from_secs_f64(last))
}

fn ledger_outcome(o: &Outcome) -> ledger::Outcome {
    match o {
        Outcome::Succeeded => ledger::Outcome::Finished,
        Outcome::Stopped { .. } | Outcome::Signaled { .. } | Outcome::PeerStopped { .. } => {
            ledger::Outcome::Stopped
        }
        Outcome::Failed { .. } | Outcome::SpawnFailed { .. } => ledger::Outcome::Failed,
        Outcome::Lost { .. } => ledger::Outcome::Lost,
        Outcome::NoProgress { .. } => ledger::Outcome::NoProgress,
    }
}

/// Whether the allocation is recorded as soon as the ranks are done, before the agent waits for
/// their output and for the other nodes to leave: when it ended for a stop (a signal, the time
/// limit). Slurm SIGKILLs every process of the job `KillWait` after its SIGTERM, and a record
/// written after those waits is lost. After an agreed stop every rank is at the stop step, so
/// the other nodes' highest step, which they leave in the store on leaving, adds nothing.
pub(super) fn record_before_leaving(o: &Outcome) -> bool {
    matches!(o, Outcome::Stopped { .. } | Outcome::Signaled { .. })
}

/// Node rank 0's last act: decide what happens after this allocation, record it in the ledger,
/// requeue under Slurm. Returns the agent's exit status.
pub(super) fn conclude(e: Ending) -> i32 {
    let cfg = e.cfg;
    let dir = state_dir(cfg, e.run_dir);
    // Node rank 0 and the survivors of its loss may conclude the same allocation: one at a time,
    // and the first records it (a lock that cannot be taken leaves the old behaviour).
    let _lock = ledger::lock(&dir).ok();
    let already = recorded(cfg, &dir, e.index);
    if already && e.survivor {
        console_note(&format!(
            "allocation {} is already in the job's ledger ({}): another node recorded it",
            e.index,
            dir.display()
        ));
        return e.outcome.exit_code();
    }
    let (history, notes) = history(cfg, e.run_dir);
    for n in notes {
        console_note(&n);
    }
    let history = before(history, e.index);
    let slurm_job = cfg.allocation.slurm_job_id.clone();
    let info = slurm_job
        .as_deref()
        .filter(|_| super::slurm_job::commands_here())
        .and_then(|id| {
            slurm::run_command(&slurm::show_job(id), SLURM_TIMEOUT)
                .ok()
                .and_then(|out| slurm::parse_show_job(&out).ok())
        });
    let facts = facts(&e, info.as_ref());
    let verdict = policy::decide(&facts, &history, &cfg.allocation.limits);
    let mut rec = ledger_record(&e, &facts, &verdict, &history, info.as_ref());
    if already {
        // A survivor recorded this allocation as lost with node rank 0: this record is the
        // true one, and supersedes it.
        rec.allocation = e.index;
    }
    let mut verdict = verdict;
    let write = |dir: &Path| match already {
        true => ledger::supersede(dir, &rec),
        false => ledger::append(dir, &rec),
    };
    if let Err(err) = std::fs::create_dir_all(&dir).and_then(|_| write(&dir)) {
        console_note(&format!(
            "cannot write the job's ledger in {} ({err}); this allocation is not recorded",
            dir.display()
        ));
        if facts.counted {
            // A requeue nobody counted could repeat forever (a disk that stays full).
            verdict = policy::unrecorded(verdict, facts.status, &dir.display().to_string());
        }
    }
    let why = verdict.decision.why().to_string();
    match (&verdict.decision, slurm_job.as_deref()) {
        (policy::Decision::Requeue { .. }, Some(id)) => super::slurm_job::requeue(
            id,
            &why,
            &rec.excluded,
            info.as_ref(),
            facts.requeued_by_slurm,
        ),
        (policy::Decision::Requeue { .. }, None) => {
            console_note(&requeue_by_hand(&why, verdict.exit_status))
        }
        (policy::Decision::Finished { .. }, _) => {}
        _ => console_note(&format!("not requeued: {why}")),
    }
    verdict.exit_status
}

/// Slurm SIGKILLs every process of the job `KillWait` after its SIGTERM however far the ranks
/// got, and a rank's exit after its save (torch's interpreter shutdown, a loaded node) can take
/// longer than that (5 s on some clusters): node rank 0 records the allocation as stopped as
/// soon as the stop is agreed. It does not ask Slurm here (the agent's loop must not wait on
/// `scontrol`); its record at the end, when it gets there, supersedes this one under the same
/// number ([`ledger::of_job`]).
pub(super) fn record_agreed_stop(e: Ending) {
    let dir = state_dir(e.cfg, e.run_dir);
    let _lock = ledger::lock(&dir).ok();
    if recorded(e.cfg, &dir, e.index) {
        return;
    }
    let history = before(history(e.cfg, e.run_dir).0, e.index);
    let facts = facts(&e, None);
    let verdict = policy::decide(&facts, &history, &e.cfg.allocation.limits);
    let mut rec = ledger_record(&e, &facts, &verdict, &history, None);
    rec.allocation = e.index;
    if let Err(err) = std::fs::create_dir_all(&dir).and_then(|_| ledger::append(&dir, &rec)) {
        console_note(&format!(
            "cannot write the job's ledger in {} ({err}) when the stop was agreed; the allocation is recorded at its end if the agent gets there",
            dir.display()
        ));
    }
}

/// The job's earlier allocations: `history` without a record of allocation `index` itself (one
/// written when its stop was agreed, or by a survivor of node rank 0's loss), which this
/// allocation's own decision must not count as an earlier one.
fn before(history: Vec<ledger::Record>, index: u32) -> Vec<ledger::Record> {
    let restart_count = restart_count();
    history
        .into_iter()
        .filter(|r| !(r.allocation == index && r.restart_count == restart_count))
        .collect()
}

/// The trigger of a stop, and the step it stopped at.
fn stop_of(o: &Outcome) -> (Option<String>, Option<u64>) {
    match o {
        Outcome::Stopped { trigger, step } => (Some(trigger.clone()), *step),
        Outcome::Signaled { signal } => (Some(crate::values::signal_name(*signal)), None),
        _ => (None, None),
    }
}

/// What the requeue policy decides from.
fn facts(e: &Ending, info: Option<&slurm::JobInfo>) -> policy::Facts {
    policy::Facts {
        outcome: ledger_outcome(e.outcome),
        status: e.outcome.exit_code(),
        marked_finished: e.sup.training_finished(),
        highest_step: e.sup.highest_step().max(e.peers_highest),
        stop_trigger: stop_of(e.outcome).0,
        blame: e.blame.clone(),
        requeue_allowed: info.and_then(|i| i.requeue),
        counted: e.cfg.allocation.state_dir.is_some(),
        cancelled: info.is_some_and(slurm::ending_early),
        requeued_by_slurm: info.is_some_and(|i| slurm::requeued_by_slurm(i, restart_count())),
        interrupted: matches!(e.outcome, Outcome::Signaled { signal } if !crate::supervise::is_stop_signal(*signal)),
        shutdown_asked: e.sup.shutdown_asked(),
        keeps_status: matches!(
            e.outcome,
            Outcome::Signaled { .. } | Outcome::PeerStopped { .. }
        ),
    }
}

/// This allocation's line in the job's ledger.
fn ledger_record(
    e: &Ending,
    facts: &policy::Facts,
    verdict: &policy::Verdict,
    history: &[ledger::Record],
    info: Option<&slurm::JobInfo>,
) -> ledger::Record {
    let cfg = e.cfg;
    // Without Slurm's word (a stop's early record), the nodes Slurm gave the job step.
    let listed = || {
        std::env::var("SLURM_JOB_NODELIST")
            .ok()
            .and_then(|l| vigil_slurm::hostlist::expand(&l).ok())
            .filter(|n| !n.is_empty())
    };
    let nodes = info
        .map(|i| i.nodes.clone())
        .filter(|n| !n.is_empty())
        .or_else(listed)
        .unwrap_or_else(|| {
            vec![nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default()]
        });
    let identity = cfg.allocation.identity.as_ref();
    ledger::Record {
        format: ledger::FORMAT,
        allocation: ledger::next_index(history),
        job_id: cfg.job_id.clone(),
        cluster: identity.and_then(|i| i.cluster.clone()),
        restart_count: restart_count(),
        nodes,
        start: unix(e.started),
        end: unix(SystemTime::now()),
        outcome: facts.outcome,
        highest_step: facts.highest_step,
        restarts: e.sup.attempt(),
        stop_step: stop_of(e.outcome).1,
        stop_trigger: facts.stop_trigger.clone(),
        decision: verdict.decision.kind(),
        why: verdict.decision.why().to_string(),
        excluded: super::slurm_job::exclusions(cfg, &verdict.decision, info),
        stop_lead_s: e.lead.as_secs_f64(),
        exit_status: verdict.exit_status,
        promotions: e.promotions.clone(),
        submit_time: info.and_then(|i| i.submit_time).map(unix),
        slurm_start: info.and_then(|i| i.start_time).map(unix),
    }
}

/// What to do when no Slurm job requeues itself. 75 says "run again" by itself; a status kept
/// from a signal (143 after a forwarded SIGTERM, as torchrun's) says it to no wrapper, so the
/// line must not read as if the status were the request.
fn requeue_by_hand(why: &str, status: i32) -> String {
    if status == crate::exit::REQUEUE {
        format!("run the job again to go on (exit status {status}): {why}")
    } else {
        format!(
            "{why}: the job can go on from its checkpoint if it is run again; its exit status is {status} (the signal's, as torchrun's), not {}, so a script that reruns on {} will not",
            crate::exit::REQUEUE,
            crate::exit::REQUEUE
        )
    }
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_is_recorded_before_the_wait_for_output_and_peers_other_ends_after() {
        let stopped = Outcome::Stopped {
            trigger: "SIGTERM".into(),
            step: Some(562),
        };
        assert!(record_before_leaving(&stopped));
        assert!(record_before_leaving(&Outcome::Signaled { signal: 15 }));
        // These need what the others leave behind (their highest step, the failed ranks).
        let lost = Outcome::Lost {
            reason: "node 1".into(),
            requeue: true,
        };
        for o in [Outcome::Succeeded, Outcome::Failed { restarts: 3 }, lost] {
            assert!(!record_before_leaving(&o), "{o:?}");
        }
    }
}

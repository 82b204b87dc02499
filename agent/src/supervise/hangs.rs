//! Hang verdicts: which rank is hung first, asking the runtime which ranks are stopped, naming the
//! root cause, and the diagnosis (stacks) before the stop.
//!
//! `HangWatch` (`machines.rs`) is the attempt's hang state machine: watching, then probing (the runtime looks
//! which ranks are stopped), then diagnosing one rank (its stacks are taken), then concluding (the
//! rank is terminated and the attempt stops). Once a hang was seen, nothing more is calculated in
//! the attempt. The functions below pick the ranks from the parts they are given (the attempt,
//! the timeouts in force) and turn each step into actions; [`HangParts`] carries a verdict's
//! steps (probe, the runtime's answer, the job's ask and verdict) on only those parts. The
//! supervisor's methods hand it the parts, and stop the attempt when a hang is concluded
//! (`conclude_hang`, which needs the rest: an in-process replacement, the stop, the verdict).

use std::time::{Duration, Instant};

use super::events::{
    Action, Failure, Hang, HangCandidate, HungRank, JobRequest, Placement, Record, StopReason,
    SupervisorConfig, SIGTERM,
};
use super::machines::JobVerdict;
use super::monitor::{Due, RankMonitor, Timeouts};
use super::phase::{Phase, RankState};
use super::state::{Attempt, HangStep, Rank};
use super::{inprocess, Supervisor};

/// How long a node waits for the job's hang verdict before it decides alone.
const JOB_VERDICT_WAIT: Duration = Duration::from_secs(10);

/// The running rank of `attempt` that will be hung first under the timeouts `in_force`, and when.
pub(super) fn earliest_hang(
    current: &Attempt,
    in_force: &Timeouts,
    warmup_steps: u32,
) -> Option<(u32, Due)> {
    current
        .ranks
        .iter()
        .enumerate()
        .filter(|(_, r)| r.running())
        .filter_map(|(i, r)| {
            r.monitor
                .as_ref()?
                .deadline(in_force, warmup_steps)
                .map(|d| (i as u32, d))
        })
        .min_by_key(|(_, d)| d.at)
}

/// What [`choose_hung`] weighs of a candidate besides when its silence began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HangKey {
    /// Its process is stopped (or its node named it hung already): a definite culprit.
    pub stopped: bool,
    /// Its main thread is known to wait inside torch's collective machinery.
    pub waiting: bool,
    /// The last step it reported.
    pub step: Option<u64>,
    /// The global rank.
    pub rank: u32,
}

/// The rank to name hung among `candidates`, each given with when its silence began as a number
/// comparable within the call (milliseconds: of wall time job-wide, of the node's clock locally).
/// A stopped rank is a definite culprit. Else a rank whose main thread is not waiting in a
/// collective comes before ranks known to wait in one: they wait for it (a rank whose place is
/// unknown counts as not waiting). Then the rank that is behind: the lowest step (none below
/// any). Among ranks at the same step, the one whose silence began last: ranks that reached a
/// collective first wait there, silent, for the late one, which is the one stuck (it went silent
/// after them, or it would have reached the collective too). Ties go to the lowest rank.
pub fn choose_hung<T>(candidates: &[(T, u64)], key: impl Fn(&T) -> HangKey) -> Option<&T> {
    candidates
        .iter()
        .min_by_key(|(c, since)| {
            let k = key(c);
            (
                !k.stopped,
                k.waiting,
                k.step,
                std::cmp::Reverse(*since),
                k.rank,
            )
        })
        .map(|(c, _)| c)
}

/// The key of a candidate as a node sees it.
fn key_of(c: &HangCandidate) -> HangKey {
    HangKey {
        stopped: c.stopped,
        waiting: c.waiting == Some(true),
        step: c.step,
        rank: c.rank,
    }
}

/// The running ranks of `current` that may be the hung one at `now`: a stopped one (or one that
/// raised an uncaught exception and has not exited: counted as stopped), or one whose
/// own timeout has run at least three quarters of its length. A rank that spoke again well after
/// the others went silent (a heartbeat half a timeout later) is not one: it was still going while
/// they were stuck. `probed`: the stopped ranks, and where the main threads of those asked are.
pub(super) fn hang_candidates(
    current: &Attempt,
    in_force: &Timeouts,
    warmup_steps: u32,
    rank_offset: u32,
    (stopped, waiting): (&[u32], &[(u32, bool)]),
    now: Instant,
) -> Vec<(HangCandidate, Due)> {
    current
        .ranks
        .iter()
        .enumerate()
        .filter(|(_, r)| r.running())
        .filter_map(|(i, r)| {
            let lr = i as u32;
            let m = r.monitor.as_ref()?;
            let due = m.deadline(in_force, warmup_steps)?;
            let is_stopped = definite(r, lr, stopped);
            let long = now.saturating_duration_since(due.since) * 4 >= due.limit * 3;
            (is_stopped || long).then(|| {
                let c = HangCandidate {
                    local_rank: lr,
                    rank: rank_offset + lr,
                    pid: r.pid?,
                    step: r.pace.map(|p| p.step),
                    section: m.section_name().map(str::to_string),
                    // Not its timeout's start: a heartbeat timeout runs from the heartbeat
                    // before the section that the stuck rank opened after the others did.
                    since: m.last_heard(),
                    stopped: is_stopped,
                    waiting: waiting.iter().find(|(w, _)| *w == lr).map(|(_, w)| *w),
                };
                Some((c, due))
            })?
        })
        .collect()
}

/// A rank that failed in the attempt, as a candidate for the job's hang verdict: a definite one.
fn failed_candidate(f: &Failure) -> HangCandidate {
    HangCandidate {
        local_rank: f.local_rank,
        rank: f.rank,
        pid: f.pid,
        step: None,
        section: None,
        since: f.at,
        stopped: true,
        waiting: None,
    }
}

/// The local rule: the rank of `candidates` to name hung ([`choose_hung`] on this node's clock).
pub(super) fn choose_local(candidates: &[(HangCandidate, Due)]) -> Option<&(HangCandidate, Due)> {
    let base = candidates.iter().map(|(c, _)| c.since).min()?;
    let keyed: Vec<(&(HangCandidate, Due), u64)> = candidates
        .iter()
        .map(|cd| (cd, cd.0.since.duration_since(base).as_millis() as u64))
        .collect();
    choose_hung(&keyed, |(c, _)| key_of(c)).copied()
}

/// The rank to declare hung when `due_rank`'s timeout ran out: a running rank whose process
/// is stopped, if any; else the one [`choose_local`] names among this node's candidates, since
/// ranks waiting on a stuck one (in a barrier, a collective) go silent too and may run out first.
/// Returns the rank, its own timeout if it has one (else `due`'s), and whether it is stopped.
pub(super) fn root_of_hang(
    current: &Attempt,
    (in_force, warmup_steps): (&Timeouts, u32),
    (due_rank, due): (u32, Due),
    (stopped, waiting): (&[u32], &[(u32, bool)]),
    now: Instant,
) -> (u32, Due, bool) {
    if stopped.contains(&due_rank) {
        return (due_rank, due, true);
    }
    let probed = (stopped, waiting);
    let candidates = hang_candidates(current, in_force, warmup_steps, 0, probed, now);
    // A stopped rank (or one that raised) without a timeout of its own is still the culprit.
    let unwatched = definite_running(current, stopped);
    match (choose_local(&candidates), unwatched) {
        (Some((c, own)), _) if c.stopped => {
            (c.local_rank, own.clone(), stopped.contains(&c.local_rank))
        }
        (_, Some(lr)) => (lr, due, stopped.contains(&lr)),
        (Some((c, own)), None) => (c.local_rank, own.clone(), false),
        (None, None) => (due_rank, due, false),
    }
}

/// Whether local rank `lr` is a definite culprit: its process is one of `stopped`, or it raised
/// an uncaught exception and has not exited (it is on its way out).
fn definite(r: &Rank, lr: u32, stopped: &[u32]) -> bool {
    stopped.contains(&lr) || r.raised.is_some()
}

/// The first running rank of `current` that is a definite culprit ([`definite`]).
fn definite_running(current: &Attempt, stopped: &[u32]) -> Option<u32> {
    let ranks = current.ranks.iter().enumerate();
    ranks
        .filter(|(lr, r)| r.running() && definite(r, *lr as u32, stopped))
        .map(|(lr, _)| lr as u32)
        .next()
}

/// Declares `local_rank` of attempt `attempt` hung (`due`: its timeout; `stopped`: its process is):
/// every rank's watch freezes, the record, and its stacks are taken, for `stack_wait` at most.
pub(super) fn begin_diagnosis(
    current: &mut Attempt,
    (attempt, rank_offset): (u32, u32),
    stack_wait: Duration,
    now: Instant,
    (local_rank, due, stopped): (u32, Due, bool),
    out: &mut Vec<Action>,
) {
    let Some(pid) = current.ranks[local_rank as usize].pid else {
        return;
    };
    for m in current.ranks.iter_mut().filter_map(|r| r.monitor.as_mut()) {
        m.freeze();
    }
    let hang = Hang {
        timeout: due.kind.clone(),
        limit_ms: due.limit.as_millis() as u64,
        silent_ms: now.saturating_duration_since(due.since).as_millis() as u64,
        stopped,
        raised: current.ranks[local_rank as usize].raised.clone(),
    };
    out.push(Action::Record(Record::Hang {
        attempt,
        local_rank,
        rank: rank_offset + local_rank,
        pid,
        hang: hang.clone(),
    }));
    out.push(Action::CaptureStacks {
        local_rank,
        pid,
        via_shim: current.ranks[local_rank as usize]
            .monitor
            .as_ref()
            .is_some_and(RankMonitor::registered),
    });
    let r = &current.ranks[local_rank as usize];
    current.hangs.named = Some(HangCandidate {
        local_rank,
        rank: rank_offset + local_rank,
        pid,
        step: r.pace.map(|p| p.step),
        section: r
            .monitor
            .as_ref()
            .and_then(|m| m.section_name())
            .map(str::to_string),
        since: r
            .monitor
            .as_ref()
            .map_or(due.since, RankMonitor::last_heard),
        stopped: true,
        waiting: None,
    });
    current.hangs.begin(local_rank, hang, now + stack_wait);
}

/// The parts of the supervisor a hang verdict reads and changes: the launch's configuration,
/// the attempt under way (its number, where its ranks stand in the job, whether they run), the
/// timeouts in force, and the attempt's state (its ranks and `HangWatch`). Stopping the attempt
/// once a hang is concluded is not among them: that needs the rest (`Supervisor::conclude_hang`).
pub(super) struct HangParts<'a> {
    pub cfg: &'a SupervisorConfig,
    pub attempt: u32,
    pub placement: Placement,
    /// The attempt's ranks run (`Phase::Running`).
    pub running: bool,
    pub in_force: &'a Timeouts,
    pub current: &'a mut Attempt,
}

impl Supervisor {
    /// The parts a hang verdict works on.
    pub(super) fn hang_parts(&mut self) -> HangParts<'_> {
        HangParts {
            cfg: &self.cfg,
            attempt: self.attempt,
            placement: self.job.placement,
            running: self.phase == Phase::Running,
            in_force: &self.timeouts.in_force,
            current: &mut self.current,
        }
    }

    /// The running rank that will be hung first, and when.
    pub(super) fn earliest_hang(&self) -> Option<(u32, Due)> {
        earliest_hang(
            &self.current,
            &self.timeouts.in_force,
            self.cfg.warmup_steps,
        )
    }

    pub(super) fn on_stacks_captured(
        &mut self,
        now: Instant,
        local_rank: u32,
        out: &mut Vec<Action>,
    ) {
        if self.current.hangs.diagnosing(local_rank) {
            self.conclude_hang(now, out);
        }
    }

    /// A tick while ranks run: a diagnosis whose wait is over ends; a hang that is due (or a
    /// job verdict that did not come in time) makes the runtime look which ranks are stopped
    /// before anything is declared.
    pub(super) fn hang_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        match self.hang_parts().tick(now) {
            HangStep::Conclude => self.conclude_hang(now, out),
            HangStep::Probe => self.hang_parts().probe(now, out),
            HangStep::Nothing => {}
        }
    }

    /// The hung rank's stacks are taken (or the wait is over): terminate it and stop the attempt.
    /// A method of the whole: it may replace the rank in-process (the generations), else it stops
    /// the attempt (the phase) and reports the failure for the job's verdict.
    pub(super) fn conclude_hang(&mut self, now: Instant, out: &mut Vec<Action>) {
        let Some((local_rank, hang)) = self.current.hangs.conclude() else {
            return;
        };
        let r = &self.current.ranks[local_rank as usize];
        let (Some(pid), RankState::Running) = (r.pid, r.state) else {
            return;
        };
        if self.may_replace(local_rank, out) {
            // Its exit replaces it (`replace`).
            return inprocess::kill_for_replacement(pid, out);
        }
        let rank = self.job.placement.rank_offset + local_rank;
        self.current.failures.push(Failure {
            attempt: self.attempt,
            local_rank,
            rank,
            pid,
            how: None,
            hang: Some(hang.clone()),
            at: now,
        });
        let term = self.cfg.termination_signal;
        self.begin_stop_except(now, StopReason::RankHung, SIGTERM, Some((pid, term)), out);
        self.report_failure(hang.reason(rank), out);
    }
}

impl HangParts<'_> {
    /// The running rank that will be hung first, and when.
    fn earliest(&self) -> Option<(u32, Due)> {
        earliest_hang(self.current, self.in_force, self.cfg.warmup_steps)
    }

    /// What a tick at `now` means for the attempt's hang watch.
    fn tick(&mut self, now: Instant) -> HangStep {
        let due = self.earliest().map(|(_, d)| d.at);
        self.current.hangs.tick(now, due)
    }

    /// Asks the runtime which ranks are stopped, and where the main thread is of each registered
    /// rank that may be the hung one: only those, since the signal that asks (SIGUSR2, for
    /// faulthandler) interrupts what a rank that is still going is doing (a write to its output
    /// cut short).
    fn probe(&self, now: Instant, out: &mut Vec<Action>) {
        let running = || {
            let ranks = self.current.ranks.iter().enumerate();
            ranks.filter(|(_, r)| r.running() && r.pid.is_some())
        };
        let ranks = running().filter_map(|(i, r)| Some((i as u32, r.pid?)));
        let (in_force, warmup) = (self.in_force, self.cfg.warmup_steps);
        let silent = |r: &super::state::Rank| {
            r.monitor.as_ref().is_some_and(|m| {
                m.registered()
                    && m.deadline(in_force, warmup)
                        .is_some_and(|d| now.saturating_duration_since(d.since) * 4 >= d.limit * 3)
            })
        };
        let ask_where = running().filter(|(_, r)| silent(r));
        out.push(Action::ProbeStopped {
            ranks: ranks.collect(),
            ask_where: ask_where.map(|(i, _)| i as u32).collect(),
        });
    }

    /// The job has other nodes than this one.
    fn multi_node(&self) -> bool {
        self.placement.world_size != self.cfg.nproc
    }

    /// Whether a hang here waits for the job's verdict: several nodes, and no verdict that
    /// failed to come.
    fn job_wide(&self) -> bool {
        self.multi_node() && !self.current.hangs.alone()
    }

    /// Declares `hung` (local rank, its timeout, whether stopped) hung and takes its stacks.
    fn diagnose(&mut self, now: Instant, hung: (u32, Due, bool), out: &mut Vec<Action>) {
        let at = (self.attempt, self.placement.rank_offset);
        begin_diagnosis(self.current, at, self.cfg.stack_wait, now, hung, out);
    }

    /// The runtime's answer to `probe`: which ranks are `stopped`, and which of those asked
    /// wait in a collective.
    pub(super) fn on_probed(
        &mut self,
        now: Instant,
        (stopped, waiting): (Vec<u32>, Vec<(u32, bool)>),
        out: &mut Vec<Action>,
    ) {
        if !self.current.hangs.probed() || !self.running {
            return;
        }
        let (in_force, warmup) = (self.in_force, self.cfg.warmup_steps);
        let offset = self.placement.rank_offset;
        let probed = (&stopped[..], &waiting[..]);
        let candidates = hang_candidates(self.current, in_force, warmup, offset, probed, now);
        // A stopped rank is a definite culprit: named at once, on any number of nodes.
        if let Some((c, own)) = choose_local(&candidates).filter(|(c, _)| c.stopped) {
            let hung = (c.local_rank, own.clone(), stopped.contains(&c.local_rank));
            let report = candidates.iter().map(|(c, _)| c.clone()).collect();
            self.diagnose(now, hung, out);
            return self.report_candidates(now, report, out);
        }
        // Still due? A message may have come in while the runtime looked.
        let due = self.earliest().filter(|(_, d)| now >= d.at);
        // A stopped rank (or one that raised) that sends nothing (no timeout of its own) is
        // named by the local rule.
        let unwatched = definite_running(self.current, &stopped).is_some();
        if !self.job_wide() || unwatched {
            if let Some(due) = due {
                let hung = root_of_hang(self.current, (in_force, warmup), due, probed, now);
                self.diagnose(now, hung, out);
            }
            return;
        }
        // Several nodes: the rank the others wait for may be on another node.
        if due.is_some() || matches!(self.current.hangs.job, JobVerdict::Asked { .. }) {
            let report = candidates.into_iter().map(|(c, _)| c).collect();
            self.report_candidates(now, report, out);
        }
    }

    /// Hands this node's candidates to the job's verdict under way (or asks for one).
    fn report_candidates(
        &mut self,
        now: Instant,
        candidates: Vec<HangCandidate>,
        out: &mut Vec<Action>,
    ) {
        if !self.multi_node() {
            return;
        }
        if let Some(round) = self.current.hangs.report(now + JOB_VERDICT_WAIT) {
            out.push(Action::Job(JobRequest::HangReport {
                attempt: self.attempt,
                round,
                candidates,
            }));
        }
    }

    /// Another node (or this one) asks for the job's hang verdict `round`: this node probes its
    /// ranks and reports. A node that already named a rank hung reports that one (as definite
    /// as a stopped one), even once it is gone or replaced; one whose ranks do not run reports
    /// the ranks that failed, if any: the verdict is not held up, and no other node names a rank
    /// that only waited for one of them.
    pub(super) fn on_hang_asked(
        &mut self,
        now: Instant,
        attempt: u32,
        round: u32,
        out: &mut Vec<Action>,
    ) {
        if attempt != self.attempt || !self.current.hangs.open(round) {
            return;
        }
        let until = now + JOB_VERDICT_WAIT;
        let running = self.running && self.current.ranks.iter().any(|r| r.running());
        let definite: Vec<HangCandidate> = match &self.current.hangs.named {
            Some(c) => vec![c.clone()],
            None if !running => self.current.failures.iter().map(failed_candidate).collect(),
            None => Vec::new(),
        };
        let probe = self.current.hangs.asked(round, until);
        if definite.is_empty() && running {
            if probe {
                self.probe(now, out);
            }
            return;
        }
        if probe {
            // Nothing to probe for: the answer is known.
            self.current.hangs.probed();
        }
        self.report_candidates(now, definite, out);
    }

    /// The job's hang verdict `round`: the named rank's node declares it hung; the others wait
    /// for that node's stop or generation (and decide alone if neither comes).
    pub(super) fn on_hang_named(
        &mut self,
        now: Instant,
        attempt: u32,
        round: u32,
        hung: Option<HungRank>,
        out: &mut Vec<Action>,
    ) {
        if attempt != self.attempt || !self.current.hangs.named(round) || !self.running {
            return;
        }
        let Some(h) = hung else {
            self.current.hangs.job = JobVerdict::Alone;
            return;
        };
        let offset = self.placement.rank_offset;
        let local = h.rank.checked_sub(offset).filter(|lr| *lr < self.cfg.nproc);
        let Some(lr) = local else {
            let cfg = self.cfg;
            let until = now + JOB_VERDICT_WAIT + cfg.stack_wait + cfg.workers_stop_timeout;
            self.current.hangs.job = JobVerdict::Elsewhere { until };
            return;
        };
        if self
            .current
            .hangs
            .named
            .as_ref()
            .is_some_and(|c| c.pid == h.pid)
        {
            // Named here already: stopped or replaced.
            return;
        }
        let r = &self.current.ranks[lr as usize];
        let own = r
            .monitor
            .as_ref()
            .and_then(|m| m.deadline(self.in_force, self.cfg.warmup_steps));
        match own {
            Some(own) if r.running() && r.pid == Some(h.pid) => {
                // A rank that raised is named as a stopped one is, but its process runs on.
                let hung = (lr, own, h.stopped && r.raised.is_none());
                self.diagnose(now, hung, out)
            }
            _ => self.current.hangs.job = JobVerdict::Alone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{choose_hung, HangKey};

    /// (rank, stopped, step).
    type Rank = (u32, bool, Option<u64>);

    /// The rank picked among ranks, each with when its silence began (none waits in a collective).
    fn pick(c: &[(Rank, u64)]) -> Option<u32> {
        let key = |(rank, stopped, step): &Rank| HangKey {
            stopped: *stopped,
            waiting: false,
            step: *step,
            rank: *rank,
        };
        choose_hung(c, key).map(|c| c.0)
    }

    #[test]
    fn a_rank_not_waiting_in_a_collective_comes_before_the_step_and_silence_rules() {
        // (rank, stopped, waiting, step)
        type Waits = (u32, bool, bool, u64);
        let key = |&(rank, stopped, waiting, step): &Waits| HangKey {
            stopped,
            waiting,
            step: Some(step),
            rank,
        };
        let pick = |c: &[(Waits, u64)]| choose_hung(c, key).map(|c| c.0);
        // Rank 3 sleeps outside any collective; ranks 0-2 wait, behind or silent later.
        let c = [
            ((0, false, true, 4), 10),
            ((1, false, true, 5), 30),
            ((3, false, false, 5), 0),
        ];
        assert_eq!(pick(&c), Some(3));
        // A stopped rank still comes first, waiting or not.
        let c = [((0, true, true, 5), 0), ((3, false, false, 5), 10)];
        assert_eq!(pick(&c), Some(0));
        // Among ranks that all wait (or none do), today's rules.
        let c = [((0, false, true, 5), 10), ((1, false, true, 5), 30)];
        assert_eq!(pick(&c), Some(1));
    }

    #[test]
    fn a_stopped_rank_comes_first() {
        let c = [((0, false, Some(3)), 10), ((1, true, Some(9)), 0)];
        assert_eq!(pick(&c), Some(1));
    }

    #[test]
    fn the_rank_behind_comes_next_and_no_step_is_behind_any() {
        let c = [((0, false, Some(5)), 10), ((1, false, Some(4)), 0)];
        assert_eq!(pick(&c), Some(1));
        let c = [((0, false, Some(0)), 10), ((1, false, None), 0)];
        assert_eq!(pick(&c), Some(1));
    }

    #[test]
    fn at_the_same_step_the_silence_that_began_last_then_the_lowest_rank() {
        let c = [
            ((0, false, Some(5)), 10),
            ((3, false, Some(5)), 30),
            ((2, false, Some(5)), 20),
        ];
        assert_eq!(pick(&c), Some(3));
        let c = [((4, false, Some(5)), 30), ((3, false, Some(5)), 30)];
        assert_eq!(pick(&c), Some(3));
        assert_eq!(pick(&[]), None);
    }
}

/// The hang verdict's steps on only their parts: no supervisor around them.
#[cfg(test)]
mod parts_tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    /// Two running ranks (pids 100, 101) started at `t0`, unregistered, under an initial
    /// timeout of `T`.
    fn running(t0: Instant) -> Attempt {
        let mut current = Attempt::start(t0, 2);
        for (i, r) in current.ranks.iter_mut().enumerate() {
            r.state = RankState::Running;
            r.pid = Some(100 + i as i32);
            r.monitor = Some(RankMonitor::new(t0));
        }
        current
    }

    fn in_force() -> Timeouts {
        Timeouts {
            initial: Some(T),
            ..Timeouts::default()
        }
    }

    /// This node's two ranks in a job of `world_size` ranks.
    fn parts<'a>(
        cfg: &'a SupervisorConfig,
        in_force: &'a Timeouts,
        current: &'a mut Attempt,
        world_size: u32,
    ) -> HangParts<'a> {
        HangParts {
            cfg,
            attempt: 0,
            placement: Placement {
                group_rank: 0,
                rank_offset: 0,
                world_size,
            },
            running: true,
            in_force,
            current,
        }
    }

    fn reports(out: &[Action]) -> Vec<(u32, Vec<u32>)> {
        let report = |a: &Action| match a {
            Action::Job(JobRequest::HangReport {
                round, candidates, ..
            }) => Some((*round, candidates.iter().map(|c| c.rank).collect())),
            _ => None,
        };
        out.iter().filter_map(report).collect()
    }

    fn declared(out: &[Action]) -> Vec<(u32, bool)> {
        let hang = |a: &Action| match a {
            Action::Record(Record::Hang {
                local_rank, hang, ..
            }) => Some((*local_rank, hang.stopped)),
            _ => None,
        };
        out.iter().filter_map(hang).collect()
    }

    #[test]
    fn asked_for_the_job_s_verdict_a_node_probes_reports_and_waits_for_a_rank_elsewhere() {
        let (t0, cfg, in_force) = (Instant::now(), SupervisorConfig::basic(2, 0), in_force());
        let mut current = running(t0);
        let mut p = parts(&cfg, &in_force, &mut current, 4);
        let now = t0 + T * 9 / 10;
        let mut out = Vec::new();
        p.on_hang_asked(now, 0, 0, &mut out);
        let probe = Action::ProbeStopped {
            ranks: vec![(0, 100), (1, 101)],
            ask_where: vec![],
        };
        assert_eq!(
            out,
            [probe],
            "unregistered ranks are not asked where they are"
        );
        out.clear();
        p.on_probed(now, (vec![], vec![]), &mut out);
        assert_eq!(reports(&out), [(0, vec![0, 1])], "both silent long enough");
        assert!(declared(&out).is_empty(), "none is due yet, nor stopped");
        out.clear();
        let elsewhere = HungRank {
            rank: 3,
            pid: 999,
            stopped: false,
        };
        p.on_hang_named(now, 0, 0, Some(elsewhere), &mut out);
        assert!(out.is_empty());
        let until = now + JOB_VERDICT_WAIT + cfg.stack_wait + cfg.workers_stop_timeout;
        assert_eq!(p.current.hangs.job, JobVerdict::Elsewhere { until });
    }

    #[test]
    fn a_stopped_rank_is_declared_at_once_and_reported_to_the_job() {
        let (t0, cfg, in_force) = (Instant::now(), SupervisorConfig::basic(2, 0), in_force());
        let mut current = running(t0);
        let mut p = parts(&cfg, &in_force, &mut current, 4);
        assert!(matches!(p.tick(t0 + T / 2), HangStep::Nothing));
        assert!(matches!(p.tick(t0 + T), HangStep::Probe));
        let mut out = Vec::new();
        p.on_probed(t0 + T, (vec![1], vec![]), &mut out);
        assert_eq!(declared(&out), [(1, true)]);
        assert_eq!(reports(&out), [(0, vec![0, 1])]);
        assert!(p.current.hangs.diagnosing(1) && p.current.hangs.seen());
    }

    #[test]
    fn alone_a_node_declares_the_due_rank_without_asking_the_job() {
        let (t0, cfg, in_force) = (Instant::now(), SupervisorConfig::basic(2, 0), in_force());
        let mut current = running(t0);
        let mut p = parts(&cfg, &in_force, &mut current, 2);
        assert!(matches!(p.tick(t0 + T), HangStep::Probe));
        let mut out = Vec::new();
        p.on_probed(t0 + T, (vec![], vec![]), &mut out);
        assert_eq!(declared(&out), [(0, false)], "the lowest rank of equals");
        assert!(reports(&out).is_empty(), "one node: no job verdict");
    }
}

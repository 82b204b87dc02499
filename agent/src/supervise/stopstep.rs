//! Stopping at one agreed step: every rank of every node checkpoints at the same step S and exits 0.
//!
//! A trigger (SIGTERM/SIGUSR1/SIGUSR2 to any agent, or the allocation's end coming within the stop
//! lead) reaches the first node that sees it; it records the trigger in the store, and every node
//! learns it (`Event::StopAsked`). Each node then reports the highest step its ranks reported and
//! their fastest pace ([`StepReport`]); once every node reported, one stop step is chosen for the
//! job by [`choose_stop_step`] and every node hands it to its ranks (`StopRequest { at_step }`),
//! whose `vigil.should_stop(step)` turns True exactly at that step.
//!
//! S must be late enough that no rank is past it when the request reaches it: the highest step
//! reported anywhere, plus the steps the fastest rank makes in [`AGREEMENT_BUDGET`] (the time the
//! agreement and delivery may take), plus one. A rank that never reported a step gets the request
//! as "stop now" (`at_step = None` when no rank reported any).
//!
//! Only ranks that call `vigil.should_stop(step)` (their `Progress` messages say so) can be asked;
//! every other rank gets the signal at once, as before (a rank that only heartbeats may handle
//! SIGTERM itself, as NeMo's own callback does), and the request as well.
//! Ranks still running when the stop window ends (`--term-timeout` for a signal, the lead for the
//! time limit) are stopped as any stop: SIGTERM, then SIGKILL after `--term-timeout`.
//!
//! Each step works on its parts: [`StopAgreement`] (the allocation's stop: trigger, agreement,
//! window, and the trigger's record), [`stop_learned`] (what the attempt's ranks do once the job
//! learned of a stop), [`overdue`] (who missed the window), [`on_stop_step`]. The supervisor's
//! methods here pick those parts and route; stopping the ranks (`begin_stop`) and reporting the
//! node's end (`stop_for_good`) are the other concerns they hand over to.

use std::time::{Duration, Instant};

use vigil_events::log::is_checkpoint_section;
use vigil_ipc::AgentMsg;

pub use super::events::StepReport;
use super::events::{Action, JobEnd, JobRequest, Record, StopReason, EXIT_LOST};
use super::phase::Phase;
use super::state::{Attempt, Pace, Steps};
use super::{verdict, Supervisor};

/// The time S allows for the agreement to finish and reach every rank's next `should_stop`.
pub const AGREEMENT_BUDGET: Duration = Duration::from_secs(1);

/// The job's stop step from every node's report, or `None` when no rank reported a step.
pub fn choose_stop_step(reports: &[StepReport], budget: Duration) -> Option<u64> {
    let max = reports.iter().filter_map(|r| r.max_step).max()?;
    let pace = reports
        .iter()
        .filter_map(|r| r.steps_per_s)
        .filter(|p| p.is_finite() && *p > 0.0)
        .fold(0.0f64, f64::max);
    // Bounded so a bogus pace cannot push S out of reach.
    let ahead = (pace * budget.as_secs_f64()).ceil().min(1e6) as u64;
    Some(max.saturating_add(ahead).saturating_add(1))
}

/// A stop under way on this node.
#[derive(Debug, Clone, PartialEq)]
struct StopState {
    /// What asked for it: `SIGTERM`, `SIGUSR1`, `time-limit`, ...
    trigger: String,
    /// The job learned it (every node gets `StopAsked`).
    asked: bool,
    /// The job's stop step, once agreed (`Some(None)`: stop now).
    agreed: Option<Option<u64>>,
    /// Until when the ranks may stop on their own.
    deadline: Instant,
    /// How long the ranks were given.
    window: Duration,
    /// The window ran out and the remaining ranks were stopped.
    overdue: bool,
}

impl StopState {
    fn new(now: Instant, trigger: String, window: Duration) -> Self {
        StopState {
            trigger,
            asked: false,
            agreed: None,
            deadline: now + window,
            window,
            overdue: false,
        }
    }
}

/// The stop agreement, for the whole allocation (a stop ends it): triggered here or learned from
/// the job, then agreed on a step, then over once the ranks' window ran out.
#[derive(Debug, Clone, Default)]
pub(super) struct StopAgreement {
    state: Option<StopState>,
    /// The stop signal this agent received, forwarded to ranks that cannot be asked.
    sig: Option<i32>,
    /// When to ask for a stop ahead of the allocation's end, and the window the ranks then get.
    at: Option<(Instant, Duration)>,
}

impl StopAgreement {
    /// A stop was asked for (by any node).
    pub fn under_way(&self) -> bool {
        self.state.is_some()
    }

    /// The job agreed on the stop step.
    pub fn agreed(&self) -> bool {
        self.state.as_ref().is_some_and(|s| s.agreed.is_some())
    }

    /// The trigger and agreed step, if a stop was asked for.
    pub fn asked(&self) -> Option<(String, Option<u64>)> {
        self.state
            .as_ref()
            .map(|s| (s.trigger.clone(), s.agreed.flatten()))
    }

    /// What asked for the stop (empty: none).
    pub fn trigger_name(&self) -> &str {
        self.state.as_ref().map_or("", |s| s.trigger.as_str())
    }

    /// The allocation's end moved: ask for a stop at `at` (`None`: no end known).
    pub fn set_end(&mut self, at: Option<Instant>, window: Duration) {
        self.at = at.map(|a| (a, window));
    }

    /// When to wake: the time-limit trigger, or the end of the ranks' window while they run.
    pub fn deadline(&self, running: bool) -> Option<Instant> {
        match &self.state {
            None => self.at.map(|(at, _)| at),
            Some(st) if !st.overdue && running => Some(st.deadline),
            Some(_) => None,
        }
    }

    /// This agent received stop signal `sig` before any other.
    pub fn first_signal(&mut self, sig: i32) -> bool {
        self.sig.is_none() && {
            self.sig = Some(sig);
            true
        }
    }

    /// The signal ranks that cannot be asked get: the agent's own, or SIGTERM for the time limit.
    pub fn signal(&self) -> i32 {
        self.sig.unwrap_or(libc::SIGTERM)
    }

    /// This node saw `trigger`: whether that starts a stop (none was under way).
    pub fn trigger(&mut self, now: Instant, trigger: &str, window: Duration) -> bool {
        if self.state.is_some() {
            return false;
        }
        self.state = Some(StopState::new(now, trigger.to_string(), window));
        true
    }

    /// The allocation's end is within the stop lead and no stop is under way: the window.
    pub fn time_limit_due(&self, now: Instant) -> Option<Duration> {
        match self.at {
            Some((at, window)) if self.state.is_none() && now >= at => Some(window),
            _ => None,
        }
    }

    /// The job learned of a stop for `trigger` (the first recorded, whichever node saw it):
    /// whether this is the first time (this node then reports its steps).
    pub fn learn(&mut self, now: Instant, trigger: String, window: Duration) -> bool {
        let st = self
            .state
            .get_or_insert_with(|| StopState::new(now, trigger.clone(), window));
        if st.asked {
            return false;
        }
        st.asked = true;
        st.trigger = trigger;
        true
    }

    /// The job's stop step: the trigger, when this is the first agreement.
    pub fn agree(&mut self, step: Option<u64>) -> Option<&str> {
        let st = self.state.as_mut().filter(|s| s.agreed.is_none())?;
        st.agreed = Some(step);
        Some(&st.trigger)
    }

    /// The request a rank gets once the stop step is agreed.
    pub fn msg(&self) -> AgentMsg {
        let st = self.state.as_ref();
        AgentMsg::StopRequest {
            reason: st.map(|s| s.trigger.clone()).unwrap_or_default(),
            at_step: st.and_then(|s| s.agreed).flatten(),
        }
    }

    /// The ranks' window is over at `now`: the window, once.
    pub fn window_over(&mut self, now: Instant) -> Option<Duration> {
        let st = self
            .state
            .as_mut()
            .filter(|s| !s.overdue && now >= s.deadline)?;
        st.overdue = true;
        Some(st.window)
    }
}

/// The signals that ask for a stop at a step, rather than being forwarded at once.
pub use vigil_events::is_stop_signal;

impl Supervisor {
    /// This node saw a trigger: record it for the job, unless a stop is already under way.
    pub(super) fn trigger_stop(
        &mut self,
        now: Instant,
        trigger: String,
        window: Duration,
        out: &mut Vec<Action>,
    ) {
        let here = (self.attempt, self.cfg.node_rank);
        self.stop.trigger_for_job(now, here, trigger, window, out);
    }

    /// A rank received a stop signal it holds, sent to it alone (outside Slurm, `kill` by hand):
    /// the job stops at one step, as for that signal to the agent. It is not this agent's own
    /// signal, so a later signal to the agent is still the first one and not obeyed at once.
    pub(super) fn on_rank_signalled(
        &mut self,
        now: Instant,
        local_rank: u32,
        signal: u32,
        out: &mut Vec<Action>,
    ) {
        let Some(sig) = i32::try_from(signal).ok().filter(|s| is_stop_signal(*s)) else {
            return;
        };
        out.push(Action::Record(Record::RankSignalled {
            attempt: self.attempt,
            local_rank,
            rank: self.job.placement.rank_offset + local_rank,
            signal: sig,
        }));
        match self.phase {
            Phase::Running => {
                let window = self.job.term_timeout;
                self.trigger_stop(now, crate::values::signal_name(sig), window, out);
            }
            _ => self.kill_if_holding(local_rank, out),
        }
    }

    /// The job learned of a stop (ours or another node's trigger): report our ranks' steps, and
    /// signal the ranks that cannot be asked.
    pub(super) fn on_stop_asked(
        &mut self,
        now: Instant,
        attempt: u32,
        trigger: String,
        out: &mut Vec<Action>,
    ) {
        if attempt != self.attempt || !self.stop.learn(now, trigger, self.job.term_timeout) {
            return;
        }
        let report = step_report(&self.current);
        out.push(Action::Job(JobRequest::StopSteps {
            attempt: self.attempt,
            report,
        }));
        if self.phase != Phase::Running {
            return;
        }
        let recovering = self.gens.recovering().then_some(self.gens.generation);
        let node = self.cfg.node_rank;
        match stop_learned(&mut self.current, &self.stop, node, recovering) {
            Learned::StopNow { reason, signal } => {
                self.stop_for_good(reason, EXIT_LOST, out);
                self.begin_stop(now, StopReason::Signal, signal, out);
            }
            Learned::AskAtStep { pgids } if !pgids.is_empty() => {
                let signal = self.stop.signal();
                out.push(Action::SignalGroups { pgids, signal });
            }
            Learned::AskAtStep { .. } => {}
        }
    }

    /// This node stops the job for good (unless it already did): tell the other nodes.
    pub(super) fn stop_for_good(&mut self, reason: String, exit_code: i32, out: &mut Vec<Action>) {
        let end = JobEnd::Stopped {
            node: self.cfg.node_rank,
            reason,
            exit_code,
        };
        self.job.ending.stopped.get_or_insert(end.clone());
        verdict::report(&mut self.current, self.attempt, end, out);
    }

    /// The stop window is over: the ranks still running are stopped as any stop is.
    pub(super) fn stop_window_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.phase != Phase::Running {
            return;
        }
        let Some(window) = self.stop.window_over(now) else {
            return;
        };
        let at = (self.attempt, self.job.placement.rank_offset);
        let reason = overdue(&self.current, at, window, out);
        self.stop_for_good(reason, EXIT_LOST, out);
        self.begin_stop(now, StopReason::Signal, libc::SIGTERM, out);
    }

    /// The allocation's end is within the stop lead: ask for a stop.
    pub(super) fn stop_at_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        if let Some(window) = self.stop.time_limit_due(now) {
            self.trigger_stop(now, "time-limit".into(), window, out);
        }
    }

    /// What the stop lead is calculated from: the longest checkpoint seen and the slowest rank's
    /// step time ([`lead_observed`]).
    pub fn lead_observed(&self) -> (Option<Duration>, Option<Duration>) {
        lead_observed(&self.current)
    }
}

impl StopAgreement {
    /// This node saw `trigger` (`here`: the attempt under way, this node's rank): record it for
    /// the job, unless a stop is already under way.
    pub(super) fn trigger_for_job(
        &mut self,
        now: Instant,
        (attempt, node): (u32, u32),
        trigger: String,
        window: Duration,
        out: &mut Vec<Action>,
    ) {
        if !self.trigger(now, &trigger, window) {
            return;
        }
        out.push(Action::Record(Record::StopTriggered {
            attempt,
            node,
            trigger: trigger.clone(),
            window_ms: window.as_millis() as u64,
        }));
        out.push(Action::Job(JobRequest::StopTrigger { attempt, trigger }));
    }
}

/// What a node whose ranks run does once the job learned of a stop ([`stop_learned`]).
#[derive(Debug, PartialEq)]
pub(super) enum Learned {
    /// No rank here can stop at a step: the node stops the job for good (`reason`), and its
    /// ranks get `signal` with the usual grace.
    StopNow { reason: String, signal: i32 },
    /// The ranks that listen are asked at the agreed step; these process groups (ranks that
    /// cannot be asked) get the agent's stop signal now.
    AskAtStep { pgids: Vec<i32> },
}

/// The job learned of the `stop` while `current`'s ranks run on node `node` (`recovering`: the
/// in-process generation being recovered, if one is): what this node does. Ranks that cannot be
/// asked are marked told to stop (their exit is expected).
pub(super) fn stop_learned(
    current: &mut Attempt,
    stop: &StopAgreement,
    node: u32,
    recovering: Option<u64>,
) -> Learned {
    let trigger = stop.trigger_name();
    if let Some(generation) = recovering {
        // The ranks wait in the generation's rendezvous, not at a step: none would reach
        // the stop step, and Slurm SIGKILLs the job `KillWait` after its signal. They hold
        // SIGTERM and have nothing to save, so they are SIGKILLed and the stop recorded now.
        let reason = format!(
            "node {node} was asked to stop ({trigger}) while in-process generation {generation} was being recovered: no rank can reach a stop step",
        );
        let signal = libc::SIGKILL;
        return Learned::StopNow { reason, signal };
    }
    let running = || current.ranks.iter().filter(|r| r.running());
    if !running().any(|r| r.listens) {
        // Nobody here can checkpoint on request: stop as a signal always did.
        let reason = format!(
            "node {node} was asked to stop ({trigger}) and its ranks do not use vigil's shim"
        );
        let signal = stop.signal();
        return Learned::StopNow { reason, signal };
    }
    let pgids: Vec<i32> = running()
        .filter(|r| !r.listens)
        .filter_map(|r| r.pid)
        .collect();
    if !pgids.is_empty() {
        for r in current.ranks.iter_mut() {
            if r.running() && !r.listens {
                r.told_to_stop = true;
            }
        }
    }
    Learned::AskAtStep { pgids }
}

/// The stop window (`window`) of attempt `attempt` is over: records the ranks still running
/// (`rank_offset`: the global rank of local rank 0) and returns why the job stops.
pub(super) fn overdue(
    current: &Attempt,
    (attempt, rank_offset): (u32, u32),
    window: Duration,
    out: &mut Vec<Action>,
) -> String {
    let late: Vec<u32> = current
        .ranks
        .iter()
        .enumerate()
        .filter(|(_, r)| r.running())
        .map(|(i, _)| rank_offset + i as u32)
        .collect();
    out.push(Action::Record(Record::StopOverdue {
        attempt,
        ranks: late.clone(),
        window_ms: window.as_millis() as u64,
    }));
    let late: Vec<String> = late.iter().map(|r| r.to_string()).collect();
    format!(
        "rank(s) {} did not stop within {:.0} s of being asked",
        late.join(", "),
        window.as_secs_f64()
    )
}

/// The highest step the attempt's ranks reported, and their fastest pace.
pub(super) fn step_report(current: &Attempt) -> StepReport {
    let paces = current.ranks.iter().filter_map(|r| r.pace);
    let mut report = StepReport {
        max_step: None,
        steps_per_s: None,
    };
    for p in paces {
        report.max_step = report.max_step.max(Some(p.step));
        if let Some(v) = p.steps_per_s {
            report.steps_per_s = Some(report.steps_per_s.map_or(v, |o: f64| o.max(v)));
        }
    }
    report
}

/// What the stop lead is calculated from: the longest checkpoint the attempt's ranks took (a
/// section whose name says `checkpoint`: [`is_checkpoint_section`], goodput's rule too) and the
/// slowest rank's step time.
pub(super) fn lead_observed(current: &Attempt) -> (Option<Duration>, Option<Duration>) {
    let ckpt = current
        .merged_observations()
        .sections
        .iter()
        .filter(|(name, _)| is_checkpoint_section(name))
        .map(|(_, d)| *d)
        .max();
    let slowest = current
        .ranks
        .iter()
        .filter_map(|r| r.pace.and_then(|p| p.steps_per_s))
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v))));
    (
        ckpt,
        slowest.map(|v| Duration::from_secs_f64((1.0 / v).min(1e6))),
    )
}

/// Local rank `local_rank` of the attempt reported it reached `step` at `now`: its pace, and the
/// highest step the job's `steps` keep.
pub(super) fn on_step(
    current: &mut Attempt,
    steps: &mut Steps,
    now: Instant,
    local_rank: u32,
    step: u64,
) {
    if let Some(r) = current.ranks.get_mut(local_rank as usize) {
        match r.pace.as_mut() {
            Some(p) => p.update(step, now),
            None => r.pace = Some(Pace::new(step, now)),
        }
        steps.highest = steps.highest.max(Some(step));
    }
}

/// The job agreed on attempt `attempt`'s stop step (`current`: the attempt under way here, in
/// `phase`): tell every rank that speaks to the shim.
pub(super) fn on_stop_step(
    stop: &mut StopAgreement,
    (current, phase): (u32, &Phase),
    attempt: u32,
    step: Option<u64>,
    out: &mut Vec<Action>,
) {
    if attempt != current {
        return;
    }
    let Some(trigger) = stop.agree(step) else {
        return;
    };
    out.push(Action::Record(Record::StopAgreed {
        attempt,
        step,
        trigger: trigger.to_string(),
    }));
    if matches!(phase, Phase::Running | Phase::Stopping { .. }) {
        out.push(Action::SendToAll(stop.msg()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rep(max_step: Option<u64>, pace: Option<f64>) -> StepReport {
        StepReport {
            max_step,
            steps_per_s: pace,
        }
    }

    #[test]
    fn the_stop_step_is_past_the_fastest_rank_with_room_for_the_agreement() {
        let b = Duration::from_secs(1);
        assert_eq!(choose_stop_step(&[], b), None);
        assert_eq!(choose_stop_step(&[rep(None, None)], b), None);
        // No pace known: the next step.
        assert_eq!(choose_stop_step(&[rep(Some(10), None)], b), Some(11));
        // 20 steps/s on the fastest node: 20 steps of room, from the highest step anywhere.
        assert_eq!(
            choose_stop_step(
                &[
                    rep(Some(10), Some(2.0)),
                    rep(Some(12), None),
                    rep(None, Some(20.0))
                ],
                b
            ),
            Some(33)
        );
        // A bogus pace cannot overflow.
        assert_eq!(
            choose_stop_step(&[rep(Some(u64::MAX - 1), Some(f64::INFINITY))], b),
            Some(u64::MAX)
        );
    }

    #[test]
    fn pace_follows_the_latest_steps() {
        let t = Instant::now();
        let mut p = Pace::new(0, t);
        p.update(10, t + Duration::from_secs(1));
        assert_eq!(p.steps_per_s, Some(10.0));
        p.update(10, t + Duration::from_secs(5)); // repeated: ignored
        p.update(5, t + Duration::from_secs(5)); // older: ignored
        assert_eq!((p.step, p.steps_per_s), (10, Some(10.0)));
        p.update(40, t + Duration::from_secs(2));
        assert_eq!(p.steps_per_s, Some(20.0));
    }

    #[test]
    fn a_stop_is_triggered_once_learned_once_and_agreed_once() {
        let t = Instant::now();
        let w = Duration::from_secs(30);
        let mut s = StopAgreement::default();
        assert!(!s.under_way() && s.asked().is_none());
        assert!(s.trigger(t, "SIGTERM", w));
        assert!(
            !s.trigger(t, "time-limit", w),
            "a stop under way is not triggered again"
        );
        // The job's trigger is the first recorded, which may be another node's.
        assert!(s.learn(t, "SIGUSR1".into(), w));
        assert!(!s.learn(t, "SIGTERM".into(), w));
        assert_eq!(s.trigger_name(), "SIGUSR1");
        assert!(!s.agreed());
        assert_eq!(s.agree(Some(7)), Some("SIGUSR1"));
        assert_eq!(s.agree(Some(9)), None);
        assert_eq!(s.asked(), Some(("SIGUSR1".into(), Some(7))));
        assert_eq!(
            s.msg(),
            AgentMsg::StopRequest {
                reason: "SIGUSR1".into(),
                at_step: Some(7)
            }
        );
    }

    #[test]
    fn a_stop_learned_from_the_job_starts_its_window_here() {
        let t = Instant::now();
        let w = Duration::from_secs(30);
        let mut s = StopAgreement::default();
        assert!(s.learn(t, "SIGTERM".into(), w));
        assert_eq!(s.deadline(true), Some(t + w));
        assert_eq!(s.deadline(false), None, "no window while no rank runs");
        assert_eq!(s.window_over(t + w / 2), None);
        assert_eq!(s.window_over(t + w), Some(w));
        assert_eq!(s.window_over(t + w), None, "once");
        assert_eq!(s.deadline(true), None);
    }

    #[test]
    fn the_time_limit_triggers_at_the_lead_unless_a_stop_is_under_way() {
        let t = Instant::now();
        let w = Duration::from_secs(60);
        let mut s = StopAgreement::default();
        assert_eq!(s.time_limit_due(t), None);
        s.set_end(Some(t + w), w / 2);
        assert_eq!(s.deadline(true), Some(t + w));
        assert_eq!(s.time_limit_due(t), None);
        assert_eq!(s.time_limit_due(t + w), Some(w / 2));
        s.set_end(None, w);
        assert_eq!(s.time_limit_due(t + w), None, "the end is no longer known");
        s.set_end(Some(t), w);
        assert!(s.trigger(t, "SIGTERM", w));
        assert_eq!(s.time_limit_due(t + w), None);
    }

    #[test]
    fn only_the_agent_s_first_signal_is_its_stop_signal() {
        let mut s = StopAgreement::default();
        assert_eq!(s.signal(), libc::SIGTERM);
        assert!(s.first_signal(libc::SIGUSR1));
        assert!(!s.first_signal(libc::SIGTERM));
        assert_eq!(s.signal(), libc::SIGUSR1);
    }

    /// Three running ranks (pids 100-102); those in `listening` call `should_stop(step)`.
    fn running(now: Instant, listening: &[usize]) -> Attempt {
        let mut current = Attempt::start(now, 3);
        for (i, r) in current.ranks.iter_mut().enumerate() {
            r.state = super::super::phase::RankState::Running;
            r.pid = Some(100 + i as i32);
            r.listens = listening.contains(&i);
        }
        current
    }

    fn learned(now: Instant, sig: i32) -> StopAgreement {
        let mut s = StopAgreement::default();
        s.first_signal(sig);
        assert!(s.learn(now, "SIGUSR1".into(), Duration::from_secs(5)));
        s
    }

    #[test]
    fn ranks_that_cannot_be_asked_get_the_signal_and_the_others_wait_for_the_step() {
        let now = Instant::now();
        let mut current = running(now, &[1]);
        let stop = learned(now, libc::SIGUSR1);
        let l = stop_learned(&mut current, &stop, 2, None);
        assert_eq!(
            l,
            Learned::AskAtStep {
                pgids: vec![100, 102]
            }
        );
        let told: Vec<bool> = current.ranks.iter().map(|r| r.told_to_stop).collect();
        assert_eq!(told, [true, false, true]);
        let mut all = running(now, &[0, 1, 2]);
        let l = stop_learned(&mut all, &stop, 2, None);
        assert_eq!(l, Learned::AskAtStep { pgids: vec![] });
        assert!(all.ranks.iter().all(|r| !r.told_to_stop));
    }

    #[test]
    fn with_no_rank_that_listens_or_a_generation_recovering_the_node_stops_now() {
        let now = Instant::now();
        let stop = learned(now, libc::SIGUSR1);
        let Learned::StopNow { reason, signal } =
            stop_learned(&mut running(now, &[]), &stop, 2, None)
        else {
            panic!("no rank listens: a stop now");
        };
        assert_eq!(signal, libc::SIGUSR1, "the agent's own signal");
        assert!(
            reason.contains("node 2") && reason.contains("(SIGUSR1)"),
            "{reason}"
        );
        let l = stop_learned(&mut running(now, &[0, 1, 2]), &stop, 2, Some(3));
        let Learned::StopNow { reason, signal } = l else {
            panic!("a generation being recovered: a stop now");
        };
        assert_eq!(signal, libc::SIGKILL);
        assert!(reason.contains("generation 3"), "{reason}");
    }

    #[test]
    fn the_ranks_past_the_window_are_recorded_by_global_rank() {
        let now = Instant::now();
        let mut current = running(now, &[]);
        current.ranks[1].state = super::super::phase::RankState::SpawnFailed;
        let mut out = Vec::new();
        let reason = overdue(&current, (4, 8), Duration::from_secs(30), &mut out);
        assert_eq!(
            reason,
            "rank(s) 8, 10 did not stop within 30 s of being asked"
        );
        let rec = Action::Record(Record::StopOverdue {
            attempt: 4,
            ranks: vec![8, 10],
            window_ms: 30_000,
        });
        assert_eq!(out, [rec]);
    }

    #[test]
    fn a_trigger_is_recorded_and_sent_to_the_job_once() {
        let now = Instant::now();
        let mut s = StopAgreement::default();
        let mut out = Vec::new();
        let window = Duration::from_secs(5);
        s.trigger_for_job(now, (1, 3), "straggler".into(), window, &mut out);
        s.trigger_for_job(now, (1, 3), "SIGTERM".into(), window, &mut out);
        let job = Action::Job(JobRequest::StopTrigger {
            attempt: 1,
            trigger: "straggler".into(),
        });
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[1], job);
        assert!(matches!(
            &out[0],
            Action::Record(Record::StopTriggered { node: 3, .. })
        ));
    }

    proptest! {
        #[test]
        fn no_reported_step_is_at_or_past_the_stop_step(
            steps in proptest::collection::vec(proptest::option::of(0u64..1_000_000), 1..16),
            paces in proptest::collection::vec(proptest::option::of(0.0f64..10_000.0), 1..16),
        ) {
            let reports: Vec<StepReport> = steps.iter().zip(paces.iter().cycle())
                .map(|(s, p)| rep(*s, *p)).collect();
            match choose_stop_step(&reports, AGREEMENT_BUDGET) {
                None => prop_assert!(steps.iter().all(Option::is_none)),
                Some(s) => {
                    for r in &reports {
                        if let Some(m) = r.max_step { prop_assert!(m < s); }
                        if let (Some(m), Some(p)) = (r.max_step, r.steps_per_s) {
                            // The fastest rank cannot pass S within the budget.
                            prop_assert!((m as f64) + p * AGREEMENT_BUDGET.as_secs_f64() < s as f64);
                        }
                    }
                }
            }
        }
    }
}

//! Timeouts in force: calculating them from what the ranks report when vigil or the job's code
//! asks, and adopting the job's value.
//!
//! Two small state machines, each pure:
//! - [`TimeoutState`] (whole allocation): the timeouts in force, the last calculated ones and
//!   whether the job's code calculates on request (then vigil never calculates on its own).
//! - `Requests` (one attempt, in `machines.rs` with the attempt's other state machines): vigil's own calculation done or not, and the job's requests:
//!   collecting one from every local rank, then one round shared with the other nodes at a time,
//!   answered when the job's result for that round comes.
//!
//! [`Calc`] turns the ranks' reports and the job's answers into actions, on the parts of the
//! supervisor it is handed (the configuration, the attempt, the timeouts), not the whole of it;
//! `Supervisor::calc` only picks those parts, and each step is unit-tested on them alone.

use std::time::Duration;

use vigil_ipc::AgentMsg;

use super::events::SupervisorConfig;
use super::events::{Action, JobRequest, Record};
use super::monitor::{self, CalcRequest, Calculated, Observed, Timeouts};
use super::phase::Phase;
use super::state::Attempt;
use super::Supervisor;

/// `loaded` values for the checks that are enabled in `configured`; the rest as configured. The
/// initial timeout is never below the configured one (`monitor::INITIAL_CALC_FLOOR` says why),
/// whatever a saved file says.
fn overlay(configured: &Timeouts, loaded: &Timeouts) -> Timeouts {
    let pick = |c: Option<Duration>, l: Option<Duration>| c.and(l).or(c);
    Timeouts {
        initial: pick(configured.initial, loaded.initial).max(configured.initial),
        heartbeat: pick(configured.heartbeat, loaded.heartbeat),
        sections: configured
            .sections
            .iter()
            .map(|(k, v)| (k.clone(), loaded.sections.get(k).copied().unwrap_or(*v)))
            .collect(),
        out_of_section: pick(configured.out_of_section, loaded.out_of_section),
        warmup: configured.warmup,
    }
}

/// The timeouts in force and what was calculated, across attempts.
#[derive(Debug, Clone)]
pub(super) struct TimeoutState {
    pub in_force: Timeouts,
    /// The last calculated timeouts (loaded or from this run), blended into the next calculation.
    pub calculated: Option<Timeouts>,
    /// The job's code calculates timeouts when it asks (NVRx's client announced itself or asked).
    pub on_request: bool,
}

impl TimeoutState {
    pub fn new(configured: &Timeouts) -> Self {
        TimeoutState {
            in_force: configured.clone(),
            calculated: None,
            on_request: false,
        }
    }

    /// Puts `next` in force; whether that changed anything.
    fn set(&mut self, next: Timeouts) -> bool {
        let changed = next != self.in_force;
        self.in_force = next;
        changed
    }

    /// Timeouts handed over by the job (loaded from the state file by node rank 0, or calculated
    /// over all nodes) replace the ones in force for the checks that are enabled.
    pub fn adopt(&mut self, configured: &Timeouts, job: &Timeouts) -> bool {
        self.calculated = Some(job.clone());
        self.set(overlay(configured, job))
    }

    /// The job's code turned out to calculate on request (only the first call does anything).
    /// Under NVRx's rule calculated timeouts take precedence over configured ones, disabled ones
    /// included: timeouts this job calculated before (the state file, an earlier attempt) apply
    /// to every check. Whether that changed the timeouts in force.
    pub fn switch_to_requests(&mut self) -> bool {
        if std::mem::replace(&mut self.on_request, true) {
            return false;
        }
        let Some(c) = self.calculated.clone() else {
            return false;
        };
        let mut next = self.in_force.clone();
        next.initial = c.initial.max(next.initial);
        next.heartbeat = c.heartbeat.or(next.heartbeat);
        next.out_of_section = c.out_of_section.or(next.out_of_section);
        next.sections.extend(c.sections);
        self.set(next)
    }

    /// The job's result `job` of a requested calculation, of which this node calculated `done`
    /// (and these `sections`): keeps what was calculated (returned, to be saved, when anything
    /// was) and puts `job` in force (`bool`: whether that changed anything).
    pub fn answered(
        &mut self,
        done: Calculated,
        sections: &[String],
        job: Timeouts,
    ) -> (Option<Timeouts>, bool) {
        let mut kept = self.calculated.clone().unwrap_or_default();
        if done.heartbeat {
            kept.initial = job.initial;
            kept.heartbeat = job.heartbeat;
        }
        for name in sections {
            if let Some(d) = job.sections.get(name) {
                kept.sections.insert(name.clone(), *d);
            }
        }
        if done.out_of_section {
            kept.out_of_section = job.out_of_section;
        }
        let kept = (done.heartbeat || done.sections || done.out_of_section).then_some(kept);
        if kept.is_some() {
            self.calculated = kept.clone();
        }
        (kept, self.set(job))
    }
}

/// The parts of the supervisor the calculation of timeouts reads and changes: the launch's
/// configuration, the attempt under way (its number, whether its ranks run), the timeouts.
pub(super) struct Calc<'a> {
    pub cfg: &'a SupervisorConfig,
    pub attempt: u32,
    /// The attempt's ranks run (`Phase::Running`).
    pub running: bool,
    pub current: &'a mut Attempt,
    pub timeouts: &'a mut TimeoutState,
}

impl Supervisor {
    /// The parts the calculation of timeouts works on.
    pub(super) fn calc(&mut self) -> Calc<'_> {
        Calc {
            cfg: &self.cfg,
            attempt: self.attempt,
            running: self.phase == Phase::Running,
            current: &mut self.current,
            timeouts: &mut self.timeouts,
        }
    }
}

impl Calc<'_> {
    /// The timeouts in force changed (`changed`): record it and tell every rank.
    fn announce(&self, changed: bool, source: &'static str, out: &mut Vec<Action>) {
        if changed {
            out.push(Action::Record(Record::TimeoutsUpdated {
                source,
                timeouts: self.timeouts.in_force.clone(),
            }));
            out.push(Action::SendToAll(self.timeouts.in_force.to_msg()));
        }
    }

    pub(super) fn adopt_timeouts(
        &mut self,
        job: &Timeouts,
        source: &'static str,
        out: &mut Vec<Action>,
    ) {
        let changed = self.timeouts.adopt(&self.cfg.timeouts, job);
        self.announce(changed, source, out);
    }

    pub(super) fn on_job_timeouts(
        &mut self,
        attempt: u32,
        round: u32,
        timeouts: Timeouts,
        out: &mut Vec<Action>,
    ) {
        if attempt == self.attempt && round > 0 {
            self.answer(round, timeouts, out);
        } else if attempt == self.attempt {
            if self.cfg.saves_timeouts {
                out.push(Action::SaveTimeouts(timeouts.clone()));
            }
            self.adopt_timeouts(&timeouts, "calculated", out);
        }
    }

    /// Calculation is over for this attempt: a hang was seen, or the ranks are not running.
    fn calculation_over(&self) -> bool {
        self.current.hangs.seen() || !self.running
    }

    /// A rank asks for timeouts to be calculated (NVRx's `calculate_and_set_*`, which every rank
    /// calls together). Once every registered rank of the node asked, this node calculates what
    /// was asked and shares it; the ranks are answered when the job's result comes (`answer`).
    pub(super) fn on_calc_request(
        &mut self,
        now: std::time::Instant,
        local_rank: u32,
        req: CalcRequest,
        out: &mut Vec<Action>,
    ) {
        let changed = self.timeouts.switch_to_requests();
        self.announce(changed, "loaded", out);
        if req == CalcRequest::default() {
            // Only the announcement that this code calculates when it asks.
            return;
        }
        if self.calculation_over() {
            out.push(Action::SendToRank {
                local_rank,
                msg: AgentMsg::TimeoutsCalculated {
                    heartbeat: false,
                    sections: false,
                    out_of_section: false,
                },
            });
            return;
        }
        if req.out_of_section {
            if let Some(m) = self.current.ranks[local_rank as usize].monitor.as_mut() {
                m.bump_out_of_section(now);
            }
        }
        self.current.requests.ask(local_rank, &req);
        self.maybe_answer_requests(out);
    }

    /// Calculates the collected request once every running, registered rank of the node asked
    /// (a rank that ended or closed its connection is not waited for).
    pub(super) fn maybe_answer_requests(&mut self, out: &mut Vec<Action>) {
        let Some(asked) = self.current.requests.collecting() else {
            return;
        };
        if self.calculation_over() {
            return;
        }
        let waiting = self.current.ranks.iter().enumerate().any(|(i, r)| {
            r.running()
                && r.monitor.as_ref().is_some_and(|m| m.watched())
                && !asked.contains(&(i as u32))
        });
        if waiting {
            return;
        }
        let Some((req, ranks)) = self.current.requests.take() else {
            return;
        };
        let observed = self.current.merged_observations();
        let (next, done) = monitor::calculate_requested(
            &self.timeouts.in_force,
            &observed,
            self.timeouts.calculated.as_ref(),
            self.cfg.safety_factor,
            &req,
        );
        let sections = match (done.sections, req.all_sections) {
            (false, _) => Vec::new(),
            (true, true) => observed.sections.keys().cloned().collect(),
            (true, false) => req.sections,
        };
        let round = self.current.requests.share(done, sections, ranks);
        out.push(Action::Job(JobRequest::ShareTimeouts {
            attempt: self.attempt,
            round,
            timeouts: next,
        }));
    }

    /// The job's result of a requested calculation: put it in force, keep and save what was
    /// calculated, and tell each rank that asked what was set.
    pub(super) fn answer(&mut self, round: u32, job: Timeouts, out: &mut Vec<Action>) {
        let Some(a) = self.current.requests.answer(round) else {
            return;
        };
        let (kept, changed) = self.timeouts.answered(a.done, &a.sections, job);
        if let Some(kept) = kept.filter(|_| self.cfg.saves_timeouts) {
            out.push(Action::SaveTimeouts(kept));
        }
        self.announce(changed, "calculated", out);
        for local_rank in a.ranks {
            out.push(Action::SendToRank {
                local_rank,
                msg: AgentMsg::TimeoutsCalculated {
                    heartbeat: a.done.heartbeat,
                    sections: a.done.sections,
                    out_of_section: a.done.out_of_section,
                },
            });
        }
        self.maybe_answer_requests(out);
    }

    /// With `--calculate-timeouts`: once every rank has been observed long enough, set the
    /// timeouts from what they needed. Never when the job's code calculates on request, or after
    /// a hang in this attempt. Without the flag only the job's code asks, as under ft_launcher,
    /// which never calculates on its own: a configured `step=15` stays 15 s however short the
    /// steps seen.
    pub(super) fn maybe_calculate(&mut self, out: &mut Vec<Action>) {
        if !self.cfg.calculates
            || self.current.requests.own_done
            || self.timeouts.on_request
            || self.current.hangs.seen()
            || !self.timeouts.in_force.any()
            || self.current.ranks.iter().any(|r| r.monitor.is_none())
        {
            return;
        }
        // Asked on every section end until ready: no merged copy of every rank's sections.
        let observed: Vec<&Observed> = self
            .current
            .ranks
            .iter()
            .filter_map(|r| r.monitor.as_ref().map(|m| &m.observed))
            .collect();
        if !Observed::all_ready_for(&observed, &self.cfg.timeouts) {
            return;
        }
        let merged = self.current.merged_observations();
        self.current.requests.own_done = true;
        let fresh = monitor::calculate(
            &self.timeouts.in_force,
            &merged,
            self.timeouts.calculated.as_ref(),
            self.cfg.safety_factor,
        );
        // Applied when every node has calculated (`JobTimeouts`): the job's value is the maximum.
        out.push(Action::Job(JobRequest::ShareTimeouts {
            attempt: self.attempt,
            round: 0,
            timeouts: fresh,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Option<Duration> {
        Some(Duration::from_secs(s))
    }

    fn hb(initial: u64, heartbeat: u64) -> Timeouts {
        Timeouts {
            initial: secs(initial),
            heartbeat: secs(heartbeat),
            ..Timeouts::default()
        }
    }

    #[test]
    fn the_job_s_timeouts_apply_to_the_enabled_checks_only() {
        let configured = Timeouts {
            heartbeat: secs(30),
            ..Timeouts::default()
        };
        let mut t = TimeoutState::new(&configured);
        let mut job = hb(5, 9);
        job.out_of_section = secs(7);
        assert!(t.adopt(&configured, &job));
        assert_eq!(t.in_force.heartbeat, secs(9));
        assert_eq!(
            (t.in_force.initial, t.in_force.out_of_section),
            (None, None)
        );
        assert_eq!(t.calculated, Some(job.clone()));
        assert!(
            !t.adopt(&configured, &job),
            "the same value changes nothing"
        );
    }

    #[test]
    fn switching_to_requests_applies_what_was_calculated_once() {
        let configured = Timeouts::default();
        let mut t = TimeoutState::new(&configured);
        t.calculated = Some(hb(60, 9));
        assert!(t.switch_to_requests());
        assert_eq!(t.in_force, hb(60, 9));
        t.calculated = Some(hb(60, 3));
        assert!(!t.switch_to_requests(), "only the first request switches");
        assert!(t.on_request);
    }

    #[test]
    fn an_answer_keeps_only_what_this_node_calculated() {
        let mut t = TimeoutState::new(&Timeouts::default());
        let mut job = hb(60, 9);
        job.sections.insert("step".into(), Duration::from_secs(4));
        job.sections.insert("ckpt".into(), Duration::from_secs(8));
        let done = Calculated {
            heartbeat: false,
            sections: true,
            out_of_section: false,
        };
        let (kept, changed) = t.answered(done, &["step".to_string()], job.clone());
        let kept = kept.expect("a section was calculated");
        assert_eq!(kept.heartbeat, None);
        assert_eq!(kept.sections.keys().collect::<Vec<_>>(), ["step"]);
        assert!(changed && t.in_force == job);
        let nothing = Calculated {
            heartbeat: false,
            sections: false,
            out_of_section: false,
        };
        assert_eq!(t.answered(nothing, &[], job), (None, false));
        assert_eq!(t.calculated, Some(kept));
    }
}

/// The calculation of timeouts on its parts alone (`Calc`): no supervisor around it.
#[cfg(test)]
mod calc_tests {
    use std::time::Instant;

    use vigil_ipc::RankMsg;

    use super::super::monitor::RankMonitor;
    use super::super::phase::RankState;
    use super::*;

    /// Two running ranks of attempt 1 that registered at `t0` and heartbeat every 2 s since.
    fn running(t0: Instant) -> Attempt {
        let mut current = Attempt::start(t0, 2);
        for (i, r) in current.ranks.iter_mut().enumerate() {
            r.state = RankState::Running;
            r.pid = Some(100 + i as i32);
            let mut m = RankMonitor::new(t0);
            let register = RankMsg::Register {
                rank: i as u32,
                local_rank: i as u32,
                pid: 100 + i as u32,
                attempt: 1,
            };
            m.on_msg(t0, &register);
            for s in 1..=3 {
                let at = t0 + Duration::from_secs(2 * s);
                m.on_msg(at, &RankMsg::Heartbeat { step: Some(s) });
            }
            r.monitor = Some(m);
        }
        current
    }

    fn calc<'a>(
        cfg: &'a SupervisorConfig,
        current: &'a mut Attempt,
        timeouts: &'a mut TimeoutState,
    ) -> Calc<'a> {
        Calc {
            cfg,
            attempt: 1,
            running: true,
            current,
            timeouts,
        }
    }

    fn hb(initial: u64, heartbeat: u64) -> Timeouts {
        Timeouts {
            initial: Some(Duration::from_secs(initial)),
            heartbeat: Some(Duration::from_secs(heartbeat)),
            ..Timeouts::default()
        }
    }

    fn heartbeat() -> CalcRequest {
        CalcRequest {
            heartbeat: true,
            ..CalcRequest::default()
        }
    }

    #[test]
    fn the_job_s_timeouts_are_saved_put_in_force_and_told_to_every_rank() {
        let mut cfg = SupervisorConfig::basic(2, 0);
        cfg.timeouts.heartbeat = Some(Duration::from_secs(30));
        let (mut current, mut timeouts) =
            (running(Instant::now()), TimeoutState::new(&cfg.timeouts));
        let mut c = calc(&cfg, &mut current, &mut timeouts);
        let mut out = Vec::new();
        c.on_job_timeouts(0, 0, hb(60, 9), &mut out);
        assert!(out.is_empty(), "another attempt's");
        c.on_job_timeouts(1, 0, hb(60, 9), &mut out);
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[0], Action::SaveTimeouts(hb(60, 9)));
        assert!(matches!(out[2], Action::SendToAll(_)));
        let only_enabled = Timeouts {
            heartbeat: Some(Duration::from_secs(9)),
            ..Timeouts::default()
        };
        assert_eq!(c.timeouts.in_force, only_enabled);
        out.clear();
        c.on_job_timeouts(1, 0, hb(60, 9), &mut out);
        assert_eq!(out, [Action::SaveTimeouts(hb(60, 9))], "nothing changed");
    }

    #[test]
    fn a_request_is_shared_once_every_rank_asked_and_answered_to_those_that_asked() {
        let t0 = Instant::now();
        let cfg = SupervisorConfig::basic(2, 0);
        let (mut current, mut timeouts) = (running(t0), TimeoutState::new(&cfg.timeouts));
        let mut c = calc(&cfg, &mut current, &mut timeouts);
        let mut out = Vec::new();
        let now = t0 + Duration::from_secs(7);
        c.on_calc_request(now, 0, heartbeat(), &mut out);
        assert!(out.is_empty(), "rank 1 still to ask: {out:?}");
        assert!(c.timeouts.on_request);
        c.on_calc_request(now, 1, heartbeat(), &mut out);
        let [Action::Job(JobRequest::ShareTimeouts {
            attempt: 1,
            round,
            timeouts: mine,
        })] = &out[..]
        else {
            panic!("one share: {out:?}");
        };
        assert!(mine.heartbeat.is_some(), "{mine:?}");
        let (round, mine) = (*round, mine.clone());
        out.clear();
        c.on_job_timeouts(1, round, mine.clone(), &mut out);
        let told: Vec<u32> = out
            .iter()
            .filter_map(|a| match a {
                Action::SendToRank {
                    local_rank,
                    msg:
                        AgentMsg::TimeoutsCalculated {
                            heartbeat: true, ..
                        },
                } => Some(*local_rank),
                _ => None,
            })
            .collect();
        assert_eq!(told, [0, 1]);
        assert_eq!(c.timeouts.in_force, mine);
        assert!(out.contains(&Action::SaveTimeouts(mine)), "{out:?}");
    }

    #[test]
    fn after_a_hang_or_once_the_ranks_stopped_a_request_is_answered_with_nothing() {
        let t0 = Instant::now();
        let cfg = SupervisorConfig::basic(2, 0);
        let (mut current, mut timeouts) = (running(t0), TimeoutState::new(&cfg.timeouts));
        let mut c = calc(&cfg, &mut current, &mut timeouts);
        c.running = false;
        let mut out = Vec::new();
        c.on_calc_request(t0, 1, heartbeat(), &mut out);
        let nothing = Action::SendToRank {
            local_rank: 1,
            msg: AgentMsg::TimeoutsCalculated {
                heartbeat: false,
                sections: false,
                out_of_section: false,
            },
        };
        assert_eq!(out, [nothing]);
    }
}

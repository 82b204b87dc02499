//! The small state machines an attempt is made of (kept in `Attempt`, `state.rs`), each
//! pure and unit-tested here: the hang watch ([`HangWatch`]: watching, probing, diagnosing,
//! concluding), a rank's pace ([`Pace`]), and the timeout requests of the attempt ([`Requests`]).
//! The concerns that drive them (`hangs.rs`, `stopstep.rs`, `timeouts.rs`) import them from here,
//! so the attempt's state imports no concern.

use std::time::Instant;

use super::events::{Hang, HangCandidate};
use super::monitor::{CalcRequest, Calculated};

/// A hung rank whose stacks are being captured: rank, why, and when to stop waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Diagnosis {
    local_rank: u32,
    hang: Hang,
    until: Instant,
}

/// What a tick means for hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HangStep {
    Nothing,
    /// A hang is due: ask the runtime which ranks are stopped.
    Probe,
    /// The diagnosis' wait is over: terminate the hung rank.
    Conclude,
}

/// Where the job's verdict on a hang stands for this node (several nodes only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum JobVerdict {
    /// None asked for.
    #[default]
    Idle,
    /// Verdict `round` is asked for (here or by another node); this node decides alone at
    /// `until` if none came.
    Asked { round: u32, until: Instant },
    /// The verdict named a rank of another node, whose node stops or replaces it; this node
    /// decides alone at `until` if nothing happened by then.
    Elsewhere { until: Instant },
    /// This node decides alone (no verdict came in time, or it named no rank).
    Alone,
}

/// One attempt's hang handling.
#[derive(Debug, Clone, Default)]
pub(super) struct HangWatch {
    diagnosing: Option<Diagnosis>,
    /// A hang is due and the runtime was asked which ranks are stopped (`ProbeStopped`).
    probing: bool,
    /// A rank of this attempt was declared hung: nothing it or the others do from then on says
    /// what the job needs.
    seen: bool,
    pub job: JobVerdict,
    /// The job's next hang verdict round in this attempt (every node sees every verdict).
    pub round: u32,
    /// The last round this node reported its candidates for.
    reported: Option<u32>,
    /// The rank this node named hung in this attempt, as a candidate: what it reports to any
    /// later ask, even once the rank is gone or replaced.
    pub named: Option<HangCandidate>,
}

impl HangWatch {
    /// A rank was declared hung in this attempt.
    pub fn seen(&self) -> bool {
        self.seen
    }

    /// When to wake next: the diagnosis' end, the job's verdict's wait, or else when the
    /// earliest hang is due.
    pub fn deadline(&self, due: impl FnOnce() -> Option<Instant>) -> Option<Instant> {
        match (&self.diagnosing, self.job) {
            (Some(d), _) => Some(d.until),
            (None, JobVerdict::Asked { until, .. } | JobVerdict::Elsewhere { until }) => {
                Some(until)
            }
            (None, _) => due(),
        }
    }

    /// A tick at `now`, with the earliest hang due at `due`.
    pub fn tick(&mut self, now: Instant, due: Option<Instant>) -> HangStep {
        match (&self.diagnosing, self.job) {
            (Some(d), _) if now >= d.until => HangStep::Conclude,
            (Some(_), _) => HangStep::Nothing,
            (None, JobVerdict::Asked { until, .. } | JobVerdict::Elsewhere { until }) => {
                if now < until || self.probing {
                    return HangStep::Nothing;
                }
                self.job = JobVerdict::Alone;
                self.probing = true;
                HangStep::Probe
            }
            (None, _) if !self.probing && due.is_some_and(|at| now >= at) => {
                self.probing = true;
                HangStep::Probe
            }
            (None, _) => HangStep::Nothing,
        }
    }

    /// The runtime answered the probe: whether a diagnosis may begin.
    pub fn probed(&mut self) -> bool {
        std::mem::take(&mut self.probing) && self.diagnosing.is_none()
    }

    /// Whether verdict `round` is still to be reported here (not past, not reported).
    pub fn open(&self, round: u32) -> bool {
        round >= self.round && self.reported.is_none_or(|r| r < round)
    }

    /// Another node asks for the job's verdict `round`: whether to probe this node's ranks for
    /// it (false: already reported, or a probe or a diagnosis is under way).
    pub fn asked(&mut self, round: u32, until: Instant) -> bool {
        if !self.open(round) {
            return false;
        }
        self.round = round;
        if matches!(self.job, JobVerdict::Idle | JobVerdict::Asked { .. }) {
            self.job = JobVerdict::Asked { round, until };
        }
        if self.probing || self.diagnosing.is_some() {
            return false;
        }
        self.probing = true;
        true
    }

    /// This node reports its candidates for the round under way, if it has not yet: the round.
    /// A node that asks first waits for the verdict until `until`.
    pub fn report(&mut self, until: Instant) -> Option<u32> {
        let round = match self.job {
            JobVerdict::Asked { round, .. } => round,
            JobVerdict::Idle => {
                self.job = JobVerdict::Asked {
                    round: self.round,
                    until,
                };
                self.round
            }
            JobVerdict::Elsewhere { .. } | JobVerdict::Alone => return None,
        };
        if self.reported.is_some_and(|r| r >= round) {
            return None;
        }
        self.reported = Some(round);
        Some(round)
    }

    /// The job's verdict `round` came: whether this node was waiting for it. The next round
    /// follows it either way.
    pub fn named(&mut self, round: u32) -> bool {
        self.round = self.round.max(round + 1);
        let waiting = matches!(self.job, JobVerdict::Asked { round: r, .. } if r == round);
        if waiting {
            self.job = JobVerdict::Idle;
        }
        waiting && self.diagnosing.is_none()
    }

    /// This node decides alone from now on.
    pub fn alone(&self) -> bool {
        self.job == JobVerdict::Alone
    }

    pub fn begin(&mut self, local_rank: u32, hang: Hang, until: Instant) {
        self.seen = true;
        self.diagnosing = Some(Diagnosis {
            local_rank,
            hang,
            until,
        });
    }

    /// Whether `local_rank` is the rank being diagnosed.
    pub fn diagnosing(&self, local_rank: u32) -> bool {
        self.diagnosing
            .as_ref()
            .is_some_and(|d| d.local_rank == local_rank)
    }

    /// Ends the diagnosis: the hung rank and why.
    pub fn conclude(&mut self) -> Option<(u32, Hang)> {
        self.diagnosing.take().map(|d| (d.local_rank, d.hang))
    }

    /// `local_rank` ended on its own: a diagnosis of it is over.
    pub fn rank_ended(&mut self, local_rank: u32) {
        if self.diagnosing(local_rank) {
            self.diagnosing = None;
        }
    }

    /// The attempt is being stopped for another reason, or a new in-process generation began:
    /// no diagnosis goes on, and no job verdict is waited for.
    pub fn cancel(&mut self) {
        self.diagnosing = None;
        self.job = JobVerdict::Idle;
    }
}

/// A rank's pace, from the steps it reported: the latest step, when it came, and a smoothed rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Pace {
    pub step: u64,
    pub at: Instant,
    pub steps_per_s: Option<f64>,
}

impl Pace {
    pub(super) fn new(step: u64, at: Instant) -> Self {
        Pace {
            step,
            at,
            steps_per_s: None,
        }
    }

    /// Folds in a newly reported step (an older or repeated one changes nothing).
    pub(super) fn update(&mut self, step: u64, at: Instant) {
        if step <= self.step {
            return;
        }
        let dt = at.saturating_duration_since(self.at).as_secs_f64();
        if dt > 0.0 {
            let rate = (step - self.step) as f64 / dt;
            // The newest interval weighs most: a rank that speeds up is caught within a few steps.
            self.steps_per_s = Some(match self.steps_per_s {
                Some(old) => 0.5 * old + 0.5 * rate,
                None => rate,
            });
        }
        self.step = step;
        self.at = at;
    }
}

/// A calculation this node shared with the others, waiting for the job's result: what this node
/// could calculate (and which sections), and which local ranks to answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Answering {
    round: u32,
    pub done: Calculated,
    pub sections: Vec<String>,
    pub ranks: Vec<u32>,
}

/// One attempt's calculations.
#[derive(Debug, Clone, Default)]
pub(super) struct Requests {
    /// vigil's own calculation (flags mode) was shared in this attempt.
    pub own_done: bool,
    /// Requests so far (the round of the latest one).
    round: u32,
    /// The request being collected: what was asked and which local ranks asked.
    asking: Option<(CalcRequest, Vec<u32>)>,
    answering: Option<Answering>,
}

impl Requests {
    /// `local_rank` asks for `req` (added to what the others of the node asked).
    pub fn ask(&mut self, local_rank: u32, req: &CalcRequest) {
        let (all, mut ranks) = self.asking.take().unwrap_or_default();
        if !ranks.contains(&local_rank) {
            ranks.push(local_rank);
        }
        self.asking = Some((all.union(req), ranks));
    }

    /// The ranks that asked, while a request is collected and no round waits for its result.
    pub fn collecting(&self) -> Option<&[u32]> {
        match (&self.asking, &self.answering) {
            (Some((_, ranks)), None) => Some(ranks),
            _ => None,
        }
    }

    /// The collected request, to be calculated now.
    pub fn take(&mut self) -> Option<(CalcRequest, Vec<u32>)> {
        self.asking.take()
    }

    /// This node shared its calculation for `ranks`: the round the job's result will carry.
    pub fn share(&mut self, done: Calculated, sections: Vec<String>, ranks: Vec<u32>) -> u32 {
        self.round += 1;
        self.answering = Some(Answering {
            round: self.round,
            done,
            sections,
            ranks,
        });
        self.round
    }

    /// The job's result of `round` came: what it answers, if that round waits for it.
    pub fn answer(&mut self, round: u32) -> Option<Answering> {
        self.answering.take_if(|a| a.round == round)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervise::monitor::HangKind;
    use std::time::Duration;

    fn hang() -> Hang {
        Hang {
            timeout: HangKind::Heartbeat,
            limit_ms: 1000,
            silent_ms: 1500,
            stopped: false,
            raised: None,
        }
    }

    #[test]
    fn a_due_hang_is_probed_once_then_diagnosed_then_concluded() {
        let t = Instant::now();
        let s = Duration::from_secs(1);
        let mut w = HangWatch::default();
        assert_eq!(w.tick(t, None), HangStep::Nothing);
        assert_eq!(w.tick(t, Some(t + s)), HangStep::Nothing);
        assert_eq!(w.tick(t + s, Some(t + s)), HangStep::Probe);
        // Probing: no second probe until the answer comes.
        assert_eq!(w.tick(t + 2 * s, Some(t + s)), HangStep::Nothing);
        assert!(w.probed());
        assert!(!w.probed(), "one answer per probe");
        assert!(!w.seen());
        w.begin(3, hang(), t + 5 * s);
        assert!(w.seen() && w.diagnosing(3) && !w.diagnosing(2));
        assert_eq!(w.deadline(|| Some(t)), Some(t + 5 * s));
        assert_eq!(w.tick(t + 4 * s, Some(t)), HangStep::Nothing);
        assert_eq!(w.tick(t + 5 * s, Some(t)), HangStep::Conclude);
        assert_eq!(w.conclude(), Some((3, hang())));
        assert_eq!(w.conclude(), None);
        assert!(w.seen(), "a hang seen stays seen for the attempt");
        assert_eq!(w.deadline(|| Some(t)), Some(t));
    }

    #[test]
    fn a_diagnosis_ends_with_its_rank_or_a_stop() {
        let t = Instant::now();
        let mut w = HangWatch::default();
        w.begin(1, hang(), t);
        w.rank_ended(0);
        assert!(w.diagnosing(1));
        w.rank_ended(1);
        assert!(!w.diagnosing(1) && w.conclude().is_none());
        w.begin(2, hang(), t);
        w.cancel();
        assert_eq!(w.conclude(), None);
        // A probe answered while a diagnosis runs starts nothing.
        w.begin(2, hang(), t);
        assert_eq!(w.tick(t, Some(t)), HangStep::Conclude);
        assert!(!w.probed());
    }

    #[test]
    fn a_job_verdict_is_asked_once_a_round_and_waited_for_until_its_deadline() {
        let t = Instant::now();
        let s = Duration::from_secs(1);
        let mut w = HangWatch::default();
        assert_eq!(w.tick(t, Some(t)), HangStep::Probe);
        assert!(w.probed());
        // This node asks first: round 0, waited for until t + 10 s.
        assert_eq!(w.report(t + 10 * s), Some(0));
        assert_eq!(w.report(t + 10 * s), None, "one report a round");
        assert!(!w.asked(0, t + 10 * s), "its own ask comes back");
        assert_eq!(w.deadline(|| Some(t)), Some(t + 10 * s));
        assert_eq!(
            w.tick(t + 9 * s, Some(t)),
            HangStep::Nothing,
            "no probe meanwhile"
        );
        // The verdict names a rank elsewhere; the next round is 1.
        assert!(w.named(0));
        assert!(!w.named(0), "once");
        w.job = JobVerdict::Elsewhere { until: t + 20 * s };
        assert_eq!(w.tick(t + 19 * s, Some(t)), HangStep::Nothing);
        // Nothing came of it: this node decides alone.
        assert_eq!(w.tick(t + 20 * s, Some(t)), HangStep::Probe);
        assert!(w.alone() && w.probed());
        assert_eq!(w.report(t), None, "alone: no more reports");
        // Another node's ask for an old round is not answered; a new one is probed for.
        let mut w = HangWatch::default();
        w.named(0);
        assert!(!w.asked(0, t));
        assert!(w.asked(1, t + s));
        assert_eq!(
            w.tick(t, Some(t)),
            HangStep::Nothing,
            "the probe is under way"
        );
        assert!(w.probed());
        assert_eq!(w.report(t), Some(1));
        w.cancel();
        assert_eq!(w.job, JobVerdict::Idle);
    }

    #[test]
    fn requests_go_one_round_at_a_time() {
        let mut r = Requests::default();
        assert_eq!(r.collecting(), None);
        let hb = CalcRequest {
            heartbeat: true,
            ..CalcRequest::default()
        };
        r.ask(1, &hb);
        r.ask(0, &hb);
        r.ask(1, &hb);
        assert_eq!(r.collecting(), Some(&[1, 0][..]));
        let (req, ranks) = r.take().unwrap();
        assert!(req.heartbeat);
        let done = Calculated {
            heartbeat: true,
            sections: false,
            out_of_section: false,
        };
        assert_eq!(r.share(done, vec![], ranks), 1);
        // The next request is collected but waits for round 1's result.
        r.ask(0, &hb);
        assert_eq!(r.collecting(), None);
        assert_eq!(r.answer(2), None, "not the round waited for");
        assert_eq!(r.answer(1).map(|a| a.ranks), Some(vec![1, 0]));
        assert_eq!(r.collecting(), Some(&[0][..]));
        let (_, ranks) = r.take().unwrap();
        assert_eq!(r.share(done, vec![], ranks), 2);
    }
}

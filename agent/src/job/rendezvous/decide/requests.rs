//! What this agent asks of the job and how the coordinator's role passes between agents, as the
//! [`Step`]s each takes: joining an attempt (the join record), the reports (done, timeouts, stop
//! steps, hang candidates) and the stop trigger, a standby departing, leaving; node rank 0's clean store once
//! every member joined; a lost coordinator's successor claiming its lease, and a deposed one
//! stepping down.

use crate::supervise::monitor::Timeouts;
use crate::supervise::{JobEnd, StepReport};

use super::super::wire::{key, to_json, NodeInfo, WireHangCandidate, WireSteps, WireTimeouts};
use super::super::FromCoord;
use super::{poison, Counted, Fact, Joining, Patience, Rendezvous, Stage, Step};

/// Input: this node asks the job to stop `attempt` at a step, for `trigger` (the first trigger
/// written wins; every node is parked on it).
pub fn stop_trigger(attempt: u32, trigger: &str) -> Vec<Step> {
    vec![Step::SetFirst(key::stop(attempt), to_json(&trigger))]
}

impl Rendezvous {
    /// [`Rendezvous::step`] for what this agent asks and the coordinator's succession (the facts
    /// this file answers).
    pub(super) fn asked(&mut self, fact: Fact<'_>) -> Vec<Step> {
        match fact {
            Fact::Join {
                attempt,
                calculated,
                me,
            } => self.join_steps(attempt, calculated, me),
            Fact::ReportDone { attempt } => self.report_done(attempt),
            Fact::ShareTimeouts {
                attempt,
                round,
                timeouts,
            } => self.share_timeouts(attempt, round, timeouts),
            Fact::StopTrigger { attempt, trigger } => stop_trigger(attempt, trigger),
            Fact::StopSteps { attempt, report } => self.share_steps(attempt, report),
            Fact::HangReport {
                attempt,
                round,
                candidates,
            } => self.report_hangs(attempt, round, candidates),
            Fact::Depart { reason } => self.depart(reason),
            Fact::Leave {
                poison,
                highest_step,
                hosts_store,
            } => self.leave(poison, highest_step, hosts_store),
            Fact::AllJoined { attempt } => vec![Step::ReadEarlyVerdict(attempt)],
            Fact::NoEarlyVerdict { attempt } => self.reset_and_read(attempt),
            Fact::CoordinatorGone { old } => self.coordinator_gone(old),
            Fact::LeasesRead {
                old,
                leased,
                job_ended,
            } => self.leases_read(old, leased, job_ended),
            Fact::CoordinatorClaimed {
                old,
                alive,
                from,
                held,
            } => self.coordinator_claimed(old, alive, from, held),
            Fact::Deposed { reason } => self.step_down(reason),
            _ => unreachable!("Rendezvous::step hands {fact:?} elsewhere"),
        }
    }

    /// Input: this agent joins `attempt` ([`Rendezvous::join`]) with `me` as its join record, its
    /// last health check put in. Node rank 0 lost a node for good: the attempt (and the next)
    /// end with that, and the runtime is told so.
    pub fn join_steps(
        &mut self,
        attempt: u32,
        calculated: Option<Timeouts>,
        me: &NodeInfo,
    ) -> Vec<Step> {
        match self.join(attempt, calculated) {
            Joining::Join { healthy } => {
                let record = NodeInfo {
                    healthy,
                    ..me.clone()
                };
                vec![Step::Join {
                    attempt,
                    record: to_json(&record),
                    members: self.spares(),
                }]
            }
            Joining::Ended(end) => {
                let mut steps = poison(attempt, &end);
                steps.push(Step::Tell(FromCoord::attempt_ended(attempt, end)));
                steps
            }
        }
    }

    /// Input: this node's ranks all exited 0 in `attempt`: count it among the slots (a standby
    /// reports nothing).
    pub fn report_done(&self, attempt: u32) -> Vec<Step> {
        if !self.in_slots() {
            return Vec::new();
        }
        vec![Step::Add(key::done(attempt), Counted::Done(attempt))]
    }

    /// Input: this node's calculated timeouts for `attempt`'s `round`: write them, park on the
    /// job-wide ones and count itself (a standby shares none).
    pub fn share_timeouts(&self, attempt: u32, round: u32, timeouts: &Timeouts) -> Vec<Step> {
        if !self.in_slots() {
            return Vec::new();
        }
        let me = self.setup.node_rank;
        let mine = to_json(&WireTimeouts::from(timeouts));
        vec![
            Step::Set(key::node_timeouts(attempt, round, me), mine),
            Step::WaitTimeouts { attempt, round },
            Step::Add(
                key::timeouts_count(attempt, round),
                Counted::Timeouts { attempt, round },
            ),
        ]
    }

    /// Input: this node's ranks' steps once a stop was asked in `attempt`: write them and count
    /// itself (a standby reports none).
    pub fn share_steps(&self, attempt: u32, report: &StepReport) -> Vec<Step> {
        if !self.in_slots() {
            return Vec::new();
        }
        let me = self.setup.node_rank;
        vec![
            Step::Set(
                key::stop_steps(attempt, me),
                to_json(&WireSteps::from(report)),
            ),
            Step::Add(key::stop_count(attempt), Counted::Steps(attempt)),
        ]
    }

    /// Input: this node's hang candidates for `attempt`'s verdict `round`: ask every node for
    /// theirs (the first ask is written; every node is parked on it), write this node's and
    /// count itself; the last to count chooses ([`Fact::HangsCounted`]).
    pub fn report_hangs(
        &self,
        attempt: u32,
        round: u32,
        candidates: &[WireHangCandidate],
    ) -> Vec<Step> {
        let me = self.setup.node_rank;
        vec![
            Step::SetFirst(key::hang(attempt, round), b"1".to_vec()),
            Step::Set(key::hang_report(attempt, round, me), to_json(&candidates)),
            Step::Add(
                key::hang_count(attempt, round),
                Counted::Hangs { attempt, round },
            ),
        ]
    }

    /// Input: a standby leaves the job on a signal: it says why (`key::left`) and keeps its
    /// lease until its connection closes ([`Rendezvous::leave`]), so the coordinator hears of it
    /// as a lost lease and reads the reason.
    pub fn depart(&mut self, reason: String) -> Vec<Step> {
        self.departed = true;
        vec![Step::Set(
            key::left(self.setup.node_rank),
            reason.into_bytes(),
        )]
    }

    /// Input: this agent leaves the job. A `poison` (this agent's job ended, and the others may
    /// still wait on the attempt) ends that attempt and the next for every node, unless it was
    /// deposed. Then: an agent that does not coordinate writes its ranks' highest step and that
    /// it left, not lost (node rank 0 stops watching a counter below 1), and gives its lease
    /// back, unless it departed (its lease ends with its connection: a lost lease, which the
    /// coordinator hears of); a coordinator through a store outside the job says it left and
    /// writes the job's end (the store outlives it and clears the job once every agent left);
    /// node rank 0 hosting the store keeps it up for the others ([`Step::HoldStore`]).
    pub fn leave(
        &self,
        end: Option<(u32, JobEnd)>,
        highest_step: Option<u64>,
        hosts_store: bool,
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        if let Some((c, end)) = end.filter(|_| !self.deposed) {
            steps.push(Step::Bounded(poison(c, &end)));
        }
        let me = self.setup.node_rank;
        let left = || Step::Set(key::alive(me), b"-1".to_vec());
        match (self.setup.head, hosts_store) {
            (false, _) if self.departed => {}
            (false, _) => {
                let highest =
                    highest_step.map(|s| Step::Set(key::highest(me), s.to_string().into_bytes()));
                let writes = highest
                    .into_iter()
                    .chain([left(), Step::Delete(key::lease(me))]);
                steps.push(Step::BestEffort(writes.collect()));
            }
            (true, false) => steps.push(Step::BestEffort(vec![
                left(),
                Step::Set(key::JOB_END.to_string(), Vec::new()),
            ])),
            (true, true) => steps.push(Step::HoldStore),
        }
        steps
    }

    /// Input (node rank 0): no verdict was written for attempt `c` before every member joined:
    /// every node's ranks of the last attempt are gone, so `c` gets a clean store; then the
    /// members' join records are read to assign it.
    pub fn reset_and_read(&self, c: u32) -> Vec<Step> {
        vec![
            Step::ResetStore {
                previous: c.checked_sub(1),
            },
            Step::ReadRecords {
                attempt: c,
                members: self.members(),
            },
        ]
    }

    /// Input (the store outside the job): the coordinator's lease, held by node `old`, is gone.
    /// An agent that coordinates already has nothing to do; any other reads the leases to find
    /// whether it succeeds `old` ([`Rendezvous::leases_read`]).
    pub fn coordinator_gone(&self, old: u32) -> Vec<Step> {
        if self.setup.head {
            return Vec::new();
        }
        vec![Step::ReadLeases { old }]
    }

    /// Input: every node's lease as read (`leased`, by node rank) and whether the job's end is
    /// written: the live agent with the lowest node rank claims the coordinator's lease
    /// ([`Rendezvous::successor`]); any other leaves it to that one (and is told again next
    /// period if nobody took it).
    pub fn leases_read(&self, old: u32, leased: &[bool], job_ended: bool) -> Vec<Step> {
        match self.successor(old, leased, job_ended) {
            Some(alive) => vec![Step::ClaimCoordinator {
                old,
                alive,
                from: Vec::new(),
            }],
            None => Vec::new(),
        }
    }

    /// Input: the coordinator's lease holds `held` after this agent's claim from `from`. The
    /// lease is taken from either a coordinator gone with its connection (empty) or one frozen
    /// past the node timeout that still holds it (its lease has expired): from empty first, and
    /// from `old`'s value if that is what it holds. Won: the record of the old coordinator's
    /// loss is this one's to clear (so that the next loss is a new record); it says so,
    /// coordinates from now on, rebuilds the coordinator's state ([`Rendezvous::take_over`]) and
    /// loses `old` as any node; a wait on a verdict only it writes now becomes a wait on every
    /// member. Lost: another agent coordinates.
    pub fn coordinator_claimed(
        &mut self,
        old: u32,
        alive: &[u32],
        from: &[u8],
        held: &[u8],
    ) -> Vec<Step> {
        if from.is_empty() && held == old.to_string().as_bytes() {
            return vec![Step::ClaimCoordinator {
                old,
                alive: alive.to_vec(),
                from: held.to_vec(),
            }];
        }
        if held != self.setup.node_rank.to_string().as_bytes() {
            return Vec::new();
        }
        let reason = format!(
            "node {old} was lost: its agent, the job's coordinator, lost its connection to the store or was silent for --node-timeout"
        );
        let mut steps = vec![
            Step::Delete(key::COORD_LOST.to_string()),
            Step::Tell(FromCoord::Coordinating { lost: old }),
            Step::Coordinate,
        ];
        let loss = self.take_over(old, alive, reason);
        if let Stage::WaitAll(c) = self.stage {
            steps.push(Step::Wait(key::all(c), Patience::Join));
        }
        steps.extend(self.carry(loss));
        steps
    }

    /// Input (the store outside the job): another agent took the coordinator's lease over from
    /// this one. It stops coordinating and the job cannot go on here; it leaves without deciding
    /// anything more for the job ([`Rendezvous::leave`]).
    pub fn step_down(&mut self, reason: String) -> Vec<Step> {
        self.deposed = true;
        self.setup.head = false;
        vec![Step::StepDown, self.lost(reason)]
    }
}

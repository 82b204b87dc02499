//! The [`Step`]s that carry the state machine's decisions out, for the coordinator, and its one
//! entry [`Rendezvous::step`], which takes a [`Fact`] and answers with them.

use std::time::Duration;

use crate::supervise::monitor::Timeouts;
use crate::supervise::{
    choose_hung, choose_stop_step, Event, HangKey, JobEnd, StepReport, AGREEMENT_BUDGET,
};

use super::super::wire::{
    key, to_json, NodeInfo, Verdict, WireEnd, WireHangCandidate, WireSteps, WireTimeouts,
};
use super::super::FromCoord;
use super::{
    last_call_note, merge_timeouts, AfterLoss, Decision, LastCall, Loss, Proposal, Rendezvous,
    Stage,
};

/// What the coordinator carries out for the state machine, in order: a store operation, a wait,
/// or a message for this agent's runtime. The coordinator decides none of them.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Write `value` at the key.
    Set(String, Vec<u8>),
    /// Write `value` at the key unless one is there (compare-and-set from empty: the first write
    /// wins).
    SetFirst(String, Vec<u8>),
    /// Park on the key (the rendezvous' next wait).
    Wait(String, Patience),
    /// Node rank 0: propose this verdict for attempt N (`c<N>/go`, the first written wins) and
    /// take the winner as the verdict ([`Rendezvous::verdict`]).
    Propose(u32, Vec<u8>),
    /// Node rank 0: read how many joined attempt N (`c<N>/joined`) and complete its rendezvous if
    /// the members all did ([`Rendezvous::joins_counted`]).
    CountJoins(u32),
    /// Node rank 0: (re)start the last call of attempt N's rendezvous (lastcall.rs).
    LastCall(u32),
    /// Read every slot's timeouts for attempt N's round and hand them back
    /// ([`Rendezvous::timeouts_read`]).
    MergeTimeouts { attempt: u32, round: u32 },
    /// Read every slot's stop steps for attempt N and hand them back ([`Rendezvous::steps_read`]).
    ChooseStopStep(u32),
    /// Read every slot's hang candidates for attempt N's verdict `round` and hand them back
    /// ([`Rendezvous::hangs_read`]).
    ChooseHung { attempt: u32, round: u32 },
    /// Park on in-process generation `g` of attempt N (`c<N>/gen/<g>`) beside the rendezvous'
    /// wait, and hand what is written there back ([`Fact::GenerationRead`]).
    WaitGeneration(u32, u64),
    /// Tell this agent's runtime.
    Tell(FromCoord),
    /// Delete the key.
    Delete(String),
    /// Add 1 to the counter at the key and hand the count back as the [`Fact`] that `Counted`
    /// names.
    Add(String, Counted),
    /// Write this node's join `record` for attempt N and count it (`c<N>/joined`), then hand the
    /// count back ([`Fact::Counted`]). With standbys (`members`) the record, `c<N>/members` as
    /// read (if written) and the count, one after the other; else the record and the count in
    /// one request (JOIN), the record first.
    Join {
        attempt: u32,
        record: Vec<u8>,
        members: bool,
    },
    /// (Re)park on the job-wide timeouts of attempt N's round, instead of any earlier round's
    /// (a node shares a round only once its previous one was answered, so a wait still parked
    /// belongs to a round nobody completes); what is written is handed to the runtime.
    WaitTimeouts { attempt: u32, round: u32 },
    /// Node rank 0: read whether attempt N's verdict was written before every member joined (a
    /// node that stopped for good writes it before `all`): hand back [`Fact::Verdict`] if so,
    /// else [`Fact::NoEarlyVerdict`].
    ReadEarlyVerdict(u32),
    /// Node rank 0: give attempt N a clean store: every key but the agents' own (`vigil/`), and
    /// the ranks' keys of the `previous` attempt.
    ResetStore { previous: Option<u32> },
    /// Node rank 0: read these members' join records for attempt N, in order, and hand them back
    /// ([`Fact::Records`]).
    ReadRecords { attempt: u32, members: Vec<u32> },
    /// The store outside the job: read every node's lease and the job's end, and hand them back
    /// ([`Fact::LeasesRead`]) to find whether this agent succeeds lost coordinator `old`.
    ReadLeases { old: u32 },
    /// Claim the coordinator's lease by compare-and-set from `from` (empty: nobody holds it) and
    /// hand back who holds it now ([`Fact::CoordinatorClaimed`]).
    ClaimCoordinator {
        old: u32,
        alive: Vec<u32>,
        from: Vec<u8>,
    },
    /// This agent coordinates the job from now on: it reads the store's lease queue and its
    /// liveness watches every node.
    Coordinate,
    /// Another agent took the coordinator's lease over: this one stops coordinating.
    StepDown,
    /// Carry these out in order within one peer timeout (`--node-timeout`); the first store
    /// error stops them (the agent is leaving: nothing waits longer).
    Bounded(Vec<Step>),
    /// Try each of these in order, within one peer timeout in all; an error skips to the next
    /// (the agent is leaving and its connection may be gone).
    BestEffort(Vec<Step>),
    /// Node rank 0 hosting the store, leaving: keep it up until every other agent has left or
    /// was lost, for at most one peer timeout (they may still read this attempt's verdict).
    HoldStore,
}

/// What the count of a [`Step::Add`] is of, and so which [`Fact`] hands it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Slots whose ranks all exited 0 in attempt N ([`Fact::DoneCounted`]).
    Done(u32),
    /// Slots that shared their timeouts for attempt N's round ([`Fact::TimeoutsCounted`]).
    Timeouts { attempt: u32, round: u32 },
    /// Slots that reported their steps after a stop was asked in attempt N
    /// ([`Fact::StepsCounted`]).
    Steps(u32),
    /// Slots that reported their hang candidates for attempt N's verdict round
    /// ([`Fact::HangsCounted`]).
    Hangs { attempt: u32, round: u32 },
}

impl Counted {
    /// The fact that hands `count` back.
    pub fn fact(self, count: i64) -> Fact<'static> {
        match self {
            Counted::Done(attempt) => Fact::DoneCounted { attempt, count },
            Counted::Timeouts { attempt, round } => Fact::TimeoutsCounted {
                attempt,
                round,
                count,
            },
            Counted::Steps(attempt) => Fact::StepsCounted { attempt, count },
            Counted::Hangs { attempt, round } => Fact::HangsCounted {
                attempt,
                round,
                count,
            },
        }
    }
}

/// How long a [`Step::Wait`] waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// A rendezvous: at most `--join-timeout`.
    Join,
    /// An attempt's end: as long as it runs.
    Forever,
}

/// Ends attempt `c` and the next one with `end` for every node still waiting on them; a verdict
/// already given stays (compare-and-set). `all` is set after `go` so that node rank 0, parked
/// until every node joined, wakes and finds the verdict.
pub fn poison(c: u32, end: &JobEnd) -> Vec<Step> {
    let end = WireEnd::from(end);
    let verdict = to_json(&Verdict::End(end.clone()));
    let end = to_json(&end);
    [c, c + 1]
        .into_iter()
        .flat_map(|attempt| {
            [
                Step::SetFirst(key::go(attempt), verdict.clone()),
                Step::SetFirst(key::end(attempt), end.clone()),
                Step::Set(key::all(attempt), Vec::new()),
            ]
        })
        .collect()
}

/// Every slot's hang candidates for `attempt`'s verdict `round` as read: the job's verdict, by
/// [`choose_hung`] (the first written wins).
pub fn hangs_read(attempt: u32, round: u32, all: Vec<Vec<WireHangCandidate>>) -> Vec<Step> {
    let keyed: Vec<(WireHangCandidate, u64)> = all
        .into_iter()
        .flatten()
        .map(|c| {
            let since = c.silent_since_ms;
            (c, since)
        })
        .collect();
    let hung = choose_hung(&keyed, |c| HangKey {
        stopped: c.stopped,
        waiting: c.waiting == Some(true),
        step: c.step,
        rank: c.rank,
    });
    vec![Step::SetFirst(
        key::hang_named(attempt, round),
        to_json(&hung),
    )]
}

/// The writes that say `members` agents join `attempts` from now on.
fn members_of(members: usize, attempts: [u32; 2]) -> impl Iterator<Item = Step> {
    let m = members.to_string().into_bytes();
    attempts
        .into_iter()
        .map(move |c| Step::Set(key::members(c), m.clone()))
}

impl Rendezvous {
    /// What a [`Decision`] takes: park on the attempt's end, tell the runtime, or end `Lost`.
    pub fn steps(&mut self, d: Decision) -> Vec<Step> {
        match d {
            Decision::Run(c, m) => {
                let mut steps = vec![Step::Wait(key::end(c), Patience::Forever), Step::Tell(m)];
                // Beside the attempt's end, its in-process generations (docs/inprocess.md).
                if self.setup.in_process {
                    steps.push(Step::WaitGeneration(c, 1));
                }
                steps
            }
            Decision::Tell(m) => vec![Step::Tell(m)],
            Decision::Fail(why) => vec![self.lost(why)],
        }
    }

    /// The job cannot go on on this agent: the message that ends it ([`Rendezvous::fail`]).
    pub fn lost(&mut self, why: String) -> Step {
        Step::Tell(FromCoord::lost(self.fail(why), true))
    }

    /// Input: this agent joined `attempt` (after [`Rendezvous::join`]) as the `nth`, with
    /// `c<N>/members` as read. The last to join completes the rendezvous (`all`); with a last
    /// call, each joiner says it came (`c0/nth/<k>`) and node rank 0 (re)starts the call; then
    /// it waits for `all` (node rank 0) or the verdict.
    pub fn counted(&self, attempt: u32, nth: i64, members: Option<&[u8]>) -> Vec<Step> {
        let mut steps = Vec::new();
        if nth == self.joins_expected(members) {
            steps.push(Step::Set(key::all(attempt), Vec::new()));
        }
        let waits_all = self.stage == Stage::WaitAll(attempt);
        if self.has_last_call(attempt) {
            steps.push(Step::Set(key::nth_join(attempt, nth), Vec::new()));
            if waits_all {
                steps.push(Step::LastCall(attempt));
            }
        }
        let next = if waits_all {
            key::all(attempt)
        } else {
            key::go(attempt)
        };
        steps.push(Step::Wait(next, Patience::Join));
        steps
    }

    /// Input (node rank 0): every member's join record for `attempt` as read, in
    /// [`Self::members`] order. With standbys and nodes lost for good, the next rendezvous waits
    /// for the members only (`c<N+1>/members`); then the hosts and promotions are told and the
    /// assignment proposed, or the job ends.
    pub fn propose(&mut self, attempt: u32, records: &[(u32, Vec<u8>)]) -> Vec<Step> {
        let members = self.members().len();
        let mut steps = Vec::new();
        if self.spares() && members < self.setup.nnodes as usize {
            // Nodes lost for good (or absent at the last call) stay out of every later
            // rendezvous.
            let m = members.to_string().into_bytes();
            steps.push(Step::Set(key::members(attempt + 1), m));
        }
        match self.assign(attempt, records) {
            Ok(Proposal {
                go,
                promotions,
                hosts,
            }) => {
                steps.push(Step::Tell(FromCoord::Hosts { attempt, hosts }));
                if !promotions.is_empty() {
                    steps.push(Step::Tell(FromCoord::Promoted {
                        attempt,
                        promotions,
                    }));
                }
                if self.spares() {
                    let ready = self.spares_ready(&go.slots);
                    steps.push(Step::Tell(FromCoord::SparesReady { attempt, ready }));
                }
                steps.push(Step::Propose(attempt, to_json(&Verdict::Go(go))));
            }
            Err(why) => steps.push(self.lost(why.to_string())),
        }
        steps
    }

    /// Input (node rank 0): `joined` nodes joined attempt `c` when a member was lost to a standby
    /// during its rendezvous: if every member left did, it completes without the lost one.
    pub fn joins_counted(&self, c: u32, joined: usize) -> Vec<Step> {
        if joined >= self.members().len() {
            vec![Step::Set(key::all(c), Vec::new())]
        } else {
            Vec::new()
        }
    }

    /// What losing a node takes ([`Loss`]): the members from now on and the attempt under way
    /// completed or ended, the job ended for every node, or this agent's end.
    pub fn carry(&mut self, loss: Loss) -> Vec<Step> {
        let (mut steps, then) = match loss {
            Loss::Nothing => return Vec::new(),
            Loss::Fail(why) => return vec![self.lost(why)],
            Loss::Job { attempt, end } => return poison(attempt, &end),
            Loss::ToStandby {
                members,
                attempts,
                then,
                node,
                reason,
                standby_gone,
            } => {
                let mut steps: Vec<Step> = members_of(members, attempts).collect();
                // A node lost for good whose agent still runs (frozen past the node timeout)
                // reads this when it wakes and leaves the job.
                steps.push(Step::Set(key::dropped(node), reason.clone().into_bytes()));
                if let Some(ready) = standby_gone {
                    let gone = FromCoord::StandbyGone {
                        node,
                        reason,
                        ready,
                    };
                    steps.push(Step::Tell(gone));
                }
                (steps, then)
            }
        };
        match then {
            AfterLoss::Nothing => {}
            AfterLoss::CompleteJoin(c) => steps.push(Step::CountJoins(c)),
            AfterLoss::EndAttempt { attempt, end } => {
                let end = to_json(&WireEnd::from(&end));
                steps.push(Step::SetFirst(key::end(attempt), end));
            }
        }
        steps
    }

    /// Input (node rank 0, `--nnodes MIN:MAX`): attempt `c`'s last call ran out with the
    /// `present` members' join records there ([`Rendezvous::last_call`]); `last_call` is how
    /// long it waited. Starting without the absent ones: say so, write the members, complete
    /// the rendezvous.
    pub fn last_call_out(&mut self, c: u32, present: &[u32], last_call: Duration) -> Vec<Step> {
        let LastCall::Start {
            members,
            attempts,
            absent,
        } = self.last_call(c, present)
        else {
            return Vec::new();
        };
        let note = last_call_note(c, members, self.setup.nnodes, &absent, last_call);
        let mut steps = vec![Step::Tell(FromCoord::Note(note))];
        steps.extend(members_of(members, attempts));
        steps.push(Step::Set(key::all(c), Vec::new()));
        steps
    }

    /// Input: attempt `attempt`'s ranks on this node ended with `end` (the first report wins).
    pub fn report_end(&self, attempt: u32, end: &JobEnd) -> Vec<Step> {
        let mut steps = Vec::new();
        if let JobEnd::Failed { node, .. } = end {
            steps.push(Step::Set(key::failed(attempt, *node), Vec::new()));
        }
        steps.push(Step::SetFirst(
            key::end(attempt),
            to_json(&WireEnd::from(end)),
        ));
        steps
    }

    /// Input: this node counted itself the `count`th whose ranks all exited 0 in `attempt`: the
    /// last slot to do so ends the attempt done.
    pub fn done_counted(&self, attempt: u32, count: i64) -> Vec<Step> {
        if self.all_reported(count) {
            vec![Step::SetFirst(key::end(attempt), to_json(&WireEnd::Done))]
        } else {
            Vec::new()
        }
    }

    /// Input: this node counted itself the `count`th to share its timeouts for `attempt`'s
    /// `round`: the last slot to do so merges everyone's.
    pub fn timeouts_counted(&self, attempt: u32, round: u32, count: i64) -> Vec<Step> {
        if self.all_reported(count) {
            vec![Step::MergeTimeouts { attempt, round }]
        } else {
            Vec::new()
        }
    }

    /// Input: every slot's timeouts for `attempt`'s `round` as read (one that does not convert is
    /// left out): the job-wide ones, the longest of each, for every node.
    pub fn timeouts_read(&self, attempt: u32, round: u32, all: &[WireTimeouts]) -> Vec<Step> {
        let all: Vec<Timeouts> = all.iter().filter_map(|w| w.try_into().ok()).collect();
        let merged = WireTimeouts::from(&merge_timeouts(&all));
        vec![Step::Set(key::timeouts(attempt, round), to_json(&merged))]
    }

    /// Input: this node counted itself the `count`th to report its ranks' steps after a stop
    /// was asked in `attempt`: the last slot to do so chooses the stop step.
    pub fn steps_counted(&self, attempt: u32, count: i64) -> Vec<Step> {
        if self.all_reported(count) {
            vec![Step::ChooseStopStep(attempt)]
        } else {
            Vec::new()
        }
    }

    /// Input: every slot's step report for `attempt` as read: the job's stop step (the first
    /// written wins).
    pub fn steps_read(&self, attempt: u32, all: Vec<WireSteps>) -> Vec<Step> {
        let all: Vec<StepReport> = all.into_iter().map(StepReport::from).collect();
        let step = choose_stop_step(&all, AGREEMENT_BUDGET);
        vec![Step::SetFirst(key::stop_step(attempt), to_json(&step))]
    }

    /// Input (the store outside the job, not coordinating): the coordinator, node `old`, is
    /// gone; `leased`: whether each node's lease is held, by node rank; `job_ended`: the job's
    /// end is written. The live agents, if this one is the lowest of them and so is to take the
    /// coordinator's lease over; `None`: leave it (to a lower one, or nobody: the job ended).
    pub fn successor(&self, old: u32, leased: &[bool], job_ended: bool) -> Option<Vec<u32>> {
        if self.setup.head || !self.setup.outside || job_ended {
            return None;
        }
        let me = self.setup.node_rank;
        let alive: Vec<u32> = (0..self.setup.nnodes)
            .filter(|n| *n == me || (*n != old && leased.get(*n as usize) == Some(&true)))
            .collect();
        (alive.first() == Some(&me)).then_some(alive)
    }
}

/// An input of the state machine: what this agent asked or the store said, as
/// [`Rendezvous::step`] takes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Fact<'a> {
    /// This agent counted itself the `nth` to join `attempt`; `members`: `c<N>/members` as read.
    Counted {
        attempt: u32,
        nth: i64,
        members: Option<&'a [u8]>,
    },
    /// Node rank 0: every member's join record for `attempt`, as read.
    Records {
        attempt: u32,
        records: &'a [(u32, Vec<u8>)],
    },
    /// Attempt N's verdict as read (`c<N>/go`).
    Verdict { attempt: u32, value: &'a [u8] },
    /// Attempt N's end as read (`c<N>/end`).
    Ended { attempt: u32, value: &'a [u8] },
    /// Node rank 0: how many joined attempt N, after a member was lost to a standby.
    JoinsCounted { attempt: u32, joined: usize },
    /// Node rank 0: a lease closed (`node`: `None` for a key that names no node).
    LeaseLost { node: Option<u32>, reason: String },
    /// Liveness found `node` silent (`None`: the store).
    Silent { node: Option<u32>, reason: String },
    /// This agent asks to join `attempt` as `me` (its join record; the health is the
    /// rendezvous' own); node rank 0 hands `calculated` to every node.
    Join {
        attempt: u32,
        calculated: Option<Timeouts>,
        me: &'a NodeInfo,
    },
    /// This node's ranks all exited 0 in `attempt`.
    ReportDone { attempt: u32 },
    /// This node's calculated timeouts for `attempt`'s `round`.
    ShareTimeouts {
        attempt: u32,
        round: u32,
        timeouts: &'a Timeouts,
    },
    /// This node asks the job to stop `attempt` at a step, for `trigger`.
    StopTrigger { attempt: u32, trigger: &'a str },
    /// This node's ranks' steps once a stop was asked in `attempt`.
    StopSteps {
        attempt: u32,
        report: &'a StepReport,
    },
    /// This node's hang candidates for `attempt`'s verdict `round`, on the wire (their silence
    /// as wall time).
    HangReport {
        attempt: u32,
        round: u32,
        candidates: &'a [WireHangCandidate],
    },
    /// A standby leaves the job on a signal, for `reason`.
    Depart { reason: String },
    /// This agent leaves: ending `poison`'s attempt and the next with its end (if any), with
    /// `highest_step` its ranks' highest step; `hosts_store`: it hosts the job's store.
    Leave {
        poison: Option<(u32, JobEnd)>,
        highest_step: Option<u64>,
        hosts_store: bool,
    },
    /// Node rank 0: every member joined `attempt` (`c<N>/all`).
    AllJoined { attempt: u32 },
    /// Node rank 0: no verdict was written for `attempt` before every member joined.
    NoEarlyVerdict { attempt: u32 },
    /// The store outside the job: the coordinator's lease, held by node `old`, is gone.
    CoordinatorGone { old: u32 },
    /// Whether each node's lease is held, by node rank, and whether the job's end is written.
    LeasesRead {
        old: u32,
        leased: &'a [bool],
        job_ended: bool,
    },
    /// The coordinator's lease holds `held` after this agent's claim from `from` ([`Step::ClaimCoordinator`]).
    CoordinatorClaimed {
        old: u32,
        alive: &'a [u32],
        from: &'a [u8],
        held: &'a [u8],
    },
    /// The store outside the job: another agent took the coordinator's lease over from this one.
    Deposed { reason: String },
    /// Node rank 0: attempt N's last call ran out with the `present` members' records there.
    LastCallOut {
        attempt: u32,
        present: &'a [u32],
        waited: Duration,
    },
    /// This node's ranks ended `attempt` with `end`.
    ReportEnd { attempt: u32, end: &'a JobEnd },
    /// This node counted itself the `count`th done in `attempt`.
    DoneCounted { attempt: u32, count: i64 },
    /// This node counted itself the `count`th to share its timeouts for the round.
    TimeoutsCounted {
        attempt: u32,
        round: u32,
        count: i64,
    },
    /// Every slot's timeouts for the round, as read.
    TimeoutsRead {
        attempt: u32,
        round: u32,
        all: &'a [WireTimeouts],
    },
    /// This node counted itself the `count`th to report its steps in `attempt`.
    StepsCounted { attempt: u32, count: i64 },
    /// Every slot's step report for `attempt`, as read.
    StepsRead { attempt: u32, all: Vec<WireSteps> },
    /// This node's supervisor began in-process generation `generation` of `attempt`, replacing
    /// these global ranks.
    GenerationBegun {
        attempt: u32,
        generation: u64,
        replaced: &'a [u32],
    },
    /// This node counted itself the `count`th to report its hang candidates for `round`.
    HangsCounted {
        attempt: u32,
        round: u32,
        count: i64,
    },
    /// Every slot's hang candidates for `round`, as read.
    HangsRead {
        attempt: u32,
        round: u32,
        all: Vec<Vec<WireHangCandidate>>,
    },
    /// In-process generation `generation` of `attempt` as written (`c<N>/gen/<g>`).
    GenerationRead {
        attempt: u32,
        generation: u64,
        value: &'a [u8],
    },
}

impl Rendezvous {
    /// The state machine's one entry for the coordinator: what to carry out, in order, for
    /// `fact`.
    pub fn step(&mut self, fact: Fact<'_>) -> Vec<Step> {
        match fact {
            Fact::Counted {
                attempt,
                nth,
                members,
            } => self.counted(attempt, nth, members),
            Fact::Records { attempt, records } => self.propose(attempt, records),
            Fact::Verdict { attempt, value } => {
                let d = self.verdict(attempt, value);
                self.steps(d)
            }
            Fact::Ended { attempt, value } => {
                let d = self.ended(attempt, value);
                self.steps(d)
            }
            Fact::JoinsCounted { attempt, joined } => self.joins_counted(attempt, joined),
            Fact::LeaseLost { node, reason } => {
                let loss = self.lease_lost(node, reason);
                self.carry(loss)
            }
            Fact::Silent { node, reason } => {
                let loss = self.silent(node, reason);
                self.carry(loss)
            }
            asked @ (Fact::Join { .. }
            | Fact::ReportDone { .. }
            | Fact::ShareTimeouts { .. }
            | Fact::StopTrigger { .. }
            | Fact::StopSteps { .. }
            | Fact::HangReport { .. }
            | Fact::Depart { .. }
            | Fact::Leave { .. }
            | Fact::AllJoined { .. }
            | Fact::NoEarlyVerdict { .. }
            | Fact::CoordinatorGone { .. }
            | Fact::LeasesRead { .. }
            | Fact::CoordinatorClaimed { .. }
            | Fact::Deposed { .. }) => self.asked(asked),
            Fact::LastCallOut {
                attempt,
                present,
                waited,
            } => self.last_call_out(attempt, present, waited),
            Fact::ReportEnd { attempt, end } => self.report_end(attempt, end),
            Fact::DoneCounted { attempt, count } => self.done_counted(attempt, count),
            Fact::TimeoutsCounted {
                attempt,
                round,
                count,
            } => self.timeouts_counted(attempt, round, count),
            Fact::TimeoutsRead {
                attempt,
                round,
                all,
            } => self.timeouts_read(attempt, round, all),
            Fact::StepsCounted { attempt, count } => self.steps_counted(attempt, count),
            Fact::StepsRead { attempt, all } => self.steps_read(attempt, all),
            Fact::HangsCounted {
                attempt,
                round,
                count,
            } => {
                if self.all_reported(count) {
                    vec![Step::ChooseHung { attempt, round }]
                } else {
                    Vec::new()
                }
            }
            Fact::HangsRead {
                attempt,
                round,
                all,
            } => hangs_read(attempt, round, all),
            Fact::GenerationBegun {
                attempt,
                generation,
                replaced,
            } => generation_begun(attempt, generation, replaced),
            Fact::GenerationRead {
                attempt,
                generation,
                value,
            } => self.generation_read(attempt, generation, value),
        }
    }

    /// Input: in-process generation `generation` of `attempt` as written. Every node, the one
    /// that began it too, hears of the one that won (its supervisor escalates to a whole
    /// restart when that is not the one it began) and parks on the next. A generation of a
    /// attempt this node no longer runs is nobody's news.
    pub fn generation_read(&self, attempt: u32, generation: u64, value: &[u8]) -> Vec<Step> {
        if self.stage != Stage::Running(attempt) {
            return Vec::new();
        }
        let replaced = serde_json::from_slice::<Vec<u32>>(value).ok();
        vec![
            Step::Tell(FromCoord::Event(Event::GenerationBegun {
                attempt,
                generation,
                replaced,
            })),
            Step::WaitGeneration(attempt, generation + 1),
        ]
    }
}

/// Input: this node began in-process generation `generation` of `attempt`: propose it to the job
/// (the first written wins; a node that loses hears of the winner and escalates).
pub fn generation_begun(attempt: u32, generation: u64, replaced: &[u32]) -> Vec<Step> {
    vec![Step::SetFirst(
        key::generation(attempt, generation),
        to_json(&replaced),
    )]
}

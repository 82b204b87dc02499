//! The [`Step`]s that carry the state machine's decisions out, for the coordinator, and its one
//! entry [`Rendezvous::step`], which takes a [`Fact`] and answers with them.

use std::time::Duration;

use crate::supervise::monitor::Timeouts;
use crate::supervise::{choose_stop_step, Event, JobEnd, StepReport, AGREEMENT_BUDGET};

use super::super::wire::{key, to_json, Verdict, WireEnd, WireSteps, WireTimeouts};
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
    /// Node rank 0: propose this verdict for cycle N (`c<N>/go`, the first written wins) and
    /// take the winner as the verdict ([`Rendezvous::verdict`]).
    Propose(u32, Vec<u8>),
    /// Node rank 0: read how many joined cycle N (`c<N>/joined`) and complete its rendezvous if
    /// the members all did ([`Rendezvous::joins_counted`]).
    CountJoins(u32),
    /// Node rank 0: (re)start the last call of cycle N's rendezvous (lastcall.rs).
    LastCall(u32),
    /// Read every slot's timeouts for cycle N's round and hand them back
    /// ([`Rendezvous::timeouts_read`]).
    MergeTimeouts { cycle: u32, round: u32 },
    /// Read every slot's stop steps for cycle N and hand them back ([`Rendezvous::steps_read`]).
    ChooseStopStep(u32),
    /// Park on in-process generation `g` of cycle N (`c<N>/gen/<g>`) beside the rendezvous'
    /// wait, and hand what is written there back ([`Fact::GenerationRead`]).
    WaitGeneration(u32, u64),
    /// Tell this agent's runtime.
    Tell(FromCoord),
}

/// How long a [`Step::Wait`] waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// A rendezvous: at most `--join-timeout`.
    Join,
    /// A cycle's end: as long as it runs.
    Forever,
}

/// Ends cycle `c` and the next one with `end` for every node still waiting on them; a verdict
/// already given stays (compare-and-set). `all` is set after `go` so that node rank 0, parked
/// until every node joined, wakes and finds the verdict.
pub fn poison(c: u32, end: &JobEnd) -> Vec<Step> {
    let end = WireEnd::from(end);
    let verdict = to_json(&Verdict::End(end.clone()));
    let end = to_json(&end);
    [c, c + 1]
        .into_iter()
        .flat_map(|cycle| {
            [
                Step::SetFirst(key::go(cycle), verdict.clone()),
                Step::SetFirst(key::end(cycle), end.clone()),
                Step::Set(key::all(cycle), Vec::new()),
            ]
        })
        .collect()
}

/// The writes that say `members` agents join `cycles` from now on.
fn members_of(members: usize, cycles: [u32; 2]) -> impl Iterator<Item = Step> {
    let m = members.to_string().into_bytes();
    cycles
        .into_iter()
        .map(move |c| Step::Set(key::members(c), m.clone()))
}

impl Rendezvous {
    /// What a [`Decision`] takes: park on the cycle's end, tell the runtime, or end `Lost`.
    pub fn steps(&mut self, d: Decision) -> Vec<Step> {
        match d {
            // Beside the cycle's end, its in-process generations (docs/inprocess.md).
            Decision::Run(c, m) => vec![
                Step::Wait(key::end(c), Patience::Forever),
                Step::Tell(m),
                Step::WaitGeneration(c, 1),
            ],
            Decision::Tell(m) => vec![Step::Tell(m)],
            Decision::Fail(why) => vec![self.lost(why)],
        }
    }

    /// The job cannot go on on this agent: the message that ends it ([`Rendezvous::fail`]).
    pub fn lost(&mut self, why: String) -> Step {
        Step::Tell(FromCoord::lost(self.fail(why), true))
    }

    /// Input: this agent joined `cycle` (after [`Rendezvous::join`]) as the `nth`, with
    /// `c<N>/members` as read. The last to join completes the rendezvous (`all`); with a last
    /// call, each joiner says it came (`c0/nth/<k>`) and node rank 0 (re)starts the call; then
    /// it waits for `all` (node rank 0) or the verdict.
    pub fn counted(&self, cycle: u32, nth: i64, members: Option<&[u8]>) -> Vec<Step> {
        let mut steps = Vec::new();
        if nth == self.joins_expected(members) {
            steps.push(Step::Set(key::all(cycle), Vec::new()));
        }
        let waits_all = self.stage == Stage::WaitAll(cycle);
        if self.has_last_call(cycle) {
            steps.push(Step::Set(key::nth_join(cycle, nth), Vec::new()));
            if waits_all {
                steps.push(Step::LastCall(cycle));
            }
        }
        let next = if waits_all {
            key::all(cycle)
        } else {
            key::go(cycle)
        };
        steps.push(Step::Wait(next, Patience::Join));
        steps
    }

    /// Input (node rank 0): every member's join record for `cycle` as read, in
    /// [`Self::members`] order. With standbys and nodes lost for good, the next rendezvous waits
    /// for the members only (`c<N+1>/members`); then the hosts and promotions are told and the
    /// assignment proposed, or the job ends.
    pub fn propose(&mut self, cycle: u32, records: &[(u32, Vec<u8>)]) -> Vec<Step> {
        let members = self.members().len();
        let mut steps = Vec::new();
        if self.spares() && members < self.setup.nnodes as usize {
            // Nodes lost for good (or absent at the last call) stay out of every later
            // rendezvous.
            let m = members.to_string().into_bytes();
            steps.push(Step::Set(key::members(cycle + 1), m));
        }
        match self.assign(cycle, records) {
            Ok(Proposal {
                go,
                promotions,
                hosts,
            }) => {
                steps.push(Step::Tell(FromCoord::Hosts { cycle, hosts }));
                if !promotions.is_empty() {
                    steps.push(Step::Tell(FromCoord::Promoted { cycle, promotions }));
                }
                if self.spares() {
                    let ready = self.spares_ready(&go.slots);
                    steps.push(Step::Tell(FromCoord::SparesReady { cycle, ready }));
                }
                steps.push(Step::Propose(cycle, to_json(&Verdict::Go(go))));
            }
            Err(why) => steps.push(self.lost(why.to_string())),
        }
        steps
    }

    /// Input (node rank 0): `joined` nodes joined cycle `c` when a member was lost to a standby
    /// during its rendezvous: if every member left did, it completes without the lost one.
    pub fn joins_counted(&self, c: u32, joined: usize) -> Vec<Step> {
        if joined >= self.members().len() {
            vec![Step::Set(key::all(c), Vec::new())]
        } else {
            Vec::new()
        }
    }

    /// What losing a node takes ([`Loss`]): the members from now on and the cycle under way
    /// completed or ended, the job ended for every node, or this agent's end.
    pub fn carry(&mut self, loss: Loss) -> Vec<Step> {
        let (mut steps, then) = match loss {
            Loss::Nothing => return Vec::new(),
            Loss::Fail(why) => return vec![self.lost(why)],
            Loss::Job { cycle, end } => return poison(cycle, &end),
            Loss::ToStandby {
                members,
                cycles,
                then,
                node,
                reason,
                standby_gone,
            } => {
                let mut steps: Vec<Step> = members_of(members, cycles).collect();
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
            AfterLoss::EndCycle { cycle, end } => {
                let end = to_json(&WireEnd::from(&end));
                steps.push(Step::SetFirst(key::end(cycle), end));
            }
        }
        steps
    }

    /// Input (node rank 0, `--nnodes MIN:MAX`): cycle `c`'s last call ran out with the
    /// `present` members' join records there ([`Rendezvous::last_call`]); `last_call` is how
    /// long it waited. Starting without the absent ones: say so, write the members, complete
    /// the rendezvous.
    pub fn last_call_out(&mut self, c: u32, present: &[u32], last_call: Duration) -> Vec<Step> {
        let LastCall::Start {
            members,
            cycles,
            absent,
        } = self.last_call(c, present)
        else {
            return Vec::new();
        };
        let note = last_call_note(c, members, self.setup.nnodes, &absent, last_call);
        let mut steps = vec![Step::Tell(FromCoord::Note(note))];
        steps.extend(members_of(members, cycles));
        steps.push(Step::Set(key::all(c), Vec::new()));
        steps
    }

    /// Input: cycle `cycle`'s ranks on this node ended with `end` (the first report wins).
    pub fn report_end(&self, cycle: u32, end: &JobEnd) -> Vec<Step> {
        let mut steps = Vec::new();
        if let JobEnd::Failed { node, .. } = end {
            steps.push(Step::Set(key::failed(cycle, *node), Vec::new()));
        }
        steps.push(Step::SetFirst(
            key::end(cycle),
            to_json(&WireEnd::from(end)),
        ));
        steps
    }

    /// Input: this node counted itself the `count`th whose ranks all exited 0 in `cycle`: the
    /// last slot to do so ends the cycle done.
    pub fn done_counted(&self, cycle: u32, count: i64) -> Vec<Step> {
        if self.all_reported(count) {
            vec![Step::SetFirst(key::end(cycle), to_json(&WireEnd::Done))]
        } else {
            Vec::new()
        }
    }

    /// Input: this node counted itself the `count`th to share its timeouts for `cycle`'s
    /// `round`: the last slot to do so merges everyone's.
    pub fn timeouts_counted(&self, cycle: u32, round: u32, count: i64) -> Vec<Step> {
        if self.all_reported(count) {
            vec![Step::MergeTimeouts { cycle, round }]
        } else {
            Vec::new()
        }
    }

    /// Input: every slot's timeouts for `cycle`'s `round` as read (one that does not convert is
    /// left out): the job-wide ones, the longest of each, for every node.
    pub fn timeouts_read(&self, cycle: u32, round: u32, all: &[WireTimeouts]) -> Vec<Step> {
        let all: Vec<Timeouts> = all.iter().filter_map(|w| w.try_into().ok()).collect();
        let merged = WireTimeouts::from(&merge_timeouts(&all));
        vec![Step::Set(key::timeouts(cycle, round), to_json(&merged))]
    }

    /// Input: this node counted itself the `count`th to report its ranks' steps after a stop
    /// was asked in `cycle`: the last slot to do so chooses the stop step.
    pub fn steps_counted(&self, cycle: u32, count: i64) -> Vec<Step> {
        if self.all_reported(count) {
            vec![Step::ChooseStopStep(cycle)]
        } else {
            Vec::new()
        }
    }

    /// Input: every slot's step report for `cycle` as read: the job's stop step (the first
    /// written wins).
    pub fn steps_read(&self, cycle: u32, all: Vec<WireSteps>) -> Vec<Step> {
        let all: Vec<StepReport> = all.into_iter().map(StepReport::from).collect();
        let step = choose_stop_step(&all, AGREEMENT_BUDGET);
        vec![Step::SetFirst(key::stop_step(cycle), to_json(&step))]
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
    /// This agent counted itself the `nth` to join `cycle`; `members`: `c<N>/members` as read.
    Counted {
        cycle: u32,
        nth: i64,
        members: Option<&'a [u8]>,
    },
    /// Node rank 0: every member's join record for `cycle`, as read.
    Records {
        cycle: u32,
        records: &'a [(u32, Vec<u8>)],
    },
    /// Cycle N's verdict as read (`c<N>/go`).
    Verdict { cycle: u32, value: &'a [u8] },
    /// Cycle N's end as read (`c<N>/end`).
    Ended { cycle: u32, value: &'a [u8] },
    /// Node rank 0: how many joined cycle N, after a member was lost to a standby.
    JoinsCounted { cycle: u32, joined: usize },
    /// Node rank 0: a lease closed (`node`: `None` for a key that names no node).
    LeaseLost { node: Option<u32>, reason: String },
    /// Liveness found `node` silent (`None`: the store).
    Silent { node: Option<u32>, reason: String },
    /// The store outside the job: this agent won the lost coordinator `old`'s lease.
    TookOver {
        old: u32,
        alive: &'a [u32],
        reason: String,
    },
    /// Node rank 0: cycle N's last call ran out with the `present` members' records there.
    LastCallOut {
        cycle: u32,
        present: &'a [u32],
        waited: Duration,
    },
    /// This node's ranks ended `cycle` with `end`.
    ReportEnd { cycle: u32, end: &'a JobEnd },
    /// This node counted itself the `count`th done in `cycle`.
    DoneCounted { cycle: u32, count: i64 },
    /// This node counted itself the `count`th to share its timeouts for the round.
    TimeoutsCounted { cycle: u32, round: u32, count: i64 },
    /// Every slot's timeouts for the round, as read.
    TimeoutsRead {
        cycle: u32,
        round: u32,
        all: &'a [WireTimeouts],
    },
    /// This node counted itself the `count`th to report its steps in `cycle`.
    StepsCounted { cycle: u32, count: i64 },
    /// Every slot's step report for `cycle`, as read.
    StepsRead { cycle: u32, all: Vec<WireSteps> },
    /// This node's supervisor began in-process generation `generation` of `cycle`, replacing
    /// these global ranks.
    GenerationBegun {
        cycle: u32,
        generation: u64,
        replaced: &'a [u32],
    },
    /// In-process generation `generation` of `cycle` as written (`c<N>/gen/<g>`).
    GenerationRead {
        cycle: u32,
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
                cycle,
                nth,
                members,
            } => self.counted(cycle, nth, members),
            Fact::Records { cycle, records } => self.propose(cycle, records),
            Fact::Verdict { cycle, value } => {
                let d = self.verdict(cycle, value);
                self.steps(d)
            }
            Fact::Ended { cycle, value } => {
                let d = self.ended(cycle, value);
                self.steps(d)
            }
            Fact::JoinsCounted { cycle, joined } => self.joins_counted(cycle, joined),
            Fact::LeaseLost { node, reason } => {
                let loss = self.lease_lost(node, reason);
                self.carry(loss)
            }
            Fact::Silent { node, reason } => {
                let loss = self.silent(node, reason);
                self.carry(loss)
            }
            Fact::TookOver { old, alive, reason } => {
                let loss = self.take_over(old, alive, reason);
                self.carry(loss)
            }
            Fact::LastCallOut {
                cycle,
                present,
                waited,
            } => self.last_call_out(cycle, present, waited),
            Fact::ReportEnd { cycle, end } => self.report_end(cycle, end),
            Fact::DoneCounted { cycle, count } => self.done_counted(cycle, count),
            Fact::TimeoutsCounted {
                cycle,
                round,
                count,
            } => self.timeouts_counted(cycle, round, count),
            Fact::TimeoutsRead { cycle, round, all } => self.timeouts_read(cycle, round, all),
            Fact::StepsCounted { cycle, count } => self.steps_counted(cycle, count),
            Fact::StepsRead { cycle, all } => self.steps_read(cycle, all),
            Fact::GenerationBegun {
                cycle,
                generation,
                replaced,
            } => generation_begun(cycle, generation, replaced),
            Fact::GenerationRead {
                cycle,
                generation,
                value,
            } => self.generation_read(cycle, generation, value),
        }
    }

    /// Input: in-process generation `generation` of `cycle` as written. Every node, the one
    /// that began it too, hears of the one that won (its supervisor escalates to a whole
    /// restart when that is not the one it began) and parks on the next. A generation of a
    /// cycle this node no longer runs is nobody's news.
    pub fn generation_read(&self, cycle: u32, generation: u64, value: &[u8]) -> Vec<Step> {
        if self.stage != Stage::Running(cycle) {
            return Vec::new();
        }
        let replaced = serde_json::from_slice::<Vec<u32>>(value).ok();
        vec![
            Step::Tell(FromCoord::Event(Event::GenerationBegun {
                cycle,
                generation,
                replaced,
            })),
            Step::WaitGeneration(cycle, generation + 1),
        ]
    }
}

/// Input: this node began in-process generation `generation` of `cycle`: propose it to the job
/// (the first written wins; a node that loses hears of the winner and escalates).
pub fn generation_begun(cycle: u32, generation: u64, replaced: &[u32]) -> Vec<Step> {
    vec![Step::SetFirst(
        key::generation(cycle, generation),
        to_json(&replaced),
    )]
}

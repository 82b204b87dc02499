//! The job-wide decisions of the rendezvous, pure: one agent's state machine, with no store and
//! no sockets (the coordinator in mod.rs only moves messages between the store and it).
//!
//! Inputs, each a method (and each the coordinator hands over as a [`Fact`] to
//! [`Rendezvous::step`], which answers with [`Step`]s): this agent joins a cycle
//! ([`Rendezvous::join`]); node rank 0 finds
//! every member joined and reads their join records ([`Rendezvous::assign`]); the cycle's verdict
//! (`c<N>/go`) and its end (`c<N>/end`) arrive ([`Rendezvous::verdict`], [`Rendezvous::ended`]); a
//! node's lease closes or its liveness counter stops ([`Rendezvous::lease_lost`],
//! [`Rendezvous::silent`]); this node's health check ([`Rendezvous::health`]).
//!
//! Outputs: what to propose as the verdict (the assignment, [`Proposal`]), what to tell this
//! agent's runtime ([`Decision`]), what a lost node does to the job ([`Loss`]), and the reason
//! whenever the job cannot go on here; and, for the coordinator, each of those as the [`Step`]s
//! that carry it out (the store's writes and waits, the messages), in order: the rendezvous'
//! completion ([`Rendezvous::counted`], [`Rendezvous::joins_counted`]), the members left and the
//! proposal ([`Rendezvous::propose`]), a loss ([`Rendezvous::carry`]), the cycle's end
//! ([`Rendezvous::report_end`], [`Rendezvous::done_counted`]), the job-wide timeouts and stop
//! step ([`Rendezvous::timeouts_counted`], [`Rendezvous::steps_counted`]), the last call
//! ([`Rendezvous::last_call_out`]), the coordinator's successor ([`Rendezvous::successor`]).
//! Where each job-wide decision is made:
//! - ranks: [`assign`] and [`assign_slots`] (global ranks follow the slot);
//! - benching, unfit nodes and promotions: [`Rendezvous::assign`], choosing with `job/spares.rs`;
//! - members and a lost node (to a standby, or the job is lost): [`Rendezvous::node_lost`];
//! - what a verdict means for this node (ranks, standby, the end): [`Rendezvous::verdict`].
//!
//! The first proposal written to `c<N>/go` wins (compare-and-set), and every node reads the same
//! bytes, so every node decides the same from it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::job::spares::{refill, Promotion, Standby};
use crate::supervise::monitor::Timeouts;
use crate::supervise::{choose_stop_step, Event, JobEnd, StepReport, AGREEMENT_BUDGET};

use super::wire::{key, to_json, Go, NodeInfo, Verdict, WireEnd, WireSteps, WireTimeouts};
use super::FromCoord;

/// What one agent knows of the job, fixed for its life.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Every agent, standbys included.
    pub nnodes: u32,
    /// The nodes that run ranks (slots); `nnodes - active` start as standbys.
    pub active: u32,
    pub node_rank: u32,
    /// `--segment`: node ids in blocks of this many are close.
    pub segment: Option<u32>,
    /// Node rank 0's value is the job's budget.
    pub max_restarts: u32,
    /// This agent coordinates the job (node rank 0 at the start): it assigns ranks and watches
    /// every node. With the store outside the job another agent may take it over
    /// ([`Rendezvous::take_over`]).
    pub head: bool,
    /// The store runs outside the job (`vigil store`, `--rdzv-conf is_host=false`): losing the
    /// coordinator's node is losing a node like any other.
    pub outside: bool,
}

/// Where this agent is in the current cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Idle,
    /// Node rank 0 waits for every node to join cycle N.
    WaitAll(u32),
    WaitGo(u32),
    /// Cycle N runs; parked on its end.
    Running(u32),
}

/// What a finished wait means in the current stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// Node rank 0: every member joined cycle N (`c<N>/all`).
    AllJoined(u32),
    /// Cycle N's verdict is out (`c<N>/go`).
    Verdict(u32),
    /// Cycle N ended (`c<N>/end`).
    End(u32),
}

/// What this agent does next, as decided from what the store said.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Tell the runtime (`Joined`, `Standby`) and park on the cycle's end.
    Run(u32, FromCoord),
    /// Tell the runtime (`CycleEnded`): this agent is done with the cycle.
    Tell(FromCoord),
    /// The job cannot go on on this agent: it ends `Lost` with this reason.
    Fail(String),
}

/// Joining a cycle.
#[derive(Debug, Clone, PartialEq)]
pub enum Joining {
    /// Write this node's join record, with its last health check, count it and wait for the
    /// verdict.
    Join { healthy: Option<bool> },
    /// Node rank 0 lost a node for good: end this cycle (and the next) with this, and tell the
    /// runtime it ended.
    Ended(JobEnd),
}

/// Node rank 0's proposal for a cycle: the verdict `Go`, and the standbys it promotes.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub go: Go,
    pub promotions: Vec<Promotion>,
    /// The hosts of the nodes that run ranks, in group-rank order, and of the standbys (what
    /// node rank 0 alone knows, for NVRx's cycle info files).
    pub hosts: NodeHosts,
}

/// Host names of one cycle's nodes, as they joined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHosts {
    pub active: Vec<String>,
    pub standby: Vec<String>,
}

/// Why node rank 0 cannot assign a cycle: the job cannot go on (it ends to be requeued).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unassignable {
    #[error("node {node} joined attempt {cycle} with an unreadable record ({why}); every node must run the same vigil version")]
    UnreadableRecord { node: u32, cycle: u32, why: String },
    #[error("attempt {cycle}: no standby left to take the place of lost node(s) {lost:?}")]
    NoStandby { cycle: u32, lost: Vec<u32> },
}

/// What losing a node does to the job (node rank 0).
#[derive(Debug, Clone, PartialEq)]
pub enum Loss {
    /// Nothing: a node of no slot in this job, one already lost, or the job already lost.
    Nothing,
    /// A standby takes over: from now on `members` agents join (write it for `cycles`); then
    /// `then`.
    ToStandby {
        members: usize,
        cycles: [u32; 2],
        then: AfterLoss,
    },
    /// The job is lost: end `cycle` and the next with `end` for every node.
    Job { cycle: u32, end: JobEnd },
    /// Not node rank 0: this agent lost the job, for this reason.
    Fail(String),
}

/// What the end of a rendezvous' last call means (node rank 0, `--nnodes MIN:MAX`).
#[derive(Debug, Clone, PartialEq)]
pub enum LastCall {
    Wait,
    /// From now on `members` agents join (write it for `cycles`) and the rendezvous of the first
    /// completes now; the `absent` nodes are never given ranks in this job.
    Start {
        members: usize,
        cycles: [u32; 2],
        absent: Vec<u32>,
    },
}

/// What a node lost to a standby does to the cycle under way.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterLoss {
    Nothing,
    /// The rendezvous of this cycle completes without it: if `members` joined already, set
    /// `all`.
    CompleteJoin(u32),
    /// It played a slot in the running cycle: the cycle ends as its failure (first end wins).
    EndCycle {
        cycle: u32,
        end: JobEnd,
    },
}

/// One agent's view of the job's rendezvous.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    setup: Setup,
    stage: Stage,
    /// The highest cycle this node joined.
    cycle: u32,
    /// Node rank 0: the calculated timeouts to hand out with the next `go`.
    calculated: Option<Timeouts>,
    /// Node rank 0: a node was lost; every later cycle ends with this.
    lost: Option<JobEnd>,
    /// The node id playing each slot in the current cycle (hot spares; else 0..active).
    slots: Vec<u32>,
    /// Node rank 0: nodes lost while standbys could take their place; never members again.
    dead: Vec<u32>,
    /// Node rank 0: every member's last join record (a lost node's topology is read from it).
    infos: BTreeMap<u32, NodeInfo>,
    /// This node's last health check before a rendezvous (hot spares).
    healthy: Option<bool>,
    /// The node each ended cycle failed on (`None`: it did not fail), in order.
    failed_on: Vec<Option<u32>>,
    /// Node rank 0, hot spares: nodes replaced for failing attempts in a row; never given ranks
    /// again in this job.
    benched: Vec<u32>,
}

impl Rendezvous {
    pub fn new(setup: Setup) -> Self {
        Rendezvous {
            slots: (0..setup.active).collect(),
            setup,
            stage: Stage::Idle,
            cycle: 0,
            calculated: None,
            lost: None,
            dead: Vec::new(),
            infos: BTreeMap::new(),
            healthy: None,
            failed_on: Vec::new(),
            benched: Vec::new(),
        }
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// Hot spares: some nodes wait as standbys.
    pub fn spares(&self) -> bool {
        self.setup.active < self.setup.nnodes
    }

    /// The nodes playing the current cycle's slots: those that report its end, timeouts and
    /// steps (a standby reports none).
    pub fn slots(&self) -> &[u32] {
        &self.slots
    }

    pub fn in_slots(&self) -> bool {
        self.slots.contains(&self.setup.node_rank)
    }

    /// Whether `count` reports (done, timeouts, stop steps) complete the cycle: one per slot.
    pub fn all_reported(&self, count: i64) -> bool {
        count == self.slots.len() as i64
    }

    /// Input: this node's health check before a rendezvous.
    pub fn health(&mut self, healthy: bool) {
        self.healthy = Some(healthy);
    }

    /// Input: this agent asks to join `cycle`; node rank 0 hands `calculated` to every node.
    pub fn join(&mut self, cycle: u32, calculated: Option<Timeouts>) -> Joining {
        self.cycle = cycle;
        if let Some(end) = self.lost.clone() {
            self.stage = Stage::Idle;
            return Joining::Ended(end);
        }
        if self.setup.head {
            self.calculated = calculated;
            self.stage = Stage::WaitAll(cycle);
        } else {
            self.stage = Stage::WaitGo(cycle);
        }
        Joining::Join {
            healthy: self.healthy,
        }
    }

    /// How many joins complete the rendezvous, from `c<N>/members` as read (hot spares: fewer
    /// once nodes were lost); without it, every agent.
    pub fn joins_expected(&self, members: Option<&[u8]>) -> i64 {
        let all = self.setup.nnodes as i64;
        match members {
            Some(m) if self.spares() => String::from_utf8_lossy(m).parse().unwrap_or(all),
            _ => all,
        }
    }

    /// What a finished wait on `key` means now; `None`: nothing (a wait of an earlier stage).
    pub fn woke(&self, k: &str) -> Option<Woke> {
        match self.stage {
            Stage::WaitAll(c) if k == key::all(c) => Some(Woke::AllJoined(c)),
            Stage::WaitGo(c) if k == key::go(c) => Some(Woke::Verdict(c)),
            Stage::Running(c) if k == key::end(c) => Some(Woke::End(c)),
            _ => None,
        }
    }

    /// The cycle whose join a failed wait was for (it timed out: the reason counts the nodes
    /// that joined); `None`: the store is to blame.
    pub fn join_timed_out(&self, timed_out: bool) -> Option<u32> {
        match self.stage {
            Stage::WaitAll(c) | Stage::WaitGo(c) if timed_out => Some(c),
            _ => None,
        }
    }

    /// The agents whose join records node rank 0 reads: every node not lost for good.
    pub fn members(&self) -> Vec<u32> {
        (0..self.setup.nnodes)
            .filter(|n| !self.dead.contains(n))
            .collect()
    }

    /// Input (node rank 0): every member's join record for `cycle` as read (`c<N>/join/<node>`),
    /// in [`Self::members`] order. Output: the verdict to propose, or why the job cannot go on.
    pub fn assign(
        &mut self,
        cycle: u32,
        records: &[(u32, Vec<u8>)],
    ) -> Result<Proposal, Unassignable> {
        let mut nodes = Vec::with_capacity(records.len());
        let mut joined = BTreeMap::new();
        for (node, record) in records {
            let info: NodeInfo =
                serde_json::from_slice(record).map_err(|e| Unassignable::UnreadableRecord {
                    node: *node,
                    cycle,
                    why: e.to_string(),
                })?;
            joined.insert(*node, info.clone());
            nodes.push(info);
        }
        let calculated = self.calculated.as_ref().map(WireTimeouts::from);
        if !self.spares() {
            let go = assign(cycle, &nodes, self.setup.max_restarts, calculated);
            let hosts = NodeHosts {
                active: nodes.into_iter().map(|n| n.host).collect(),
                standby: Vec::new(),
            };
            return Ok(Proposal {
                go,
                promotions: Vec::new(),
                hosts,
            });
        }
        self.infos.extend(joined.clone());
        self.bench(&joined);
        // Lost, unfit by their last health check, or to blame: a healthy standby plays it.
        let unfit = |n: &u32| {
            self.benched.contains(n) || joined.get(n).and_then(|i| i.healthy) == Some(false)
        };
        let lost: Vec<(u32, Option<String>)> = self
            .slots
            .iter()
            .filter(|n| self.dead.contains(n) || unfit(n))
            .map(|n| (*n, self.infos.get(n).and_then(|i| i.topology.clone())))
            .collect();
        let standbys: Vec<Standby> = joined
            .keys()
            .filter(|n| !self.slots.contains(n))
            .map(|n| Standby {
                node: *n,
                healthy: !unfit(n),
                topology: joined.get(n).and_then(|i| i.topology.clone()),
            })
            .collect();
        refill(&self.slots, &lost, &standbys, self.setup.segment)
            .ok()
            .and_then(|(slots, promotions)| {
                let go = assign_slots(cycle, &slots, &joined, self.setup.max_restarts, calculated)?;
                let host = |n: &u32| joined.get(n).map(|i| i.host.clone());
                let hosts = NodeHosts {
                    active: slots.iter().filter_map(host).collect(),
                    standby: (joined.keys().filter(|n| !slots.contains(n)))
                        .filter_map(host)
                        .collect(),
                };
                Some(Proposal {
                    go,
                    promotions,
                    hosts,
                })
            })
            .ok_or_else(|| Unassignable::NoStandby {
                cycle,
                lost: self.dead.clone(),
            })
    }

    /// Hot spares: a node whose ranks failed or hung in the last two attempts in a row is to
    /// blame (allocation/blame.rs's rule); while a healthy standby is left, it is benched for
    /// good. Node rank 0 hosts the store and is never benched.
    fn bench(&mut self, joined: &BTreeMap<u32, NodeInfo>) {
        let spare_left = joined.iter().any(|(n, info)| {
            !self.slots.contains(n) && !self.benched.contains(n) && info.healthy != Some(false)
        });
        if let [.., Some(a), Some(b)] = self.failed_on[..] {
            if a == b && a != 0 && spare_left && !self.benched.contains(&a) {
                self.benched.push(a);
            }
        }
    }

    /// Input: cycle `c`'s verdict as read from `c<N>/go` (every node reads the same bytes).
    pub fn verdict(&mut self, c: u32, value: &[u8]) -> Decision {
        let unreadable = |e: &dyn std::fmt::Display| {
            Decision::Fail(format!("attempt {c} started with an unreadable verdict ({e}); every node must run the same vigil version"))
        };
        let go = match serde_json::from_slice::<Verdict>(value) {
            Ok(Verdict::Go(go)) => go,
            Ok(Verdict::End(end)) => {
                self.stage = Stage::Idle;
                let end = end.into();
                return Decision::Tell(FromCoord::cycle_ended(c, end));
            }
            Err(e) => return self.failed(unreadable(&e)),
        };
        let calculated = match go.calculated.as_ref().map(Timeouts::try_from).transpose() {
            Ok(t) => t,
            Err(e) => return self.failed(unreadable(&e)),
        };
        // The job's budget is the first coordinator's: a later one hands the same on.
        self.setup.max_restarts = go.max_restarts;
        self.slots = if go.slots.is_empty() {
            (0..go.offsets.len() as u32).collect()
        } else {
            go.slots.clone()
        };
        let me = self.setup.node_rank;
        if self.spares() && go.slot_of(me).is_none() {
            // A standby: no ranks; it follows the cycle to its end like everyone.
            self.stage = Stage::Running(c);
            return Decision::Run(c, FromCoord::Event(Event::Standby { cycle: c }));
        }
        let slot = go.slot_of(me).unwrap_or(me);
        let Some(&rank_offset) = go.offsets.get(slot as usize) else {
            return self.failed(Decision::Fail(format!(
                "attempt {c} was assigned for {} nodes, but this is node rank {me}; every node must use the same --nnodes",
                go.offsets.len(),
            )));
        };
        self.stage = Stage::Running(c);
        Decision::Run(
            c,
            FromCoord::Joined {
                group_rank: slot,
                event: Event::Joined {
                    cycle: c,
                    rank_offset,
                    world_size: go.world_size,
                    max_restarts: go.max_restarts,
                    calculated,
                },
            },
        )
    }

    /// Input (the store outside the job): the coordinator, node `old`, is gone and this agent won
    /// the coordinator's lease; `alive`: the nodes whose leases the store still holds (this one's
    /// included). It rebuilds what the coordinator knew from what every agent read (the last
    /// verdict's slots and budget, the cycle it joined) and the leases (a member without one is
    /// lost for good), and loses `old` as any other node: with a standby for its slot, the cycle
    /// ends as its failure and the next rendezvous gives its slot to a standby; without, the job
    /// is lost. A rendezvous it was waiting on the verdict of, it now completes itself.
    pub fn take_over(&mut self, old: u32, alive: &[u32], reason: String) -> Loss {
        self.setup.head = true;
        let me = self.setup.node_rank;
        for n in 0..self.setup.nnodes {
            if n != me && n != old && !alive.contains(&n) && !self.dead.contains(&n) {
                self.dead.push(n);
            }
        }
        if let Stage::WaitGo(c) = self.stage {
            self.stage = Stage::WaitAll(c);
        }
        self.node_lost(Some(old), reason)
    }

    /// Whether this agent coordinates the job.
    pub fn is_head(&self) -> bool {
        self.setup.head
    }

    /// Input: cycle `c`'s end as read from `c<N>/end` (the first report won).
    pub fn ended(&mut self, c: u32, value: &[u8]) -> Decision {
        self.stage = Stage::Idle;
        match serde_json::from_slice::<WireEnd>(value) {
            Ok(end) => {
                let end = JobEnd::from(end);
                self.failed_on.push(match &end {
                    JobEnd::Failed { node, .. } => Some(*node),
                    _ => None,
                });
                Decision::Tell(FromCoord::cycle_ended(c, end))
            }
            Err(e) => Decision::Fail(format!("attempt {c} ended with an unreadable verdict ({e}); every node must run the same vigil version")),
        }
    }

    /// Input (node rank 0): the lease of node `node` closed (`None`: a key that names no node).
    /// Only the job's node ranks hold leases that matter; anything else (an agent refused before
    /// it claimed a rank, an old vigil) loses nobody.
    pub fn lease_lost(&mut self, node: Option<u32>, reason: String) -> Loss {
        match node {
            Some(n) if self.lost.is_none() && n < self.setup.nnodes => {
                self.node_lost(Some(n), reason)
            }
            _ => Loss::Nothing,
        }
    }

    /// Input: liveness found `node` silent (`None`: this node's own store did not answer).
    pub fn silent(&mut self, node: Option<u32>, reason: String) -> Loss {
        if self.setup.head {
            self.node_lost(node, reason)
        } else {
            Loss::Fail(reason)
        }
    }

    /// Node rank 0: a node is gone. With a standby left for its slot (or if it was a standby),
    /// it is never a member again, and an attempt it ran in ends as a failure of that node, so
    /// every node restarts and the next `go` gives its slot to a standby. Otherwise this cycle
    /// and every later one end `lost`.
    fn node_lost(&mut self, node: Option<u32>, reason: String) -> Loss {
        if self.lost.is_some() || node.is_some_and(|n| self.dead.contains(&n)) {
            return Loss::Nothing;
        }
        if let Some(k) = node.filter(|_| self.spares()) {
            let standbys_left = (0..self.setup.nnodes)
                .filter(|n| *n != k && !self.dead.contains(n) && !self.slots.contains(n))
                .count();
            if !self.slots.contains(&k) || standbys_left > 0 {
                return self.lose_to_a_standby(k, reason);
            }
        }
        let end = JobEnd::Lost { reason, node };
        self.lost = Some(end.clone());
        Loss::Job {
            cycle: self.cycle,
            end,
        }
    }

    fn lose_to_a_standby(&mut self, k: u32, reason: String) -> Loss {
        self.dead.push(k);
        let then = match self.stage {
            Stage::WaitAll(c) => AfterLoss::CompleteJoin(c),
            Stage::Running(c) if self.slots.contains(&k) => AfterLoss::EndCycle {
                cycle: c,
                end: JobEnd::Failed { node: k, reason },
            },
            _ => AfterLoss::Nothing,
        };
        Loss::ToStandby {
            members: self.members().len(),
            cycles: [self.cycle, self.cycle + 1],
            then,
        }
    }

    /// Whether cycle `c`'s rendezvous has a last call: the job's first, with standbys. Later
    /// ones wait for their members (a member slow to come back is not dropped; a lost one is
    /// noticed by its lease and liveness).
    pub fn has_last_call(&self, c: u32) -> bool {
        c == 0 && self.spares()
    }

    /// Input (node rank 0, `--nnodes MIN:MAX`): cycle `c`'s rendezvous had at least MIN nodes and
    /// no other joined within the last call; `present`: the members whose join records are there.
    /// Output: start without the absent ones, which are never members again (a node that comes
    /// later waits as a standby without ranks), or keep waiting (fewer than MIN present, the
    /// rendezvous completed meanwhile, or not the first).
    pub fn last_call(&mut self, c: u32, present: &[u32]) -> LastCall {
        if self.stage != Stage::WaitAll(c) || self.lost.is_some() || !self.has_last_call(c) {
            return LastCall::Wait;
        }
        let members = self.members();
        let here: Vec<u32> = members
            .iter()
            .copied()
            .filter(|n| present.contains(n))
            .collect();
        if here.len() < self.setup.active as usize || here.len() == members.len() {
            return LastCall::Wait;
        }
        let absent: Vec<u32> = members.into_iter().filter(|n| !here.contains(n)).collect();
        self.dead.extend(&absent);
        LastCall::Start {
            members: here.len(),
            cycles: [c, c + 1],
            absent,
        }
    }

    /// The job cannot go on on this agent (a store error, a failed rendezvous): the reason to
    /// report, said plainly where a standby cannot help.
    pub fn fail(&mut self, mut reason: String) -> String {
        if self.spares()
            && !self.setup.head
            && !self.setup.outside
            && reason.contains("node rank 0")
        {
            // docs/design.md, "Hot spares": the store lives on node rank 0.
            reason.push_str("; a standby cannot take node rank 0's place (it hosts the job's store), so the job ends to be requeued");
        }
        self.stage = Stage::Idle;
        reason
    }

    fn failed(&mut self, d: Decision) -> Decision {
        self.stage = Stage::Idle;
        d
    }
}

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
            Decision::Run(c, m) => vec![Step::Wait(key::end(c), Patience::Forever), Step::Tell(m)],
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
        let (members, cycles, then) = match loss {
            Loss::Nothing => return Vec::new(),
            Loss::Fail(why) => return vec![self.lost(why)],
            Loss::Job { cycle, end } => return poison(cycle, &end),
            Loss::ToStandby {
                members,
                cycles,
                then,
            } => (members, cycles, then),
        };
        let mut steps: Vec<Step> = members_of(members, cycles).collect();
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
        }
    }
}

/// What node rank 0 says when the last call of cycle `c` ran out and the job starts with
/// `members` of up to `nnodes` nodes.
pub fn last_call_note(
    c: u32,
    members: usize,
    nnodes: u32,
    absent: &[u32],
    last_call: Duration,
) -> String {
    let absent: Vec<String> = absent.iter().map(u32::to_string).collect();
    format!(
        "attempt {c} starts with {members} of up to {nnodes} nodes: no other joined within the last call ({}s, --rdzv-conf last_call_timeout); node rank(s) {} take no part in this job, and a node that comes later waits as a standby without ranks",
        last_call.as_secs_f64(),
        absent.join(", ")
    )
}

/// c10d without node ranks: an agent drew `ticket` (1, 2, ...: the order in which the agents
/// reached the store) from the store's counter. When an agent hosts the store it is node rank 0
/// and only the others draw, so ticket `t` is node rank `t`; when the store runs outside the job
/// (`outside`: `vigil store`), every agent draws and ticket `t` is node rank `t - 1`. A ticket past
/// the job's last node rank means the job has every agent it can take.
/// `active`: the nodes that run ranks (`--nnodes MIN:MAX`'s MIN; `nnodes` without standbys).
pub fn hand_out_node_rank(
    ticket: i64,
    nnodes: u32,
    active: u32,
    outside: bool,
) -> Result<u32, Full> {
    let rank = ticket - i64::from(outside && ticket >= 1);
    match u32::try_from(rank) {
        Ok(r) if ticket >= 1 && r < nnodes => Ok(r),
        _ => Err(Full {
            nnodes: if active < nnodes {
                format!("{active}:{nnodes}")
            } else {
                nnodes.to_string()
            },
        }),
    }
}

/// Every node rank of the job was handed out already.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("every node rank of the job (--nnodes {nnodes}) was handed out by the rendezvous already; this agent is one too many: start one agent per node, or raise --nnodes")]
pub struct Full {
    /// `--nnodes` as written.
    pub nnodes: String,
}

/// Global ranks by node rank: node `n`'s local rank 0 is the sum of the ranks of nodes `0..n`.
pub fn assign(
    cycle: u32,
    nodes: &[NodeInfo],
    max_restarts: u32,
    calculated: Option<WireTimeouts>,
) -> Go {
    let mut offsets = Vec::with_capacity(nodes.len());
    let mut next = 0u32;
    for n in nodes {
        offsets.push(next);
        next += n.nproc;
    }
    Go {
        cycle,
        world_size: next,
        offsets,
        slots: Vec::new(),
        max_restarts,
        calculated,
    }
}

/// Global ranks by slot when standbys play some slots (`spares::refill`): slot `s`'s local rank 0
/// is the sum of the ranks of slots `0..s`, each counted with the node that plays it. `None` when
/// a slot's node did not join.
pub fn assign_slots(
    cycle: u32,
    slots: &[u32],
    joined: &BTreeMap<u32, NodeInfo>,
    max_restarts: u32,
    calculated: Option<WireTimeouts>,
) -> Option<Go> {
    let nodes: Vec<NodeInfo> = slots
        .iter()
        .map(|n| joined.get(n).cloned())
        .collect::<Option<_>>()?;
    let mut go = assign(cycle, &nodes, max_restarts, calculated);
    go.slots = slots.to_vec();
    Some(go)
}

/// The job-wide timeouts: for every check, the longest any node calculated.
pub fn merge_timeouts(all: &[Timeouts]) -> Timeouts {
    let max = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    let mut out = Timeouts::default();
    for t in all {
        out.initial = max(out.initial, t.initial);
        out.heartbeat = max(out.heartbeat, t.heartbeat);
        out.out_of_section = max(out.out_of_section, t.out_of_section);
        out.warmup = max(out.warmup, t.warmup);
        for (k, v) in &t.sections {
            let e = out.sections.entry(k.clone()).or_insert(*v);
            *e = (*e).max(*v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::rendezvous::wire::to_json;
    use crate::job::spares::closeness;
    use proptest::prelude::*;

    fn info(nproc: u32) -> NodeInfo {
        NodeInfo {
            nproc,
            host: "h".into(),
            pid: 1,
            topology: None,
            healthy: None,
        }
    }

    #[test]
    fn node_ranks_are_handed_out_in_ticket_order_after_the_stores_host() {
        assert_eq!(hand_out_node_rank(1, 2, 2, false), Ok(1));
        assert_eq!(hand_out_node_rank(2, 3, 3, false), Ok(2));
        assert_eq!(hand_out_node_rank(3, 4, 1, false), Ok(3));
        // Node rank 0 is the store's host's; past the last one, the job is full.
        for bad in [0, 3, -1, i64::MIN, i64::MAX] {
            let full = Full { nnodes: "3".into() };
            assert_eq!(hand_out_node_rank(bad, 3, 3, false), Err(full), "{bad}");
        }
        // The store outside the job: the first agent to draw is node rank 0.
        assert_eq!(hand_out_node_rank(1, 3, 3, true), Ok(0));
        assert_eq!(hand_out_node_rank(3, 3, 3, true), Ok(2));
        for bad in [0, 4, -1, i64::MIN, i64::MAX] {
            let full = Full { nnodes: "3".into() };
            assert_eq!(hand_out_node_rank(bad, 3, 3, true), Err(full), "{bad}");
        }
        let e = hand_out_node_rank(5, 4, 4, false).unwrap_err().to_string();
        assert!(
            e.contains("(--nnodes 4)") && e.contains("one too many"),
            "{e}"
        );
        // As the user wrote it.
        let e = hand_out_node_rank(4, 4, 1, false).unwrap_err().to_string();
        assert!(e.contains("(--nnodes 1:4)"), "{e}");
    }

    proptest! {
        /// However many agents draw tickets, every node rank 1..N-1 (0..N-1 with the store
        /// outside the job) is handed out exactly once and the rest are refused.
        #[test]
        fn every_node_rank_is_handed_out_once(nnodes in 1u32..64, extra in 0u32..8, outside: bool) {
            let ranks: Vec<u32> = (1..=(nnodes + extra) as i64)
                .filter_map(|t| hand_out_node_rank(t, nnodes, nnodes, outside).ok())
                .collect();
            prop_assert_eq!(ranks, (u32::from(!outside)..nnodes).collect::<Vec<_>>());
        }
    }

    fn head(nnodes: u32, active: u32) -> Rendezvous {
        Rendezvous::new(Setup {
            nnodes,
            active,
            node_rank: 0,
            segment: None,
            max_restarts: 3,
            head: true,
            outside: false,
        })
    }

    #[test]
    fn after_the_last_call_the_job_starts_with_min_nodes_or_more() {
        // torch's elastic example, --nnodes 1:4, on one machine.
        let mut h = head(4, 1);
        assert_eq!(h.last_call(0, &[0]), LastCall::Wait, "not joined yet");
        h.join(0, None);
        assert_eq!(
            h.last_call(0, &[0]),
            LastCall::Start {
                members: 1,
                cycles: [0, 1],
                absent: vec![1, 2, 3]
            }
        );
        assert_eq!(h.members(), vec![0]);
        let go = h.assign(0, &[(0, to_json(&info(2)))]).unwrap().go;
        assert_eq!((go.world_size, go.slot_of(0)), (2, Some(0)));
        // Nodes that come later are no members: the next rendezvous does not wait for them.
        h.verdict(0, &to_json(&Verdict::Go(go)));
        h.ended(0, &to_json(&WireEnd::Done));
        h.join(1, None);
        assert_eq!(h.joins_expected(Some(b"1")), 1);
        assert_eq!(h.last_call(1, &[0, 1]), LastCall::Wait);
        // Only the first rendezvous has a last call: later ones wait for their members.
        let mut h = head(3, 1);
        h.join(0, None);
        h.join(1, None);
        assert!(!h.has_last_call(1) && head(3, 1).has_last_call(0));
        assert_eq!(h.last_call(1, &[0]), LastCall::Wait);

        // --nnodes 2:3 with nodes 0 and 2: node 2 plays the absent node 1's slot.
        let mut h = head(3, 2);
        h.join(0, None);
        assert_eq!(h.last_call(0, &[0]), LastCall::Wait, "fewer than MIN");
        assert_eq!(
            h.last_call(0, &[0, 1, 2]),
            LastCall::Wait,
            "everyone is here"
        );
        assert_eq!(
            h.last_call(0, &[0, 2]),
            LastCall::Start {
                members: 2,
                cycles: [0, 1],
                absent: vec![1]
            }
        );
        let records = [(0, to_json(&info(1))), (2, to_json(&info(1)))];
        let go = h.assign(0, &records).unwrap().go;
        assert_eq!(
            (go.slot_of(0), go.slot_of(2), go.world_size),
            (Some(0), Some(1), 2)
        );
        let note = last_call_note(0, 2, 3, &[1], Duration::from_millis(1500));
        assert!(
            note.starts_with("attempt 0 starts with 2 of up to 3 nodes: no other joined within the last call (1.5s,")
                && note.contains("node rank(s) 1 take no part"),
            "{note}"
        );
        // Without standbys (--nnodes N) there is no last call: every node must come.
        let mut h = head(2, 2);
        h.join(0, None);
        assert_eq!(h.last_call(0, &[0]), LastCall::Wait);
    }

    #[test]
    fn ranks_follow_node_rank() {
        let go = assign(3, &[info(2), info(4), info(1)], 5, None);
        assert_eq!(go.offsets, vec![0, 2, 6]);
        assert_eq!(go.world_size, 7);
        assert_eq!(go.cycle, 3);
        assert_eq!(go.max_restarts, 5);
    }

    #[test]
    fn a_standby_in_a_lost_nodes_slot_gets_its_ranks_and_the_rest_keep_theirs() {
        let joined: BTreeMap<u32, NodeInfo> = [(0, info(2)), (2, info(2)), (3, info(2))].into();
        // Node 1 (slot 1) was lost; standby 3 plays slot 1, node 2 keeps slot 2.
        let go = assign_slots(4, &[0, 3, 2], &joined, 5, None).unwrap();
        assert_eq!(go.offsets, vec![0, 2, 4]);
        assert_eq!(go.world_size, 6);
        assert_eq!(
            (go.slot_of(0), go.slot_of(3), go.slot_of(2), go.slot_of(1)),
            (Some(0), Some(1), Some(2), None)
        );
        // A slot whose node did not join cannot be assigned.
        assert!(assign_slots(4, &[0, 1, 2], &joined, 5, None).is_none());
    }

    #[test]
    fn job_timeouts_are_the_maximum_over_nodes() {
        let s = Duration::from_secs;
        let a = Timeouts {
            initial: Some(s(10)),
            heartbeat: Some(s(3)),
            sections: [("step".to_string(), s(5))].into(),
            ..Default::default()
        };
        let b = Timeouts {
            initial: Some(s(4)),
            heartbeat: Some(s(9)),
            sections: [("step".to_string(), s(2)), ("ckpt".to_string(), s(7))].into(),
            ..Default::default()
        };
        let m = merge_timeouts(&[a, b]);
        assert_eq!(m.initial, Some(s(10)));
        assert_eq!(m.heartbeat, Some(s(9)));
        assert_eq!(m.sections["step"], s(5));
        assert_eq!(m.sections["ckpt"], s(7));
        assert_eq!(m.out_of_section, None);
    }

    /// A job of agents driven through cycles with nothing between them but the bytes they would
    /// read from the store: node rank 0's proposal is every node's verdict.
    struct Job {
        agents: Vec<Rendezvous>,
        nproc: Vec<u32>,
        topology: Vec<Option<String>>,
        /// Agents gone for good (their decisions are no longer asked for).
        gone: Vec<u32>,
    }

    /// One cycle as every agent saw it: the verdict's bytes, each live agent's decision.
    struct Cycle {
        verdict: Vec<u8>,
        proposal: Result<Proposal, Unassignable>,
        decisions: BTreeMap<u32, Decision>,
    }

    impl Job {
        fn new(nproc: Vec<u32>, active: u32, topology: Vec<Option<String>>) -> Self {
            let nnodes = nproc.len() as u32;
            let agents = (0..nnodes)
                .map(|n| {
                    Rendezvous::new(Setup {
                        nnodes,
                        active,
                        node_rank: n,
                        segment: None,
                        max_restarts: 3,
                        head: n == 0,
                        outside: false,
                    })
                })
                .collect();
            Job {
                agents,
                nproc,
                topology,
                gone: Vec::new(),
            }
        }

        fn live(&self) -> Vec<u32> {
            (0..self.agents.len() as u32)
                .filter(|n| !self.gone.contains(n))
                .collect()
        }

        /// Every live agent joins `c` with its health; node rank 0 proposes, every agent reads
        /// the verdict (or, when node rank 0 could not assign, the job's end).
        fn cycle(&mut self, c: u32, health: &[Option<bool>]) -> Cycle {
            let mut records = BTreeMap::new();
            for n in self.live() {
                let a = &mut self.agents[n as usize];
                if let Some(h) = health[n as usize] {
                    a.health(h);
                }
                if let Joining::Join { healthy } = a.join(c, None) {
                    let mut i = info(self.nproc[n as usize]);
                    i.healthy = healthy;
                    i.topology = self.topology[n as usize].clone();
                    records.insert(n, i);
                }
            }
            let head = &mut self.agents[0];
            let members = head.members();
            let records: Vec<(u32, Vec<u8>)> = members
                .iter()
                .map(|n| (*n, records.get(n).map(to_json).unwrap_or_default()))
                .collect();
            let proposal = head.assign(c, &records);
            let verdict = match &proposal {
                Ok(p) => to_json(&Verdict::Go(p.go.clone())),
                Err(why) => to_json(&Verdict::End(WireEnd::Lost {
                    reason: why.to_string(),
                    node: None,
                })),
            };
            let decisions = self
                .live()
                .into_iter()
                .map(|n| (n, self.agents[n as usize].verdict(c, &verdict)))
                .collect();
            Cycle {
                verdict,
                proposal,
                decisions,
            }
        }

        /// Cycle `c` ends with `end` on every live agent.
        fn end(&mut self, c: u32, end: &JobEnd) {
            let v = to_json(&WireEnd::from(end));
            for n in self.live() {
                let d = self.agents[n as usize].ended(c, &v);
                assert_eq!(d, Decision::Tell(FromCoord::cycle_ended(c, end.clone())));
            }
        }
    }

    /// Every live agent decided the same cycle from one verdict: the ranks partition
    /// `0..world_size` exactly once, each slot is played once, the rest are standbys.
    fn check_one_verdict(job: &Job, c: u32, cy: &Cycle) -> Result<(), TestCaseError> {
        let mut seen = Vec::new();
        let mut group_ranks = Vec::new();
        let mut world = None;
        let mut standbys = 0;
        for (n, d) in &cy.decisions {
            match d {
                Decision::Run(
                    cycle,
                    FromCoord::Joined {
                        group_rank,
                        event:
                            Event::Joined {
                                cycle: jc,
                                rank_offset,
                                world_size,
                                max_restarts,
                                ..
                            },
                    },
                ) => {
                    prop_assert_eq!((*cycle, *jc, *max_restarts), (c, c, 3));
                    prop_assert!(world.is_none_or(|w| w == *world_size));
                    world = Some(*world_size);
                    group_ranks.push(*group_rank);
                    let nproc = job.nproc[*n as usize];
                    seen.extend(*rank_offset..*rank_offset + nproc);
                }
                Decision::Run(cycle, FromCoord::Event(Event::Standby { cycle: sc })) => {
                    prop_assert_eq!((*cycle, *sc), (c, c));
                    standbys += 1;
                }
                other => prop_assert!(false, "node {} decided {:?}", n, other),
            }
        }
        let world = world.unwrap_or(0);
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..world).collect::<Vec<_>>());
        group_ranks.sort_unstable();
        let active = job.agents[0].setup.active;
        prop_assert_eq!(group_ranks, (0..active).collect::<Vec<_>>());
        prop_assert_eq!(standbys, cy.decisions.len() - active as usize);
        Ok(())
    }

    fn topologies(n: usize, switches: &[u8]) -> Vec<Option<String>> {
        (0..n)
            .map(|i| {
                let s = switches.get(i).copied().unwrap_or(0);
                Some(format!("s{}.l{}.n{i}", s / 4, s % 4))
            })
            .collect()
    }

    proptest! {
        #[test]
        fn offsets_partition_the_world(nprocs in proptest::collection::vec(1u32..9, 1..40)) {
            let nodes: Vec<NodeInfo> = nprocs.iter().map(|&n| info(n)).collect();
            let go = assign(0, &nodes, 0, None);
            let mut seen = vec![false; go.world_size as usize];
            for (i, n) in nprocs.iter().enumerate() {
                for lr in 0..*n {
                    let r = (go.offsets[i] + lr) as usize;
                    prop_assert!(!seen[r]);
                    seen[r] = true;
                }
            }
            prop_assert!(seen.into_iter().all(|x| x));
        }

        /// Without standbys every node has a slot and its own ranks per node; with them, every
        /// node runs the same number. Either way all agents read one verdict the same way.
        #[test]
        fn every_node_decides_the_same_verdict_and_ranks_cover_the_world_once(
            nprocs in proptest::collection::vec(1u32..5, 1..10),
            spares in 0usize..4,
            health in proptest::collection::vec(proptest::option::of(proptest::bool::weighted(0.8)), 14),
        ) {
            let active = nprocs.len() as u32;
            let nproc: Vec<u32> = if spares > 0 {
                vec![nprocs[0]; nprocs.len() + spares]
            } else {
                nprocs.clone()
            };
            let nnodes = nproc.len();
            // Node rank 0 hosts the store: its own health is not asked for here.
            let mut health = health[..nnodes].to_vec();
            health[0] = None;
            let mut job = Job::new(nproc, active, vec![None; nnodes]);
            let cy = job.cycle(0, &health);
            if spares == 0 {
                prop_assert!(cy.proposal.is_ok());
            }
            match &cy.proposal {
                Ok(_) => check_one_verdict(&job, 0, &cy)?,
                Err(why) => {
                    prop_assert!(matches!(why, Unassignable::NoStandby { .. }), "{}", why);
                    for d in cy.decisions.values() {
                        let is_lost = matches!(d, Decision::Tell(FromCoord::Event(Event::CycleEnded { end: JobEnd::Lost { .. }, .. })));
                        prop_assert!(is_lost, "{:?}", d);
                    }
                }
            }
            // A second read of the same bytes decides the same.
            let again = job.agents[1 % nnodes].clone().verdict(0, &cy.verdict);
            prop_assert_eq!(&again, &cy.decisions[&(1 % nnodes as u32)]);
        }

        /// A node that failed two attempts in a row is benched while a healthy standby is left,
        /// and never gets a slot again.
        #[test]
        fn a_benched_node_never_gets_a_slot(
            active in 2u32..6,
            spares in 1u32..4,
            failures in proptest::collection::vec(proptest::option::of(0u32..8), 1..12),
        ) {
            let nnodes = (active + spares) as usize;
            let mut job = Job::new(vec![1; nnodes], active, vec![None; nnodes]);
            let health = vec![None; nnodes];
            for (c, failed) in failures.iter().enumerate() {
                let c = c as u32;
                let cy = job.cycle(c, &health);
                let Ok(p) = &cy.proposal else { break };
                check_one_verdict(&job, c, &cy)?;
                for b in &job.agents[0].benched {
                    prop_assert!(*b != 0);
                    prop_assert_eq!(p.go.slot_of(*b), None, "benched {} plays a slot", b);
                }
                let end = match failed.filter(|n| p.go.slot_of(*n).is_some()) {
                    Some(node) => JobEnd::Failed { node, reason: "r".into() },
                    None => JobEnd::Done,
                };
                job.end(c, &end);
            }
            // Benched only for two failures in a row of its own.
            let head = &job.agents[0];
            for b in &head.benched {
                let twice = head.failed_on.windows(2).any(|w| w == [Some(*b), Some(*b)]);
                prop_assert!(twice, "{} benched without failing twice in a row", b);
            }
        }

        /// A standby takes a lost node's slot: a healthy one, the closest in the topology, then
        /// the lowest id; the lost node is never given ranks again.
        #[test]
        fn promotion_picks_a_healthy_standby_closest_by_topology(
            active in 1u32..5,
            spares in 1u32..5,
            lost_slot in 0u32..5,
            health in proptest::collection::vec(proptest::bool::weighted(0.7), 10),
            switches in proptest::collection::vec(0u8..8, 10),
        ) {
            let nnodes = (active + spares) as usize;
            // Node rank 0 hosts the store and is not lost here (that ends the job elsewhere).
            let lost = 1 + lost_slot % active.max(2).min(nnodes as u32 - 1);
            prop_assume!(lost < active);
            let topology = topologies(nnodes, &switches);
            let mut job = Job::new(vec![2; nnodes], active, topology.clone());
            let all_healthy = vec![Some(true); nnodes];
            let cy = job.cycle(0, &all_healthy);
            check_one_verdict(&job, 0, &cy)?;
            let loss = job.agents[0].lease_lost(Some(lost), "gone".into());
            let failed = JobEnd::Failed { node: lost, reason: "gone".into() };
            prop_assert_eq!(
                loss,
                Loss::ToStandby {
                    members: nnodes - 1,
                    cycles: [0, 1],
                    then: AfterLoss::EndCycle { cycle: 0, end: failed.clone() },
                }
            );
            job.gone.push(lost);
            job.end(0, &failed);
            let mut health: Vec<Option<bool>> = health[..nnodes].iter().map(|h| Some(*h)).collect();
            health[0] = None;
            let healthy = |n: u32| health[n as usize] != Some(false);
            let cy = job.cycle(1, &health);
            let candidates: Vec<u32> = (active..nnodes as u32).filter(|n| healthy(*n)).collect();
            let unfit_active = (1..active).filter(|n| *n != lost && !healthy(*n)).count();
            if candidates.len() < 1 + unfit_active {
                prop_assert!(cy.proposal.is_err());
                return Ok(());
            }
            let p = cy.proposal.as_ref().unwrap();
            check_one_verdict(&job, 1, &cy)?;
            prop_assert_eq!(p.go.slot_of(lost), None);
            let promo = p.promotions.iter().find(|p| p.lost == lost).expect("the lost slot is refilled");
            prop_assert!(healthy(promo.standby));
            let near = |n: u32| closeness(
                (lost, topology[lost as usize].as_deref()),
                (n, topology[n as usize].as_deref()),
                None,
            );
            // The lost node's slot is refilled first when it comes first; else an earlier slot
            // may have taken a closer standby.
            if p.promotions[0].lost == lost {
                for n in &candidates {
                    prop_assert!(
                        (near(*n), std::cmp::Reverse(*n)) <= (near(promo.standby), std::cmp::Reverse(promo.standby)),
                        "standby {} is closer to {} than {}", n, lost, promo.standby
                    );
                }
            }
        }

        /// A lost node with no standby left for its slot ends the job `lost` for every node: at
        /// once, or (a standby left but unfit) at the next rendezvous.
        #[test]
        fn a_lost_node_without_a_standby_ends_the_job_lost(
            active in 1u32..5,
            spares in 0u32..3,
            standbys_lost in 0u32..3,
            victim in 1u32..5,
        ) {
            let nnodes = (active + spares) as usize;
            prop_assume!(nnodes > 1);
            let victim = victim % nnodes as u32;
            prop_assume!(victim != 0 && victim < active);
            let mut job = Job::new(vec![1; nnodes], active, vec![None; nnodes]);
            let cy = job.cycle(0, &vec![None; nnodes]);
            check_one_verdict(&job, 0, &cy)?;
            // Standbys go first: each is lost to nobody's slot.
            for s in (active..nnodes as u32).take(standbys_lost as usize) {
                let loss = job.agents[0].lease_lost(Some(s), "gone".into());
                prop_assert!(matches!(loss, Loss::ToStandby { then: AfterLoss::Nothing, .. }), "{:?}", loss);
                job.gone.push(s);
            }
            let left = spares.saturating_sub(standbys_lost);
            let loss = job.agents[0].lease_lost(Some(victim), "gone".into());
            if left > 0 {
                prop_assert!(matches!(loss, Loss::ToStandby { .. }), "{:?}", loss);
                return Ok(());
            }
            let Loss::Job { cycle: 0, end } = loss else {
                return Err(TestCaseError::fail(format!("{loss:?}")));
            };
            prop_assert_eq!(&end, &JobEnd::Lost { reason: "gone".into(), node: Some(victim) });
            // Later losses change nothing; the next join ends at once with the same verdict.
            prop_assert_eq!(job.agents[0].lease_lost(Some(victim), "again".into()), Loss::Nothing);
            prop_assert_eq!(job.agents[0].join(1, None), Joining::Ended(end.clone()));
            let verdict = to_json(&Verdict::End(WireEnd::from(&end)));
            for n in job.live() {
                let d = job.agents[n as usize].verdict(1, &verdict);
                prop_assert_eq!(d, Decision::Tell(FromCoord::cycle_ended(1, end.clone())));
            }
        }
    }

    #[test]
    fn a_node_failing_twice_in_a_row_is_benched_and_a_standby_plays_its_slot() {
        let mut job = Job::new(vec![1; 3], 2, vec![None; 3]);
        let health = vec![None; 3];
        let failed = JobEnd::Failed {
            node: 1,
            reason: "r".into(),
        };
        for c in 0..2 {
            let cy = job.cycle(c, &health);
            assert_eq!(cy.proposal.unwrap().go.slot_of(1), Some(1));
            job.end(c, &failed);
        }
        let cy = job.cycle(2, &health);
        let p = cy.proposal.unwrap();
        assert_eq!((p.go.slot_of(1), p.go.slot_of(2)), (None, Some(1)));
        assert_eq!(
            p.promotions,
            vec![Promotion {
                slot: 1,
                lost: 1,
                standby: 2
            }]
        );
        assert_eq!(
            cy.decisions[&1],
            Decision::Run(2, FromCoord::Event(Event::Standby { cycle: 2 }))
        );
        // Benched for good: with no standby left to bench the next, it stays out.
        job.end(2, &JobEnd::Done);
        let p = job.cycle(3, &health).proposal.unwrap();
        assert_eq!(p.go.slot_of(1), None);
    }

    fn agent(nnodes: u32, active: u32, node_rank: u32) -> Rendezvous {
        Rendezvous::new(Setup {
            nnodes,
            active,
            node_rank,
            segment: None,
            max_restarts: 5,
            head: node_rank == 0,
            outside: true,
        })
    }

    #[test]
    fn a_node_that_takes_over_the_coordinator_loses_node_rank_0_to_a_standby() {
        // --nnodes 3:4 with the store outside the job: nodes 0-2 run ranks, 3 waits.
        let mut agents: Vec<Rendezvous> = (0..4).map(|n| agent(4, 3, n)).collect();
        let records: Vec<(u32, Vec<u8>)> = (0..4).map(|n| (n, to_json(&info(2)))).collect();
        for a in agents.iter_mut() {
            a.join(0, None);
        }
        let go = agents[0].assign(0, &records).unwrap().go;
        let verdict = to_json(&Verdict::Go(go));
        for a in agents.iter_mut() {
            a.verdict(0, &verdict);
        }
        // Node 0 (the coordinator) dies mid-run; node 1, the lowest left, takes over.
        let n1 = &mut agents[1];
        assert!(!n1.is_head());
        let loss = n1.take_over(0, &[1, 2, 3], "gone".into());
        assert!(n1.is_head());
        assert_eq!(n1.members(), vec![1, 2, 3]);
        let end = JobEnd::Failed {
            node: 0,
            reason: "gone".into(),
        };
        assert_eq!(
            loss,
            Loss::ToStandby {
                members: 3,
                cycles: [0, 1],
                then: AfterLoss::EndCycle {
                    cycle: 0,
                    end: end.clone()
                },
            }
        );
        // Its lease and its silent counter, reported later, change nothing more.
        assert_eq!(n1.lease_lost(Some(0), "again".into()), Loss::Nothing);
        assert_eq!(n1.silent(Some(0), "again".into()), Loss::Nothing);
        // Every node restarts; the new coordinator gives slot 0 to the standby, with the job's
        // budget from the first verdict.
        let ended = to_json(&WireEnd::from(&end));
        for a in agents[1..].iter_mut() {
            a.ended(0, &ended);
            a.join(1, None);
        }
        assert_eq!(agents[1].stage(), Stage::WaitAll(1));
        assert_eq!(agents[2].stage(), Stage::WaitGo(1));
        let p = agents[1].assign(1, &records[1..]).unwrap();
        assert_eq!(p.go.slots, vec![3, 1, 2]);
        assert_eq!(p.go.max_restarts, 5);
        assert_eq!(
            (
                p.promotions[0].slot,
                p.promotions[0].lost,
                p.promotions[0].standby
            ),
            (0, 0, 3)
        );
        let verdict = to_json(&Verdict::Go(p.go));
        match agents[3].verdict(1, &verdict) {
            Decision::Run(1, FromCoord::Joined { group_rank, .. }) => assert_eq!(group_rank, 0),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn taking_over_without_a_standby_loses_the_job_and_completes_a_pending_rendezvous() {
        let mut agents: Vec<Rendezvous> = (0..3).map(|n| agent(3, 3, n)).collect();
        for a in agents.iter_mut() {
            a.join(0, None);
        }
        let go = agents[0].assign(0, &[(0, to_json(&info(1)))]).unwrap().go;
        let verdict = to_json(&Verdict::Go(go));
        agents[1].verdict(0, &verdict);
        let loss = agents[1].take_over(0, &[1, 2], "gone".into());
        assert_eq!(
            loss,
            Loss::Job {
                cycle: 0,
                end: JobEnd::Lost {
                    reason: "gone".into(),
                    node: Some(0)
                }
            }
        );
        // Waiting on a verdict that nobody else will write: the new coordinator completes it.
        let mut sp: Vec<Rendezvous> = (0..3).map(|n| agent(3, 2, n)).collect();
        sp[1].join(0, None);
        assert_eq!(sp[1].stage(), Stage::WaitGo(0));
        let loss = sp[1].take_over(0, &[1, 2], "gone".into());
        assert_eq!(sp[1].stage(), Stage::WaitAll(0));
        assert_eq!(
            loss,
            Loss::ToStandby {
                members: 2,
                cycles: [0, 1],
                then: AfterLoss::CompleteJoin(0)
            }
        );
        // A member whose lease is gone too is lost for good.
        let mut sp: Vec<Rendezvous> = (0..4).map(|n| agent(4, 2, n)).collect();
        sp[1].join(0, None);
        sp[1].take_over(0, &[1, 2], "gone".into());
        assert_eq!(sp[1].members(), vec![1, 2]);
    }

    #[test]
    fn a_lease_of_no_node_of_the_job_loses_nobody() {
        let mut job = Job::new(vec![1, 1], 2, vec![None, None]);
        assert_eq!(job.agents[0].lease_lost(None, "x".into()), Loss::Nothing);
        assert_eq!(job.agents[0].lease_lost(Some(7), "x".into()), Loss::Nothing);
        // A silent store on node rank 0 loses the job; elsewhere the agent fails.
        assert!(matches!(
            job.agents[0].silent(None, "own store".into()),
            Loss::Job {
                end: JobEnd::Lost { node: None, .. },
                ..
            }
        ));
        assert_eq!(
            job.agents[1].silent(Some(0), "head".into()),
            Loss::Fail("head".into())
        );
    }

    #[test]
    fn a_verdict_for_fewer_nodes_or_unreadable_fails_plainly() {
        let mut job = Job::new(vec![1, 1, 1], 3, vec![None; 3]);
        let go = to_json(&Verdict::Go(assign(0, &[info(1), info(1)], 0, None)));
        job.agents[2].join(0, None);
        let Decision::Fail(why) = job.agents[2].verdict(0, &go) else {
            panic!()
        };
        assert!(
            why.contains("assigned for 2 nodes, but this is node rank 2"),
            "{why}"
        );
        let Decision::Fail(why) = job.agents[1].verdict(0, b"{") else {
            panic!()
        };
        assert!(why.contains("unreadable verdict"), "{why}");
        assert_eq!(job.agents[1].stage(), Stage::Idle);
    }

    #[test]
    fn an_unreadable_join_record_ends_the_job_and_says_whose() {
        let mut job = Job::new(vec![1, 1], 2, vec![None; 2]);
        job.agents[0].join(0, None);
        let records = [(0, to_json(&info(1))), (1, b"{\"nproc\":".to_vec())];
        let why = job.agents[0].assign(0, &records).unwrap_err().to_string();
        assert!(
            why.starts_with("node 1 joined attempt 0 with an unreadable record ("),
            "{why}"
        );
        assert!(
            why.ends_with("every node must run the same vigil version"),
            "{why}"
        );
    }

    fn set(k: String, v: &str) -> Step {
        Step::Set(k, v.as_bytes().to_vec())
    }

    #[test]
    fn the_last_to_join_completes_the_rendezvous_and_each_waits_for_its_next_key() {
        let mut job = Job::new(vec![1, 1], 2, vec![None; 2]);
        job.agents[0].join(0, None);
        job.agents[1].join(0, None);
        assert_eq!(
            job.agents[0].counted(0, 1, None),
            vec![Step::Wait(key::all(0), Patience::Join)]
        );
        assert_eq!(
            job.agents[1].counted(0, 2, None),
            vec![set(key::all(0), ""), Step::Wait(key::go(0), Patience::Join)]
        );
        // Hot spares: the members as read; the first rendezvous has a last call.
        let mut h = head(4, 2);
        h.join(0, None);
        assert_eq!(
            h.counted(0, 3, Some(b"3")),
            vec![
                set(key::all(0), ""),
                set(key::nth_join(0, 3), ""),
                Step::LastCall(0),
                Step::Wait(key::all(0), Patience::Join),
            ]
        );
        let mut n1 = agent(4, 2, 1);
        n1.join(0, None);
        assert_eq!(
            n1.counted(0, 1, None),
            vec![
                set(key::nth_join(0, 1), ""),
                Step::Wait(key::go(0), Patience::Join)
            ]
        );
    }

    #[test]
    fn a_proposal_writes_the_members_left_and_tells_hosts_before_the_verdict() {
        // --nnodes 2:3: standby 2 is lost while the rendezvous waits; it completes without it.
        let mut h = head(3, 2);
        h.join(0, None);
        let loss = h.lease_lost(Some(2), "gone".into());
        assert_eq!(
            h.carry(loss),
            vec![
                set(key::members(0), "2"),
                set(key::members(1), "2"),
                Step::CountJoins(0)
            ]
        );
        assert_eq!(h.joins_counted(0, 1), vec![]);
        assert_eq!(h.joins_counted(0, 2), vec![set(key::all(0), "")]);
        let records = [(0, to_json(&info(1))), (1, to_json(&info(1)))];
        let steps = h.propose(0, &records);
        assert_eq!(steps[0], set(key::members(1), "2"));
        assert!(
            matches!(&steps[1], Step::Tell(FromCoord::Hosts { cycle: 0, hosts }) if hosts.active.len() == 2)
        );
        let Step::Propose(0, go) = &steps[2] else {
            panic!("{steps:?}")
        };
        // Every node, the proposer included, runs what won.
        let d = h.verdict(0, go);
        let run = h.steps(d);
        assert_eq!(run[0], Step::Wait(key::end(0), Patience::Forever));
        assert!(matches!(
            &run[1],
            Step::Tell(FromCoord::Joined {
                event: Event::Joined { cycle: 0, .. },
                ..
            })
        ));
        // Without standbys no members are written; an unreadable record ends the agent.
        let mut h = head(2, 2);
        h.join(0, None);
        let steps = h.propose(0, &[(0, to_json(&info(1))), (1, b"{".to_vec())]);
        assert!(
            matches!(
                &steps[..],
                [Step::Tell(FromCoord::Event(Event::CoordinationLost {
                    requeue: true,
                    ..
                }))]
            ),
            "{steps:?}"
        );
    }

    #[test]
    fn a_lost_node_ends_the_cycle_it_played_or_the_job() {
        let mut h = head(3, 2);
        let records: Vec<(u32, Vec<u8>)> = (0..3).map(|n| (n, to_json(&info(1)))).collect();
        h.join(0, None);
        let Some(Step::Propose(0, go)) = h.propose(0, &records).pop() else {
            panic!()
        };
        h.verdict(0, &go);
        let loss = h.lease_lost(Some(1), "gone".into());
        let steps = h.carry(loss);
        assert_eq!(
            steps[..2],
            [set(key::members(0), "2"), set(key::members(1), "2")]
        );
        assert!(matches!(&steps[2], Step::SetFirst(k, _) if *k == key::end(0)));
        // Without a standby the job ends for every node, this cycle and the next.
        let mut h = head(2, 2);
        h.join(0, None);
        let loss = h.lease_lost(Some(1), "gone".into());
        let steps = h.carry(loss);
        assert_eq!(steps.len(), 6, "{steps:?}");
        assert!(matches!(&steps[0], Step::SetFirst(k, _) if *k == key::go(0)));
        assert_eq!(steps[5], set(key::all(1), ""));
        // Not the coordinator: this agent ends.
        let mut n1 = agent(2, 2, 1);
        let loss = n1.silent(Some(0), "head".into());
        assert!(matches!(
            &n1.carry(loss)[..],
            [Step::Tell(FromCoord::Event(Event::CoordinationLost { .. }))]
        ));
    }

    #[test]
    fn reports_end_a_cycle_once_every_slot_is_done_or_one_failed() {
        let h = head(2, 2);
        assert_eq!(h.done_counted(0, 1), vec![]);
        assert_eq!(
            h.done_counted(0, 2),
            vec![Step::SetFirst(key::end(0), to_json(&WireEnd::Done))]
        );
        let failed = JobEnd::Failed {
            node: 1,
            reason: "x".into(),
        };
        assert_eq!(
            h.report_end(3, &failed),
            vec![
                set(key::failed(3, 1), ""),
                Step::SetFirst(key::end(3), to_json(&WireEnd::from(&failed)))
            ]
        );
    }

    #[test]
    fn the_lowest_live_agent_succeeds_a_lost_coordinator() {
        let n2 = agent(4, 3, 2);
        assert_eq!(n2.successor(0, &[false, true, true, true], false), None);
        assert_eq!(
            n2.successor(0, &[false, false, true, true], false),
            Some(vec![2, 3])
        );
        // The old coordinator's lease may still be there (expired): it is not alive.
        assert_eq!(
            n2.successor(1, &[false, true, true, false], false),
            Some(vec![2])
        );
        assert_eq!(n2.successor(0, &[false, false, true, true], true), None);
        assert_eq!(agent(4, 3, 0).successor(1, &[true; 4], false), None);
    }

    #[test]
    fn a_last_call_that_runs_out_says_so_and_completes_the_rendezvous() {
        let mut h = head(3, 2);
        h.join(0, None);
        let wait = Duration::from_secs(2);
        assert_eq!(h.last_call_out(0, &[0], wait), vec![]);
        let steps = h.last_call_out(0, &[0, 2], wait);
        assert!(
            matches!(&steps[0], Step::Tell(FromCoord::Note(n)) if n.starts_with("attempt 0 starts with 2 of up to 3 nodes"))
        );
        assert_eq!(
            steps[1..],
            [
                set(key::members(0), "2"),
                set(key::members(1), "2"),
                set(key::all(0), "")
            ]
        );
    }

    #[test]
    fn the_last_slot_to_report_merges_the_timeouts_and_chooses_the_stop_step() {
        let h = head(2, 2);
        assert_eq!(h.timeouts_counted(1, 0, 1), vec![]);
        assert_eq!(
            h.timeouts_counted(1, 0, 2),
            vec![Step::MergeTimeouts { cycle: 1, round: 0 }]
        );
        let s = Duration::from_secs;
        let t = |i, hb| Timeouts {
            initial: Some(s(i)),
            heartbeat: Some(s(hb)),
            ..Default::default()
        };
        let all = [WireTimeouts::from(&t(10, 3)), WireTimeouts::from(&t(4, 9))];
        let merged = WireTimeouts::from(&merge_timeouts(&[t(10, 3), t(4, 9)]));
        assert_eq!(
            h.timeouts_read(1, 0, &all),
            vec![Step::Set(key::timeouts(1, 0), to_json(&merged))]
        );
        assert_eq!(h.steps_counted(1, 1), vec![]);
        assert_eq!(h.steps_counted(1, 2), vec![Step::ChooseStopStep(1)]);
        let report = |max_step| WireSteps {
            max_step,
            steps_per_s: Some(1.0),
        };
        let steps = h.steps_read(1, vec![report(Some(7)), report(Some(9))]);
        let all: Vec<StepReport> = [report(Some(7)), report(Some(9))]
            .into_iter()
            .map(StepReport::from)
            .collect();
        let step = choose_stop_step(&all, AGREEMENT_BUDGET);
        assert_eq!(
            steps,
            vec![Step::SetFirst(key::stop_step(1), to_json(&step))]
        );
    }

    #[test]
    fn a_cycle_runs_through_step_alone() {
        let mut job = Job::new(vec![2, 2], 2, vec![None; 2]);
        for (n, a) in job.agents.iter_mut().enumerate() {
            a.join(0, None);
            let nth = n as i64 + 1;
            let members = None;
            let steps = a.step(Fact::Counted {
                cycle: 0,
                nth,
                members,
            });
            assert_eq!(steps, a.counted(0, nth, None));
        }
        let records: Vec<(u32, Vec<u8>)> = (0..2).map(|n| (n, to_json(&info(2)))).collect();
        let records = &records;
        let steps = job.agents[0].step(Fact::Records { cycle: 0, records });
        let Some(Step::Propose(0, go)) = steps.last().cloned() else {
            panic!("{steps:?}")
        };
        for a in job.agents.iter_mut() {
            let steps = a.step(Fact::Verdict {
                cycle: 0,
                value: &go,
            });
            assert_eq!(steps[0], Step::Wait(key::end(0), Patience::Forever));
        }
        let a = &mut job.agents[1];
        assert_eq!(a.step(Fact::DoneCounted { cycle: 0, count: 1 }), vec![]);
        let end = to_json(&WireEnd::Done);
        assert_eq!(
            a.step(Fact::DoneCounted { cycle: 0, count: 2 }),
            vec![Step::SetFirst(key::end(0), end.clone())]
        );
        assert_eq!(
            a.step(Fact::Ended {
                cycle: 0,
                value: &end
            }),
            vec![Step::Tell(FromCoord::cycle_ended(0, JobEnd::Done))]
        );
    }
}

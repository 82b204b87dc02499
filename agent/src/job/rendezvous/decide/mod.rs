//! The job-wide decisions of the rendezvous, pure: one agent's state machine, with no store and
//! no sockets (the coordinator, `coordinator/`, only moves messages between the store and it).
//! This file holds the state machine and its types; `steps.rs` the [`Step`]s that carry its
//! decisions out and [`Rendezvous::step`]; `requests.rs` what this agent asks of the job (its join
//! record, its reports, the stop trigger, departing, leaving), node rank 0's clean store, and the
//! coordinator's succession (its lease claimed, a deposed one stepping down); `assign.rs` the free
//! functions (ranks, merged timeouts).
//!
//! Inputs, each a method (and each the coordinator hands over as a [`Fact`] to
//! [`Rendezvous::step`], which answers with [`Step`]s): this agent joins an attempt
//! ([`Rendezvous::join`]); node rank 0 finds
//! every member joined and reads their join records ([`Rendezvous::assign`]); the attempt's verdict
//! (`c<N>/go`) and its end (`c<N>/end`) arrive ([`Rendezvous::verdict`], [`Rendezvous::ended`]); a
//! node's lease closes or its liveness counter stops ([`Rendezvous::lease_lost`],
//! [`Rendezvous::silent`]); this node's health check ([`Rendezvous::health`]).
//!
//! Outputs: what to propose as the verdict (the assignment, [`Proposal`]), what to tell this
//! agent's runtime ([`Decision`]), what a lost node does to the job ([`Loss`]), and the reason
//! whenever the job cannot go on here; and, for the coordinator, each of those as the [`Step`]s
//! that carry it out (the store's writes and waits, the messages), in order: the rendezvous'
//! completion ([`Rendezvous::counted`], [`Rendezvous::joins_counted`]), the members left and the
//! proposal ([`Rendezvous::propose`]), a loss ([`Rendezvous::carry`]), the attempt's end
//! ([`Rendezvous::report_end`], [`Rendezvous::done_counted`]), the job-wide timeouts and stop
//! step ([`Rendezvous::timeouts_counted`], [`Rendezvous::steps_counted`]), the last call
//! ([`Rendezvous::last_call_out`]), the coordinator's successor ([`Rendezvous::successor`]).
//! Where each job-wide decision is made:
//! - ranks: [`assign()`] and [`assign_slots`] (global ranks follow the slot);
//! - benching, unfit nodes and promotions: [`Rendezvous::assign`], choosing with `job/spares.rs`;
//! - members and a lost node (to a standby, or the job is lost): [`Rendezvous::node_lost`];
//! - what a verdict means for this node (ranks, standby, the end): [`Rendezvous::verdict`].
//!
//! The first proposal written to `c<N>/go` wins (compare-and-set), and every node reads the same
//! bytes, so every node decides the same from it.

use std::collections::BTreeMap;

use crate::job::spares::{refill, Promotion, Standby};
use crate::supervise::monitor::Timeouts;
use crate::supervise::{Event, JobEnd, Placement};

use super::wire::{key, Go, NodeInfo, Verdict, WireEnd, WireTimeouts};
use super::FromCoord;

mod assign;
mod requests;
mod steps;
#[cfg(test)]
mod tests;

pub use assign::{assign, assign_slots, hand_out_node_rank, last_call_note, merge_timeouts, Full};
pub use steps::{poison, Counted, Fact, Patience, Step};

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
    /// In-process restarts are on: a running attempt's nodes park on its next in-process
    /// generation (docs/inprocess.md); off, nobody writes one and nobody waits for it.
    pub in_process: bool,
}

/// Where this agent is in the current attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Idle,
    /// Node rank 0 waits for every node to join attempt N.
    WaitAll(u32),
    WaitGo(u32),
    /// Attempt N runs; parked on its end.
    Running(u32),
}

/// What a finished wait means in the current stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// Node rank 0: every member joined attempt N (`c<N>/all`).
    AllJoined(u32),
    /// Attempt N's verdict is out (`c<N>/go`).
    Verdict(u32),
    /// Attempt N ended (`c<N>/end`).
    End(u32),
}

/// What this agent does next, as decided from what the store said.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Tell the runtime (`Joined`, `Standby`) and park on the attempt's end.
    Run(u32, FromCoord),
    /// Tell the runtime (`AttemptEnded`): this agent is done with the attempt.
    Tell(FromCoord),
    /// The job cannot go on on this agent: it ends `Lost` with this reason.
    Fail(String),
}

/// Joining an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Joining {
    /// Write this node's join record, with its last health check, count it and wait for the
    /// verdict.
    Join { healthy: Option<bool> },
    /// Node rank 0 lost a node for good: end this attempt (and the next) with this, and tell the
    /// runtime it ended.
    Ended(JobEnd),
}

/// Node rank 0's proposal for an attempt: the verdict `Go`, and the standbys it promotes.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub go: Go,
    pub promotions: Vec<Promotion>,
    /// The hosts of the nodes that run ranks, in group-rank order, and of the standbys (what
    /// node rank 0 alone knows, for NVRx's cycle info files).
    pub hosts: NodeHosts,
}

/// Host names of one attempt's nodes, as they joined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHosts {
    pub active: Vec<String>,
    pub standby: Vec<String>,
}

/// Why node rank 0 cannot assign an attempt: the job cannot go on (it ends to be requeued).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unassignable {
    #[error("node {node} joined attempt {attempt} with an unreadable record ({why}); every node must run the same vigil version")]
    UnreadableRecord {
        node: u32,
        attempt: u32,
        why: String,
    },
    #[error("attempt {attempt}: no standby left to take the place of lost node(s) {lost:?}")]
    NoStandby { attempt: u32, lost: Vec<u32> },
}

/// What losing a node does to the job (node rank 0).
#[derive(Debug, Clone, PartialEq)]
pub enum Loss {
    /// Nothing: a node of no slot in this job, one already lost, or the job already lost.
    Nothing,
    /// A standby takes over: from now on `members` agents join (write it for `attempts`); then
    /// `then`.
    ToStandby {
        members: usize,
        attempts: [u32; 2],
        then: AfterLoss,
        /// The node lost and why: it is told so, should its agent still run (it was frozen).
        node: u32,
        reason: String,
        /// It was a standby: the standbys ready now.
        standby_gone: Option<u32>,
    },
    /// The job is lost: end `attempt` and the next with `end` for every node.
    Job { attempt: u32, end: JobEnd },
    /// Not node rank 0: this agent lost the job, for this reason.
    Fail(String),
}

/// What the end of a rendezvous' last call means (node rank 0, `--nnodes MIN:MAX`).
#[derive(Debug, Clone, PartialEq)]
pub enum LastCall {
    Wait,
    /// From now on `members` agents join (write it for `attempts`) and the rendezvous of the first
    /// completes now; the `absent` nodes are never given ranks in this job.
    Start {
        members: usize,
        attempts: [u32; 2],
        absent: Vec<u32>,
    },
}

/// What a node lost to a standby does to the attempt under way.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterLoss {
    Nothing,
    /// The rendezvous of this attempt completes without it: if `members` joined already, set
    /// `all`.
    CompleteJoin(u32),
    /// It played a slot in the running attempt: the attempt ends as its failure (first end wins).
    EndAttempt {
        attempt: u32,
        end: JobEnd,
    },
}

/// One agent's view of the job's rendezvous.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    setup: Setup,
    stage: Stage,
    /// The highest attempt this node joined.
    attempt: u32,
    /// Node rank 0: the calculated timeouts to hand out with the next `go`.
    calculated: Option<Timeouts>,
    /// Node rank 0: a node was lost; every later attempt ends with this.
    lost: Option<JobEnd>,
    /// The node id playing each slot in the current attempt (hot spares; else 0..active).
    slots: Vec<u32>,
    /// Node rank 0: nodes lost while standbys could take their place; never members again.
    dead: Vec<u32>,
    /// Node rank 0: every member's last join record (a lost node's topology is read from it).
    infos: BTreeMap<u32, NodeInfo>,
    /// This node's last health check before a rendezvous (hot spares).
    healthy: Option<bool>,
    /// The node each ended attempt failed on (`None`: it did not fail), in order.
    failed_on: Vec<Option<u32>>,
    /// Node rank 0, hot spares: nodes replaced for failing attempts in a row; never given ranks
    /// again in this job.
    benched: Vec<u32>,
    /// A standby that left the job on a signal ([`Fact::Depart`]): it keeps its lease until its
    /// connection closes, so the coordinator, in the job or through a store outside it, hears
    /// of it as a lost lease and reads why (`key::left`).
    departed: bool,
    /// This agent coordinated until another took the coordinator's lease over
    /// ([`Fact::Deposed`]): it leaves without deciding anything for the job.
    deposed: bool,
}

impl Rendezvous {
    pub fn new(setup: Setup) -> Self {
        Rendezvous {
            slots: (0..setup.active).collect(),
            setup,
            stage: Stage::Idle,
            attempt: 0,
            calculated: None,
            lost: None,
            dead: Vec::new(),
            infos: BTreeMap::new(),
            healthy: None,
            failed_on: Vec::new(),
            benched: Vec::new(),
            departed: false,
            deposed: false,
        }
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// Hot spares: some nodes wait as standbys.
    pub fn spares(&self) -> bool {
        self.setup.active < self.setup.nnodes
    }

    /// The nodes playing the current attempt's slots: those that report its end, timeouts and
    /// steps (a standby reports none).
    pub fn slots(&self) -> &[u32] {
        &self.slots
    }

    pub fn in_slots(&self) -> bool {
        self.slots.contains(&self.setup.node_rank)
    }

    /// Whether `count` reports (done, timeouts, stop steps) complete the attempt: one per slot.
    pub fn all_reported(&self, count: i64) -> bool {
        count == self.slots.len() as i64
    }

    /// Input: this node's health check before a rendezvous.
    pub fn health(&mut self, healthy: bool) {
        self.healthy = Some(healthy);
    }

    /// Input: this agent asks to join `attempt`; node rank 0 hands `calculated` to every node.
    pub fn join(&mut self, attempt: u32, calculated: Option<Timeouts>) -> Joining {
        self.attempt = attempt;
        if let Some(end) = self.lost.clone() {
            self.stage = Stage::Idle;
            return Joining::Ended(end);
        }
        if self.setup.head {
            self.calculated = calculated;
            self.stage = Stage::WaitAll(attempt);
        } else {
            self.stage = Stage::WaitGo(attempt);
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

    /// The attempt whose join a failed wait was for (it timed out: the reason counts the nodes
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

    /// Input (node rank 0): every member's join record for `attempt` as read (`c<N>/join/<node>`),
    /// in [`Self::members`] order. Output: the verdict to propose, or why the job cannot go on.
    pub fn assign(
        &mut self,
        attempt: u32,
        records: &[(u32, Vec<u8>)],
    ) -> Result<Proposal, Unassignable> {
        let mut nodes = Vec::with_capacity(records.len());
        let mut joined = BTreeMap::new();
        for (node, record) in records {
            let info: NodeInfo =
                serde_json::from_slice(record).map_err(|e| Unassignable::UnreadableRecord {
                    node: *node,
                    attempt,
                    why: e.to_string(),
                })?;
            joined.insert(*node, info.clone());
            nodes.push(info);
        }
        let calculated = self.calculated.as_ref().map(WireTimeouts::from);
        if !self.spares() {
            let go = assign(attempt, &nodes, self.setup.max_restarts, calculated);
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
                let go = assign_slots(
                    attempt,
                    &slots,
                    &joined,
                    self.setup.max_restarts,
                    calculated,
                )?;
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
                attempt,
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

    /// Input: attempt `c`'s verdict as read from `c<N>/go` (every node reads the same bytes).
    pub fn verdict(&mut self, c: u32, value: &[u8]) -> Decision {
        let unreadable = |e: &dyn std::fmt::Display| {
            Decision::Fail(format!("attempt {c} started with an unreadable verdict ({e}); every node must run the same vigil version"))
        };
        let go = match serde_json::from_slice::<Verdict>(value) {
            Ok(Verdict::Go(go)) => go,
            Ok(Verdict::End(end)) => {
                self.stage = Stage::Idle;
                let end = end.into();
                return Decision::Tell(FromCoord::attempt_ended(c, end));
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
            // A standby: no ranks; it follows the attempt to its end like everyone.
            self.stage = Stage::Running(c);
            return Decision::Run(c, FromCoord::Event(Event::Standby { attempt: c }));
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
            FromCoord::Event(Event::Joined {
                attempt: c,
                placement: Placement {
                    group_rank: slot,
                    rank_offset,
                    world_size: go.world_size,
                },
                max_restarts: go.max_restarts,
                calculated,
            }),
        )
    }

    /// Input (the store outside the job): the coordinator, node `old`, is gone and this agent won
    /// the coordinator's lease; `alive`: the nodes whose leases the store still holds (this one's
    /// included). It rebuilds what the coordinator knew from what every agent read (the last
    /// verdict's slots and budget, the attempt it joined) and the leases (a member without one is
    /// lost for good), and loses `old` as any other node: with a standby for its slot, the attempt
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

    /// Whether this agent's job ends with node rank 0 when it cannot go on: node rank 0 hosts
    /// the store it reaches everything through (the store in the job), and this is not it. Its
    /// allocation is then recorded by the survivors of node rank 0 (docs/allocations.md).
    pub fn hosted_by_head(&self) -> bool {
        !self.setup.head && !self.setup.outside
    }

    /// Whether this agent coordinates the job.
    pub fn is_head(&self) -> bool {
        self.setup.head
    }

    /// Whether another agent took the coordinator's lease over from this one.
    pub fn deposed(&self) -> bool {
        self.deposed
    }

    /// Input: attempt `c`'s end as read from `c<N>/end` (the first report won).
    pub fn ended(&mut self, c: u32, value: &[u8]) -> Decision {
        self.stage = Stage::Idle;
        match serde_json::from_slice::<WireEnd>(value) {
            Ok(end) => {
                let end = JobEnd::from(end);
                self.failed_on.push(match &end {
                    JobEnd::Failed { node, .. } => Some(*node),
                    _ => None,
                });
                Decision::Tell(FromCoord::attempt_ended(c, end))
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
    /// every node restarts and the next `go` gives its slot to a standby. Otherwise this attempt
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
            attempt: self.attempt,
            end,
        }
    }

    fn lose_to_a_standby(&mut self, k: u32, reason: String) -> Loss {
        self.dead.push(k);
        let then = match self.stage {
            Stage::WaitAll(c) => AfterLoss::CompleteJoin(c),
            Stage::Running(c) if self.slots.contains(&k) => AfterLoss::EndAttempt {
                attempt: c,
                end: JobEnd::Failed {
                    node: k,
                    reason: reason.clone(),
                },
            },
            _ => AfterLoss::Nothing,
        };
        let standby_gone = (!self.slots.contains(&k)).then(|| self.spares_ready(&self.slots));
        Loss::ToStandby {
            members: self.members().len(),
            attempts: [self.attempt, self.attempt + 1],
            then,
            node: k,
            reason,
            standby_gone,
        }
    }

    /// The standbys ready to take a lost node's place while `slots` run ranks: members of no
    /// slot, never benched, and healthy by their last join record.
    pub fn spares_ready(&self, slots: &[u32]) -> u32 {
        self.members()
            .into_iter()
            .filter(|n| !slots.contains(n) && !self.benched.contains(n))
            .filter(|n| self.infos.get(n).and_then(|i| i.healthy) != Some(false))
            .count() as u32
    }

    /// Whether attempt `c`'s rendezvous has a last call: the job's first, with standbys. Later
    /// ones wait for their members (a member slow to come back is not dropped; a lost one is
    /// noticed by its lease and liveness).
    pub fn has_last_call(&self, c: u32) -> bool {
        c == 0 && self.spares()
    }

    /// Input (node rank 0, `--nnodes MIN:MAX`): attempt `c`'s rendezvous had at least MIN nodes and
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
            attempts: [c, c + 1],
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

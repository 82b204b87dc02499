//! What the agents write to the store: key names and the messages (JSON), in types of their own.
//!
//! The messages are the wire's, not the supervisor's: [`WireEnd`], [`WireTimeouts`] and
//! [`WireSteps`] mirror `JobEnd`, `Timeouts` and `StepReport` and convert to and from them, so a
//! change to a supervisor type cannot silently change what another agent reads. Their JSON is
//! [`PROTOCOL`]'s: node rank 0 writes its protocol into the job's shape (`vigil/job`), and an
//! agent that speaks another is refused with one line before it writes anything
//! ([`JobShape::refusal`]). Change a message's JSON only together with [`PROTOCOL`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::supervise::monitor::Timeouts;
use crate::supervise::{JobEnd, StepReport};

/// The version of the agents' messages in the store. 1: the messages as first numbered (the same
/// JSON as the unnumbered ones before, whose job shape reads as protocol 0). 2: the verdict in
/// O(1) bytes ([`WireGo`]). 3: liveness renewals one-way (the store's RENEW) and node rank 0's
/// one SWEEP per period, which a store of protocol 2 does not know.
pub const PROTOCOL: u32 = 3;

/// What a node says about itself when it joins an attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub nproc: u32,
    pub host: String,
    pub pid: u32,
    /// Where the node sits in the network (`SLURM_TOPOLOGY_ADDR`): a standby close to a lost node
    /// takes its place first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// Hot spares: whether it passed its health check before this rendezvous (`None`: no check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
}

/// The rendezvous' answer for one attempt: start, with these ranks. Every node reads it, so on the
/// wire it is [`WireGo`]: a few dozen bytes whatever the job's size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "WireGo", try_from = "WireGo")]
pub struct Go {
    #[serde(rename = "cycle")]
    pub attempt: u32,
    pub world_size: u32,
    /// Global rank of local rank 0, per slot (group rank).
    pub offsets: Vec<u32>,
    /// The node id playing each slot (hot spares); empty: slot i is node i. A node without a
    /// slot is a standby for this attempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<u32>,
    /// The job's restart budget (node rank 0's `--max-restarts`).
    pub max_restarts: u32,
    /// Calculated timeouts node rank 0 hands to every node.
    pub calculated: Option<WireTimeouts>,
}

/// [`Go`] as every node reads it, in O(1) bytes for the usual job (field finding 29: a list per
/// node, read by every node, made each rendezvous move O(N^2) bytes).
/// - Offsets: `per_slot` ranks for every slot (slot `s` starts at `s * per_slot`); only when
///   slots run different numbers of ranks (no hot spares, different `--nproc-per-node`) the
///   whole list, `offsets`.
/// - Slots (hot spares): `slotted` with the slots a standby plays, as `[slot, node]` pairs;
///   every other slot `s` is played by node `s`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireGo {
    #[serde(rename = "cycle")]
    attempt: u32,
    world_size: u32,
    slots: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    per_slot: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    offsets: Vec<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    slotted: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    moved: Vec<[u32; 2]>,
    max_restarts: u32,
    calculated: Option<WireTimeouts>,
}

impl From<Go> for WireGo {
    fn from(g: Go) -> WireGo {
        let n = g.offsets.len() as u32;
        let per = g.offsets.get(1).copied().unwrap_or(g.world_size);
        let uniform = per.checked_mul(n) == Some(g.world_size)
            && g.offsets.iter().zip(0u32..).all(|(o, s)| *o == s * per);
        let moved = (g.slots.iter().zip(0u32..))
            .filter(|(node, slot)| *node != slot)
            .map(|(node, slot)| [slot, *node])
            .collect();
        WireGo {
            attempt: g.attempt,
            world_size: g.world_size,
            slots: n,
            per_slot: uniform.then_some(per),
            offsets: if uniform { Vec::new() } else { g.offsets },
            slotted: !g.slots.is_empty(),
            moved,
            max_restarts: g.max_restarts,
            calculated: g.calculated,
        }
    }
}

/// The most slots a verdict may name: a verdict is read before anything else checks it, and a
/// garbled count must not allocate without bound.
pub const MAX_SLOTS: u32 = 1 << 20;

/// A verdict whose numbers cannot be a job's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadVerdict {
    #[error("{0} slots, more than {MAX_SLOTS}")]
    TooManySlots(u32),
    #[error("slot {slot} of {slots}")]
    NoSuchSlot { slot: u32, slots: u32 },
}

impl TryFrom<WireGo> for Go {
    type Error = BadVerdict;

    fn try_from(w: WireGo) -> Result<Go, BadVerdict> {
        if w.slots > MAX_SLOTS {
            return Err(BadVerdict::TooManySlots(w.slots));
        }
        if let Some([slot, _]) = w.moved.iter().find(|[slot, _]| *slot >= w.slots) {
            return Err(BadVerdict::NoSuchSlot {
                slot: *slot,
                slots: w.slots,
            });
        }
        let offsets = match w.per_slot {
            Some(per) => (0..w.slots).map(|s| s * per).collect(),
            None => w.offsets,
        };
        let mut slots: Vec<u32> = if w.slotted {
            (0..w.slots).collect()
        } else {
            Vec::new()
        };
        for [slot, node] in w.moved {
            slots[slot as usize] = node;
        }
        Ok(Go {
            attempt: w.attempt,
            world_size: w.world_size,
            offsets,
            slots,
            max_restarts: w.max_restarts,
            calculated: w.calculated,
        })
    }
}

impl Go {
    /// This node's slot (group rank) in the attempt; `None`: it is a standby.
    pub fn slot_of(&self, node: u32) -> Option<u32> {
        if self.slots.is_empty() {
            return ((node as usize) < self.offsets.len()).then_some(node);
        }
        self.slots.iter().position(|n| *n == node).map(|p| p as u32)
    }
}

/// What every agent of a job must agree on before it may write any of the job's keys: node rank
/// 0 writes it first (`vigil/job`); every other agent reads it and compares its own
/// ([`JobShape::refusal`]) before it claims its node rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobShape {
    /// The [`PROTOCOL`] node rank 0 speaks; absent (0): a vigil from before it was numbered.
    #[serde(default)]
    pub protocol: u32,
    /// The job's identity (`--rdzv-id`, Slurm's or NGC's job id); `None`: none.
    pub job: Option<String>,
    /// Every agent, standbys included (`--nnodes`'s MAX).
    pub nnodes: u32,
    /// The nodes that run ranks (`--nnodes`'s MIN).
    pub active: u32,
    /// Node rank 0's `--nproc-per-node`.
    pub nproc: u32,
}

impl JobShape {
    fn nnodes_flag(&self) -> String {
        if self.active < self.nnodes {
            format!("--nnodes {}:{}", self.active, self.nnodes)
        } else {
            format!("--nnodes {}", self.nnodes)
        }
    }

    /// Why an agent of shape `mine` may not join this job (pure); `None`: it may. Ranks per node
    /// must match only with hot spares, where a standby takes any node's place; otherwise nodes
    /// may run different `--nproc-per-node` (and a node rank is claimed once).
    pub fn refusal(&self, mine: &JobShape, node_rank: Option<u32>) -> Option<String> {
        let me = match node_rank {
            Some(r) => format!("--node-rank {r}"),
            None => "which the rendezvous had not given a node rank yet".to_string(),
        };
        // Checked first: in another protocol the other fields may not mean what they say here.
        if self.protocol != mine.protocol {
            return Some(format!(
                "refused by node rank 0: it speaks vigil's rendezvous protocol {} and this agent speaks {}; this agent ({me}) left the job untouched: run the same vigil version on every node",
                self.protocol, mine.protocol
            ));
        }
        let id = |j: &Option<String>| match j {
            Some(j) => format!("job id {j:?}"),
            None => "no job id".to_string(),
        };
        let why = if self.job != mine.job {
            format!(
                "it runs {} and this agent has {} (--rdzv-id, SLURM_JOB_ID): an agent of another job",
                id(&self.job),
                id(&mine.job)
            )
        } else if (self.nnodes, self.active) != (mine.nnodes, mine.active) {
            format!(
                "it runs {} and this agent has {}",
                self.nnodes_flag(),
                mine.nnodes_flag()
            )
        } else if self.active < self.nnodes && self.nproc != mine.nproc {
            format!(
                "it runs --nproc-per-node {} with hot spares (a standby takes any node's place) and this agent has --nproc-per-node {}",
                self.nproc, mine.nproc
            )
        } else {
            return None;
        };
        Some(format!(
            "refused by node rank 0: {why}; this agent ({me}) does not belong to that job and left it untouched: give every node of a job the same --nnodes, --nproc-per-node and job id"
        ))
    }
}

/// The value of `c<N>/go`: start, or the job ended before this attempt could begin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Go(Go),
    End(WireEnd),
}

/// How an attempt ended for the whole job (`c<N>/end`, and `Verdict::End`): `JobEnd` on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum WireEnd {
    Done,
    Failed {
        node: u32,
        reason: String,
    },
    Stopped {
        node: u32,
        reason: String,
        exit_code: i32,
    },
    Lost {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u32>,
    },
}

impl From<&JobEnd> for WireEnd {
    fn from(e: &JobEnd) -> Self {
        match e.clone() {
            JobEnd::Done => WireEnd::Done,
            JobEnd::Failed { node, reason } => WireEnd::Failed { node, reason },
            JobEnd::Stopped {
                node,
                reason,
                exit_code,
            } => WireEnd::Stopped {
                node,
                reason,
                exit_code,
            },
            JobEnd::Lost { reason, node } => WireEnd::Lost { reason, node },
        }
    }
}

impl From<WireEnd> for JobEnd {
    fn from(e: WireEnd) -> Self {
        match e {
            WireEnd::Done => JobEnd::Done,
            WireEnd::Failed { node, reason } => JobEnd::Failed { node, reason },
            WireEnd::Stopped {
                node,
                reason,
                exit_code,
            } => JobEnd::Stopped {
                node,
                reason,
                exit_code,
            },
            WireEnd::Lost { reason, node } => JobEnd::Lost { reason, node },
        }
    }
}

/// Timeouts in seconds (a node's share, the job's merge, `Go.calculated`): `Timeouts` on the
/// wire. `null` or a missing field: that check is off.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WireTimeouts {
    #[serde(default)]
    pub initial: Option<f64>,
    #[serde(default)]
    pub heartbeat: Option<f64>,
    #[serde(default)]
    pub sections: BTreeMap<String, f64>,
    #[serde(default)]
    pub out_of_section: Option<f64>,
    #[serde(default)]
    pub warmup: Option<f64>,
}

/// A message that parsed but says something this agent cannot take.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("a timeout of {0} s is more than a year")]
    TooLong(f64),
}

impl From<&Timeouts> for WireTimeouts {
    fn from(t: &Timeouts) -> Self {
        let s = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
        WireTimeouts {
            initial: s(t.initial),
            heartbeat: s(t.heartbeat),
            sections: t
                .sections
                .iter()
                .map(|(k, d)| (k.clone(), d.as_secs_f64()))
                .collect(),
            out_of_section: s(t.out_of_section),
            warmup: s(t.warmup),
        }
    }
}

impl TryFrom<&WireTimeouts> for Timeouts {
    type Error = WireError;

    /// As a saved timeout is read: zero, negative or not finite is off; beyond a year is an error.
    fn try_from(w: &WireTimeouts) -> Result<Self, WireError> {
        fn secs(x: Option<f64>) -> Result<Option<Duration>, WireError> {
            match x {
                Some(x) if x.is_finite() && x > 0.0 => {
                    if x > crate::values::MAX_SECONDS {
                        return Err(WireError::TooLong(x));
                    }
                    Ok(Some(Duration::from_secs_f64(x)))
                }
                _ => Ok(None),
            }
        }
        let mut sections = BTreeMap::new();
        for (k, x) in &w.sections {
            if let Some(d) = secs(Some(*x))? {
                sections.insert(k.clone(), d);
            }
        }
        Ok(Timeouts {
            initial: secs(w.initial)?,
            heartbeat: secs(w.heartbeat)?,
            sections,
            out_of_section: secs(w.out_of_section)?,
            warmup: secs(w.warmup)?,
        })
    }
}

/// A rank one node offers for the job's hang verdict (`c<N>/hang/<r>/<node>`, a JSON list):
/// `HangCandidate` on the wire, its silence's start as wall time (Unix milliseconds), so that
/// nodes compare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireHangCandidate {
    pub rank: u32,
    pub pid: i32,
    pub step: Option<u64>,
    pub section: Option<String>,
    pub silent_since_ms: u64,
    pub stopped: bool,
}

/// What one node reports once a stop was asked (`c<N>/stop/steps/<node>`): `StepReport` on the
/// wire.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WireSteps {
    pub max_step: Option<u64>,
    pub steps_per_s: Option<f64>,
}

impl From<&StepReport> for WireSteps {
    fn from(r: &StepReport) -> Self {
        WireSteps {
            max_step: r.max_step,
            steps_per_s: r.steps_per_s,
        }
    }
}

impl From<WireSteps> for StepReport {
    fn from(w: WireSteps) -> Self {
        StepReport {
            max_step: w.max_step,
            steps_per_s: w.steps_per_s,
        }
    }
}

/// Client key names (the store puts `/` in front; everything lives under `/vigil/`, which
/// survives the reset between attempts).
pub mod key {
    /// Node rank 0 left a job whose store runs outside it (`vigil store`): once every lease
    /// is gone too, the store's service clears the job's keys.
    pub const JOB_END: &str = "vigil/job_end";
    /// The job's [`super::JobShape`], written by node rank 0 before any other agent may join
    /// (c10d without node ranks and the store outside the job: by the first agent to reach it).
    pub const JOB: &str = "vigil/job";
    /// Written by `vigil store` as it starts and after it clears a job: the store runs outside
    /// the job, so no agent hosts it and every agent draws a node-rank ticket.
    pub const SERVICE: &str = "vigil/service";
    /// c10d without node ranks: each agent other than the store's host (every agent, with the
    /// store outside the job) adds 1 and turns the result into its node rank
    /// ([`super::super::decide::hand_out_node_rank`]).
    pub const NODE_TICKETS: &str = "vigil/node_tickets";
    /// The node rank handed out to the agent of this identity (host, pid and a random id drawn at
    /// its start): an agent that asks again (its connection broke mid-claim) gets the same one.
    pub fn node_of(identity: &str) -> String {
        format!("vigil/node_of/{identity}")
    }
    /// What node rank 0 scans for the tickets handed out (who took a node rank that has not
    /// joined).
    pub const NODE_OF_PREFIX_RAW: &[u8] = b"/vigil/node_of/";
    pub fn owner(node: u32) -> String {
        format!("vigil/owner/{node}")
    }
    /// The store outside the job: the coordinator's lease, holding its node rank. Node rank 0
    /// takes it at the start; when its holder's connection ends the store deletes it, and the
    /// live agent with the lowest node rank takes it over with compare-and-set.
    pub const COORD_LEASE: &str = "vigil/lease/coord";
    /// Written by the store (its lease queue on) the moment [`COORD_LEASE`]'s connection ends:
    /// the other agents park on it. The coordinator that takes the lease deletes it.
    pub const COORD_LOST: &str = "vigil/lease_lost/coord";
    pub fn lease(node: u32) -> String {
        format!("vigil/lease/{node}")
    }
    /// Written by a standby's agent as it leaves the job on a signal (its reason), before it
    /// gives its lease back: the coordinator, told the lease was released, reads it and takes
    /// the standby out of the job (docs/spares.md).
    pub fn left(node: u32) -> String {
        format!("vigil/left/{node}")
    }
    /// Written by the coordinator when it loses a node for good (why): the node, if its agent
    /// still runs (it was frozen past the node timeout), reads it and leaves the job with 75.
    pub fn dropped(node: u32) -> String {
        format!("vigil/dropped/{node}")
    }
    /// A counter the node renews (adds 1 to) while its agent runs.
    pub fn alive(node: u32) -> String {
        format!("{ALIVE_PREFIX}{node}")
    }
    /// What node rank 0 sweeps for the counters that stopped moving.
    pub const ALIVE_PREFIX: &str = "vigil/alive/";
    pub const LEASE_PREFIX_RAW: &[u8] = b"/vigil/lease/";
    /// The highest step any of the node's ranks reported, written once as its agent leaves: node
    /// rank 0 records the job's highest step in the ledger, not only its own ranks'.
    pub fn highest(node: u32) -> String {
        format!("vigil/highest/{node}")
    }
    pub const HIGHEST_PREFIX_RAW: &[u8] = b"/vigil/highest/";
    pub fn join(c: u32, node: u32) -> String {
        format!("vigil/c{c}/join/{node}")
    }
    /// Set by the `n`-th node to join attempt `c` (the first rendezvous of a job with standbys:
    /// node rank 0's last call waits on the next one).
    pub fn nth_join(c: u32, n: i64) -> String {
        format!("vigil/c{c}/nth/{n}")
    }
    pub fn joined(c: u32) -> String {
        format!("vigil/c{c}/joined")
    }
    pub fn all(c: u32) -> String {
        format!("vigil/c{c}/all")
    }
    pub fn go(c: u32) -> String {
        format!("vigil/c{c}/go")
    }
    pub fn end(c: u32) -> String {
        format!("vigil/c{c}/end")
    }
    /// Set by a node whose own ranks failed or hung in attempt `c`, whether or not its report
    /// became the attempt's verdict: node rank 0 blames a node only for failures no other node had.
    pub fn failed(c: u32, node: u32) -> String {
        format!("vigil/failed/{c}/{node}")
    }
    pub const FAILED_PREFIX_RAW: &[u8] = b"/vigil/failed/";
    /// Parses a raw key under [`FAILED_PREFIX_RAW`] into `(attempt, node)`.
    pub fn parse_failed(raw: &[u8]) -> Option<(u32, u32)> {
        let rest = std::str::from_utf8(raw.strip_prefix(FAILED_PREFIX_RAW)?).ok()?;
        let (c, n) = rest.split_once('/')?;
        Some((c.parse().ok()?, n.parse().ok()?))
    }
    pub fn done(c: u32) -> String {
        format!("vigil/c{c}/done")
    }
    pub fn node_timeouts(c: u32, round: u32, node: u32) -> String {
        format!("vigil/c{c}/r{round}/timeouts/{node}")
    }
    pub fn timeouts_count(c: u32, round: u32) -> String {
        format!("vigil/c{c}/r{round}/timeouts_n")
    }
    pub fn timeouts(c: u32, round: u32) -> String {
        format!("vigil/c{c}/r{round}/timeouts")
    }
    /// In-process generation `g` of attempt `c` (docs/inprocess.md): the global ranks it
    /// replaces (JSON list; compare-and-set, the first node to begin it wins).
    pub fn generation(c: u32, g: u64) -> String {
        format!("vigil/c{c}/gen/{g}")
    }
    /// The job's hang verdict `r` of attempt `c` is asked for (compare-and-set; every node
    /// then reports its candidates).
    pub fn hang(c: u32, r: u32) -> String {
        format!("vigil/c{c}/hang/{r}")
    }
    /// Node `node`'s candidates for hang verdict `r` (JSON list of [`super::WireHangCandidate`]).
    pub fn hang_report(c: u32, r: u32, node: u32) -> String {
        format!("vigil/c{c}/hang/{r}/{node}")
    }
    pub fn hang_count(c: u32, r: u32) -> String {
        format!("vigil/c{c}/hang/{r}/n")
    }
    /// The job's hang verdict `r` (JSON: a [`super::WireHangCandidate`], or null: none).
    pub fn hang_named(c: u32, r: u32) -> String {
        format!("vigil/c{c}/hang/{r}/named")
    }
    /// The job's stop trigger in attempt `c` (JSON string; compare-and-set, the first one wins).
    pub fn stop(c: u32) -> String {
        format!("vigil/c{c}/stop")
    }
    /// Node `node`'s steps once a stop was asked (JSON [`super::WireSteps`]).
    pub fn stop_steps(c: u32, node: u32) -> String {
        format!("vigil/c{c}/stop/steps/{node}")
    }
    pub fn stop_count(c: u32) -> String {
        format!("vigil/c{c}/stop/n")
    }
    /// The job's stop step (JSON: a number, or null for "stop now").
    pub fn stop_step(c: u32) -> String {
        format!("vigil/c{c}/stop/step")
    }
    /// How many agents join attempt `c` (hot spares: fewer once nodes were lost); absent: all.
    pub fn members(c: u32) -> String {
        format!("vigil/c{c}/members")
    }
    /// Node `node`'s latest straggler summary (JSON), overwritten as it changes; not per attempt.
    pub fn perf(node: u32) -> String {
        format!("vigil/perf/{node}")
    }
    /// Raw prefix of one attempt's keys, removed once every node is in the next attempt.
    pub fn attempt_prefix_raw(c: u32) -> Vec<u8> {
        format!("/vigil/c{c}/").into_bytes()
    }
}

pub(super) fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("plain data serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::rendezvous::decide::assign;

    fn shape(job: Option<&str>, active: u32, nnodes: u32, nproc: u32) -> JobShape {
        JobShape {
            job: job.map(str::to_string),
            nnodes,
            active,
            nproc,
            protocol: PROTOCOL,
        }
    }

    fn round_trip(go: &Go) -> Go {
        serde_json::from_slice(&to_json(go)).unwrap()
    }

    /// Field finding 29: every node reads the verdict, so its size is paid N times. It must not
    /// grow with the job: at 10,000 nodes it was ~110 KB (a list of offsets), read 10,000 times.
    #[test]
    fn the_verdict_is_o1_bytes_whatever_the_jobs_size() {
        let small = assign(3, &vec![info(8); 2], 5, None);
        let large = assign(3, &vec![info(8); 10_000], 5, None);
        let (s, l) = (to_json(&small).len(), to_json(&large).len());
        // Only the numbers' digits grow.
        assert!(
            l < s + 16 && l < 120,
            "{}",
            String::from_utf8_lossy(&to_json(&large))
        );
        assert_eq!(round_trip(&large), large);
        assert_eq!(large.offsets[9_999], 79_992);
        // Hot spares: slots played by standbys are the exceptions, named one by one.
        let mut spared = large.clone();
        spared.slots = (0..10_000).collect();
        spared.slots[17] = 10_003;
        spared.slots[4_000] = 10_001;
        let bytes = to_json(&spared);
        assert!(bytes.len() < l + 60, "{}", String::from_utf8_lossy(&bytes));
        let back = round_trip(&spared);
        assert_eq!(back, spared);
        assert_eq!((back.slot_of(10_003), back.slot_of(17)), (Some(17), None));
    }

    #[test]
    fn a_verdict_with_different_ranks_per_node_keeps_every_offset() {
        let go = assign(0, &[info(2), info(4), info(2)], 1, None);
        assert_eq!(go.offsets, vec![0, 2, 6]);
        assert_eq!(round_trip(&go), go);
        let uniform_but_one = assign(0, &[info(2), info(2), info(3)], 1, None);
        assert_eq!(round_trip(&uniform_but_one), uniform_but_one);
        let one = assign(0, &[info(8)], 0, None);
        assert_eq!(round_trip(&one), one);
        let identity = Go {
            slots: vec![0, 1, 2],
            ..go.clone()
        };
        assert_eq!(round_trip(&identity), identity);
    }

    #[test]
    fn a_garbled_verdict_is_refused_not_allocated() {
        let huge = br#"{"cycle":0,"world_size":1,"slots":4000000000,"per_slot":1,"max_restarts":0,"calculated":null}"#;
        let e = serde_json::from_slice::<Go>(huge).unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
        let outside = br#"{"cycle":0,"world_size":2,"slots":2,"per_slot":1,"slotted":true,"moved":[[5,3]],"max_restarts":0,"calculated":null}"#;
        let e = serde_json::from_slice::<Go>(outside)
            .unwrap_err()
            .to_string();
        assert!(e.contains("slot 5 of 2"), "{e}");
    }

    #[test]
    fn an_agent_of_another_protocol_is_refused_in_one_line() {
        let job = shape(Some("7"), 2, 2, 1);
        let old = JobShape {
            protocol: PROTOCOL + 1,
            ..job.clone()
        };
        let why = job.refusal(&old, Some(1)).unwrap();
        assert!(
            why.starts_with(&format!(
                "refused by node rank 0: it speaks vigil's rendezvous protocol {PROTOCOL} and this agent speaks {}",
                PROTOCOL + 1
            )),
            "{why}"
        );
        assert!(why.contains("run the same vigil version"), "{why}");
        assert!(!why.contains('\n'));
        // A node rank 0 from before the protocol was numbered says none: protocol 0.
        let unnumbered = r#"{"job":"7","nnodes":2,"active":2,"nproc":1}"#;
        let theirs: JobShape = serde_json::from_str(unnumbered).unwrap();
        assert_eq!(theirs.protocol, 0);
        assert!(theirs
            .refusal(&job, Some(1))
            .unwrap()
            .contains("protocol 0"));
        let back: JobShape = serde_json::from_slice(&to_json(&job)).unwrap();
        assert_eq!(back, job);
    }

    fn ends() -> Vec<JobEnd> {
        vec![
            JobEnd::Done,
            JobEnd::Failed {
                node: 1,
                reason: "rank 3 exited with code 1".into(),
            },
            JobEnd::Stopped {
                node: 0,
                reason: "SIGTERM".into(),
                exit_code: 143,
            },
            JobEnd::Lost {
                reason: "x".into(),
                node: Some(2),
            },
            JobEnd::Lost {
                reason: "y".into(),
                node: None,
            },
        ]
    }

    #[test]
    fn verdicts_round_trip_and_ends_convert_both_ways() {
        let mut verdicts = vec![Verdict::Go(assign(
            0,
            &[info(1)],
            0,
            Some(WireTimeouts::default()),
        ))];
        verdicts.extend(ends().iter().map(|e| Verdict::End(e.into())));
        for v in verdicts {
            let back: Verdict = serde_json::from_slice(&to_json(&v)).unwrap();
            assert_eq!(back, v);
        }
        for end in ends() {
            let wire = WireEnd::from(&end);
            let back: WireEnd = serde_json::from_slice(&to_json(&wire)).unwrap();
            assert_eq!(JobEnd::from(back), end);
        }
    }

    #[test]
    fn the_wire_reads_what_the_unnumbered_protocol_wrote() {
        // Protocol 1 kept the JSON of the messages from before it was numbered.
        let lost: WireEnd =
            serde_json::from_str(r#"{"end":"lost","reason":"r","node":2}"#).unwrap();
        assert_eq!(
            JobEnd::from(lost),
            JobEnd::Lost {
                reason: "r".into(),
                node: Some(2)
            }
        );
        let t: WireTimeouts = serde_json::from_str(
            r#"{"initial":10.0,"heartbeat":null,"sections":{"step":2.5},"out_of_section":null,"warmup":null}"#,
        )
        .unwrap();
        let t = Timeouts::try_from(&t).unwrap();
        assert_eq!(t.initial, Some(Duration::from_secs(10)));
        assert_eq!(t.heartbeat, None);
        assert_eq!(t.sections["step"], Duration::from_millis(2500));
        let s: WireSteps = serde_json::from_str(r#"{"max_step":7,"steps_per_s":null}"#).unwrap();
        assert_eq!(StepReport::from(s).max_step, Some(7));
    }

    #[test]
    fn timeouts_cross_the_wire_unchanged_and_a_year_is_the_limit() {
        let s = Duration::from_secs;
        let t = Timeouts {
            initial: Some(s(10)),
            heartbeat: None,
            sections: [("step".to_string(), Duration::from_millis(1500))].into(),
            out_of_section: Some(s(3)),
            warmup: Some(s(900)),
        };
        let w: WireTimeouts = serde_json::from_slice(&to_json(&WireTimeouts::from(&t))).unwrap();
        assert_eq!(Timeouts::try_from(&w).unwrap(), t);
        let off = WireTimeouts {
            initial: Some(0.0),
            heartbeat: Some(-1.0),
            sections: [("step".to_string(), f64::NAN)].into(),
            ..Default::default()
        };
        assert_eq!(Timeouts::try_from(&off).unwrap(), Timeouts::default());
        let long = WireTimeouts {
            warmup: Some(1e9),
            ..Default::default()
        };
        assert_eq!(Timeouts::try_from(&long), Err(WireError::TooLong(1e9)));
    }

    #[test]
    fn a_stray_of_another_shape_or_job_is_refused_and_told_why() {
        let job = shape(Some("7"), 2, 2, 1);
        assert_eq!(job.refusal(&job.clone(), Some(1)), None);
        let why = job.refusal(&shape(Some("7"), 3, 3, 1), Some(2)).unwrap();
        assert!(
            why.starts_with(
                "refused by node rank 0: it runs --nnodes 2 and this agent has --nnodes 3;"
            ),
            "{why}"
        );
        let why = job.refusal(&shape(Some("8"), 2, 2, 1), Some(1)).unwrap();
        assert!(
            why.contains("job id \"7\" and this agent has job id \"8\""),
            "{why}"
        );
        let why = job.refusal(&shape(None, 2, 2, 1), Some(1)).unwrap();
        assert!(why.contains("this agent has no job id"), "{why}");
        // Without spares nodes may run different --nproc-per-node.
        assert_eq!(job.refusal(&shape(Some("7"), 2, 2, 4), Some(1)), None);
        let spares = shape(None, 2, 3, 1);
        let why = spares.refusal(&shape(None, 2, 4, 1), Some(3)).unwrap();
        assert!(
            why.contains("--nnodes 2:3 and this agent has --nnodes 2:4"),
            "{why}"
        );
        let why = spares.refusal(&shape(None, 2, 3, 2), Some(2)).unwrap();
        assert!(why.contains("--nproc-per-node 1 with hot spares"), "{why}");
        assert!(why.contains("--nproc-per-node 2"), "{why}");
        assert!(!why.contains('\n'));
    }

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
    fn without_slots_slot_i_is_node_i_and_a_protocol_1_verdict_is_not_misread() {
        let go = assign(0, &[info(1), info(1)], 0, None);
        assert_eq!((go.slot_of(1), go.slot_of(2)), (Some(1), None));
        assert!(!serde_json::to_string(&go).unwrap().contains("slotted"));
        // Agents of protocol 1 are refused by the job's shape before they read a verdict; were
        // one read anyway, it is unreadable, not a job of no nodes.
        let old =
            r#"{"cycle":0,"world_size":2,"offsets":[0,1],"max_restarts":0,"calculated":null}"#;
        assert!(serde_json::from_str::<Go>(old).is_err());
    }

    #[test]
    fn tickets_are_found_under_their_prefix() {
        let raw = format!("/{}", key::node_of("node-b-42-00ff"));
        let id = raw.as_bytes().strip_prefix(key::NODE_OF_PREFIX_RAW);
        assert_eq!(id, Some(&b"node-b-42-00ff"[..]));
    }

    #[test]
    fn failure_keys_read_back_as_attempt_and_node() {
        let raw = format!("/{}", key::failed(3, 12));
        assert!(raw.as_bytes().starts_with(key::FAILED_PREFIX_RAW));
        assert_eq!(key::parse_failed(raw.as_bytes()), Some((3, 12)));
        assert_eq!(key::parse_failed(b"/vigil/failed/x/1"), None);
        assert_eq!(key::parse_failed(b"/vigil/lease/1"), None);
    }
}

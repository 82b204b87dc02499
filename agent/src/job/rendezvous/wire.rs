//! What the agents write to the store: key names, the messages (JSON), and the pure functions
//! over them (rank assignment, the job's timeouts).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::supervise::monitor::Timeouts;
use crate::supervise::JobEnd;

/// What a node says about itself when it joins a cycle.
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

/// The rendezvous' answer for one cycle: start, with these ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Go {
    pub cycle: u32,
    pub world_size: u32,
    /// Global rank of local rank 0, per slot (group rank).
    pub offsets: Vec<u32>,
    /// The node id playing each slot (hot spares); empty: slot i is node i. A node without a
    /// slot is a standby for this cycle.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<u32>,
    /// The job's restart budget (node rank 0's `--max-restarts`).
    pub max_restarts: u32,
    /// Calculated timeouts node rank 0 hands to every node.
    pub calculated: Option<Timeouts>,
}

/// What every agent of a job must agree on before it may write any of the job's keys: node rank
/// 0 writes it first (`vigil/job`); every other agent reads it and compares its own
/// ([`JobShape::refusal`]) before it claims its node rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobShape {
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
    pub fn refusal(&self, mine: &JobShape, node_rank: u32) -> Option<String> {
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
            "refused by node rank 0: {why}; this agent (--node-rank {node_rank}) does not belong to that job and left it untouched: give every node of a job the same --nnodes, --nproc-per-node and job id"
        ))
    }
}

/// The value of `c<N>/go`: start, or the job ended before this cycle could begin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Go(Go),
    End(JobEnd),
}

/// Client key names (the store puts `/` in front; everything lives under `/vigil/`, which
/// survives the reset between attempts).
pub mod key {
    /// The job's [`super::JobShape`], written by node rank 0 before any other agent may join.
    pub const JOB: &str = "vigil/job";
    pub fn owner(node: u32) -> String {
        format!("vigil/owner/{node}")
    }
    pub fn lease(node: u32) -> String {
        format!("vigil/lease/{node}")
    }
    /// A counter the node adds 1 to while its agent runs.
    pub fn alive(node: u32) -> String {
        format!("vigil/alive/{node}")
    }
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
    /// Set by a node whose own ranks failed or hung in cycle `c`, whether or not its report
    /// became the cycle's verdict: node rank 0 blames a node only for failures no other node had.
    pub fn failed(c: u32, node: u32) -> String {
        format!("vigil/failed/{c}/{node}")
    }
    pub const FAILED_PREFIX_RAW: &[u8] = b"/vigil/failed/";
    /// Parses a raw key under [`FAILED_PREFIX_RAW`] into `(cycle, node)`.
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
    /// The job's stop trigger in cycle `c` (JSON string; compare-and-set, the first one wins).
    pub fn stop(c: u32) -> String {
        format!("vigil/c{c}/stop")
    }
    /// Node `node`'s steps once a stop was asked (JSON `StepReport`).
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
    /// How many agents join cycle `c` (hot spares: fewer once nodes were lost); absent: all.
    pub fn members(c: u32) -> String {
        format!("vigil/c{c}/members")
    }
    /// Node `node`'s latest straggler summary (JSON), overwritten as it changes; not per cycle.
    pub fn perf(node: u32) -> String {
        format!("vigil/perf/{node}")
    }
    /// Raw prefix of one cycle's keys, removed once every node is in the next cycle.
    pub fn cycle_prefix_raw(c: u32) -> Vec<u8> {
        format!("/vigil/c{c}/").into_bytes()
    }
}

/// Global ranks by node rank: node `n`'s local rank 0 is the sum of the ranks of nodes `0..n`.
pub fn assign(
    cycle: u32,
    nodes: &[NodeInfo],
    max_restarts: u32,
    calculated: Option<Timeouts>,
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

impl Go {
    /// This node's slot (group rank) in the cycle; `None`: it is a standby.
    pub fn slot_of(&self, node: u32) -> Option<u32> {
        if self.slots.is_empty() {
            return ((node as usize) < self.offsets.len()).then_some(node);
        }
        self.slots.iter().position(|n| *n == node).map(|p| p as u32)
    }
}

/// Global ranks by slot when standbys play some slots (`spares::refill`): slot `s`'s local rank 0
/// is the sum of the ranks of slots `0..s`, each counted with the node that plays it. `None` when
/// a slot's node did not join.
pub fn assign_slots(
    cycle: u32,
    slots: &[u32],
    joined: &std::collections::BTreeMap<u32, NodeInfo>,
    max_restarts: u32,
    calculated: Option<Timeouts>,
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

pub(super) fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("plain data serializes")
}

#[cfg(test)]
mod slot_tests {
    use super::*;
    use std::collections::BTreeMap;

    fn shape(job: Option<&str>, active: u32, nnodes: u32, nproc: u32) -> JobShape {
        JobShape {
            job: job.map(str::to_string),
            nnodes,
            active,
            nproc,
        }
    }

    #[test]
    fn a_stray_of_another_shape_or_job_is_refused_and_told_why() {
        let job = shape(Some("7"), 2, 2, 1);
        assert_eq!(job.refusal(&job.clone(), 1), None);
        let why = job.refusal(&shape(Some("7"), 3, 3, 1), 2).unwrap();
        assert!(
            why.starts_with(
                "refused by node rank 0: it runs --nnodes 2 and this agent has --nnodes 3;"
            ),
            "{why}"
        );
        let why = job.refusal(&shape(Some("8"), 2, 2, 1), 1).unwrap();
        assert!(
            why.contains("job id \"7\" and this agent has job id \"8\""),
            "{why}"
        );
        let why = job.refusal(&shape(None, 2, 2, 1), 1).unwrap();
        assert!(why.contains("this agent has no job id"), "{why}");
        // Without spares nodes may run different --nproc-per-node.
        assert_eq!(job.refusal(&shape(Some("7"), 2, 2, 4), 1), None);
        let spares = shape(None, 2, 3, 1);
        let why = spares.refusal(&shape(None, 2, 4, 1), 3).unwrap();
        assert!(
            why.contains("--nnodes 2:3 and this agent has --nnodes 2:4"),
            "{why}"
        );
        let why = spares.refusal(&shape(None, 2, 3, 2), 2).unwrap();
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
    fn without_slots_slot_i_is_node_i_and_old_verdicts_still_read() {
        let go = assign(0, &[info(1), info(1)], 0, None);
        assert_eq!((go.slot_of(1), go.slot_of(2)), (Some(1), None));
        let old =
            r#"{"cycle":0,"world_size":2,"offsets":[0,1],"max_restarts":0,"calculated":null}"#;
        let back: Go = serde_json::from_str(old).unwrap();
        assert_eq!(back, go);
        assert!(!serde_json::to_string(&go).unwrap().contains("slots"));
    }

    #[test]
    fn failure_keys_read_back_as_cycle_and_node() {
        let raw = format!("/{}", key::failed(3, 12));
        assert!(raw.as_bytes().starts_with(key::FAILED_PREFIX_RAW));
        assert_eq!(key::parse_failed(raw.as_bytes()), Some((3, 12)));
        assert_eq!(key::parse_failed(b"/vigil/failed/x/1"), None);
        assert_eq!(key::parse_failed(b"/vigil/lease/1"), None);
    }
}

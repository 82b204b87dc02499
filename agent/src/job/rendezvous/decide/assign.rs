//! The free pure functions of the rendezvous: node ranks handed out by ticket, global ranks by
//! node or by slot, the last call's note and the job-wide merged timeouts.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::supervise::monitor::Timeouts;

use super::super::wire::{Go, NodeInfo, WireTimeouts};

/// What node rank 0 says when the last call of attempt `c` ran out and the job starts with
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
    attempt: u32,
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
        attempt,
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
    attempt: u32,
    slots: &[u32],
    joined: &BTreeMap<u32, NodeInfo>,
    max_restarts: u32,
    calculated: Option<WireTimeouts>,
) -> Option<Go> {
    let nodes: Vec<NodeInfo> = slots
        .iter()
        .map(|n| joined.get(n).cloned())
        .collect::<Option<_>>()?;
    let mut go = assign(attempt, &nodes, max_restarts, calculated);
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

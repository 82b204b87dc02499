//! What node rank 0 (or the coordinating node, or a survivor of node rank 0's loss) writes to the
//! ledger about this allocation, gathered from the agent's parts: the teardown's last record and
//! the early one of an agreed SIGTERM stop both take it from here.

use std::time::SystemTime;

use super::agent::Agent;
use super::allocation::{EndWatch, Ending};
use crate::allocation::blame;
use crate::job::rendezvous;
use crate::supervise::{Outcome, Supervisor};

/// What node rank 0 (or the coordinating node, or a survivor of node rank 0's loss) records of
/// the allocation; `None` on the other nodes.
pub(super) fn of<'a>(
    agent: &'a Agent,
    sup: &'a Supervisor,
    endw: &EndWatch,
    (keys, started): (Option<&vigil_store::KeySpace>, SystemTime),
    outcome: &'a Outcome,
) -> Option<Ending<'a>> {
    // With node rank 0's store, a survivor of node rank 0's loss records the allocation in its
    // place (the first to take the ledger's lock).
    let survivor = agent.trail.head_lost && matches!(outcome, Outcome::Lost { .. });
    if agent.cfg.node_rank != 0 && !agent.trail.coordinates && !survivor {
        return None;
    }
    Some(Ending {
        cfg: &agent.cfg,
        run_dir: &agent.run_dir,
        outcome,
        sup,
        peers_highest: keys.and_then(peers_highest),
        started,
        lead: endw.lead(sup),
        promotions: agent.trail.promotions.clone(),
        blame: blame_nodes(agent, sup, keys),
        index: agent.trail.allocation_index,
        survivor,
    })
}

/// The highest step the other nodes' ranks reported, as they left it in the store.
fn peers_highest(keys: &vigil_store::KeySpace) -> Option<u64> {
    keys.keys_raw()
        .iter()
        .filter(|raw| raw.starts_with(rendezvous::key::HIGHEST_PREFIX_RAW))
        .filter_map(|raw| keys.get_raw(raw))
        .filter_map(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok())
        .max()
}

/// The nodes to keep out of the next allocation, by name: those the attempts' failures point
/// at, this node when a rank asked to exclude it, and those the supervisor blamed.
fn blame_nodes(
    agent: &Agent,
    sup: &Supervisor,
    keys: Option<&vigil_store::KeySpace>,
) -> Vec<String> {
    let env = |k: &str| std::env::var(k).ok();
    let failed_on: Vec<(u32, u32)> = keys
        .map(|k| {
            k.keys_raw()
                .iter()
                .filter_map(|raw| rendezvous::key::parse_failed(raw))
                .collect()
        })
        .unwrap_or_default();
    let mut ranks = blame::nodes_to_blame(&blame::Attempts {
        nnodes: agent.cfg.nnodes,
        ends: &agent.trail.attempt_ends,
        failed_on: &failed_on,
    });
    if sup.exclude_asked() {
        ranks.push(agent.cfg.node_rank);
    }
    // A survivor of node rank 0's loss: node rank 0's agent or machine is what was lost.
    if agent.trail.head_lost && !ranks.contains(&0) {
        ranks.push(0);
    }
    for n in sup.blamed_nodes() {
        if !ranks.contains(n) {
            ranks.push(*n);
        }
    }
    blame::names_of(&ranks, &blame::slurm_node_names(&env))
}

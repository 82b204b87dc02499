//! Which nodes the next allocation should avoid (Slurm's `ExcNodeList`), from how this
//! allocation's attempts ended, and how many of them the partition can do without. Pure.
//!
//! A node is blamed only for evidence about that node:
//! - it was lost (its agent died or went silent);
//! - its ranks, and no other node's, failed or hung in the last two attempts in a row (one
//!   failure alone is more often the job's own bug than the node's).
//!
//! A failure that every node shares, or that happens on the only node, is the code's: nobody is
//! blamed for it. Faults a node finds in itself (a health check, a GPU fault) and stragglers are
//! added by the caller. [`cap_to_partition`] then keeps enough nodes for the job to be scheduled.

use crate::supervise::JobEnd;
use vigil_slurm::{hostlist, nodelist};

/// What node rank 0 knows of one allocation's attempts.
#[derive(Debug, Clone, Default)]
pub struct Attempts<'a> {
    /// The job's node count.
    pub nnodes: u32,
    /// Each attempt's verdict, by attempt number.
    pub ends: &'a [(u32, JobEnd)],
    /// `(attempt, node)`: a node whose own ranks failed or hung in that attempt (each node
    /// reports this whether or not its report was the attempt's verdict).
    pub failed_on: &'a [(u32, u32)],
}

/// The nodes whose ranks failed in `attempt`: the verdict's and every node that said so.
fn failing_nodes(a: &Attempts, attempt: u32, end: &JobEnd) -> Vec<u32> {
    let mut nodes: Vec<u32> = a
        .failed_on
        .iter()
        .filter(|(c, _)| *c == attempt)
        .map(|(_, n)| *n)
        .collect();
    if let JobEnd::Failed { node, .. } = end {
        nodes.push(*node);
    }
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

/// Node ranks to keep out of the next allocation, in ascending order.
pub fn nodes_to_blame(a: &Attempts) -> Vec<u32> {
    let mut out: Vec<u32> = a
        .ends
        .iter()
        .filter_map(|(_, e)| match e {
            JobEnd::Lost { node, .. } => *node,
            _ => None,
        })
        .collect();
    let failed_alone = |(c, e): &(u32, JobEnd)| match e {
        JobEnd::Failed { .. } => match failing_nodes(a, *c, e)[..] {
            [only] => Some(only),
            _ => None,
        },
        _ => None,
    };
    // With one node there is no other node to compare with: its failures are the job's.
    if a.nnodes > 1 {
        if let [.., x, y] = a.ends {
            if let (Some(p), Some(q)) = (failed_alone(x), failed_alone(y)) {
                if p == q {
                    out.push(p);
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// A node of the job's partition as `sinfo` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionNode {
    pub name: String,
    /// Not down, drained, failed or in maintenance: it can take a job.
    pub usable: bool,
}

/// Whether a node in `sinfo`'s compact state (`%t`: `idle`, `alloc*`, `drain`, ...) can run jobs.
pub fn usable_state(state: &str) -> bool {
    let base = state
        .trim()
        .trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-', '+']);
    !matches!(
        base,
        "down"
            | "drain"
            | "drained"
            | "draining"
            | "drng"
            | "fail"
            | "failg"
            | "failing"
            | "futr"
            | "future"
            | "inval"
            | "maint"
            | "unk"
            | "unknown"
            | "npc"
            | "boot"
    ) && !base.is_empty()
}

/// What can be excluded: `excluded` the nodes to add to the job's `ExcNodeList`, `kept` those
/// left in because the partition would then have fewer usable nodes than the job needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capped {
    pub excluded: Vec<String>,
    pub kept: Vec<String>,
}

/// Keeps the partition able to run the job: `wanted` (in order of preference) are excluded while
/// the partition's usable nodes outside the job's exclusions (`already` and those taken so far)
/// stay at least `needed`. A node outside the partition, or unusable anyway, costs nothing.
pub fn cap_to_partition(
    already: &[String],
    wanted: &[String],
    partition: &[PartitionNode],
    needed: u32,
) -> Capped {
    let mut out = Capped::default();
    let mut left: Vec<&str> = partition
        .iter()
        .filter(|n| n.usable && !already.contains(&n.name))
        .map(|n| n.name.as_str())
        .collect();
    left.sort_unstable();
    left.dedup();
    for w in wanted {
        if out.excluded.contains(w) || out.kept.contains(w) {
            continue;
        }
        match left.iter().position(|n| n == w) {
            Some(i) if left.len() > needed as usize => {
                left.remove(i);
                out.excluded.push(w.clone());
            }
            Some(_) => out.kept.push(w.clone()),
            None => out.excluded.push(w.clone()),
        }
    }
    out
}

/// Slurm node names by node rank: the step's node list (`SLURM_NODEID` indexes it), else the
/// job's. Empty outside Slurm or when the list cannot be read.
pub fn slurm_node_names(env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    nodelist::node_list(&|v| env(v).filter(|s| !s.trim().is_empty()))
        .and_then(|(_, l)| hostlist::expand(&l).ok())
        .unwrap_or_default()
}

/// The names of `ranks` in `names` (a rank without a name is left out).
pub fn names_of(ranks: &[u32], names: &[String]) -> Vec<String> {
    ranks
        .iter()
        .filter_map(|r| names.get(*r as usize).cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(node: u32) -> JobEnd {
        JobEnd::Failed {
            node,
            reason: "x".into(),
        }
    }

    fn lost(node: Option<u32>) -> JobEnd {
        JobEnd::Lost {
            reason: "gone".into(),
            node,
        }
    }

    fn blame(nnodes: u32, ends: &[JobEnd], failed_on: &[(u32, u32)]) -> Vec<u32> {
        let ends: Vec<(u32, JobEnd)> = ends
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, e)| (i as u32, e))
            .collect();
        nodes_to_blame(&Attempts {
            nnodes,
            ends: &ends,
            failed_on,
        })
    }

    #[test]
    fn a_lost_node_and_a_node_failing_alone_twice_in_a_row_are_blamed() {
        assert_eq!(blame(3, &[], &[]), Vec::<u32>::new());
        assert_eq!(blame(3, &[failed(1)], &[]), Vec::<u32>::new());
        // Not in a row: another node failed in between.
        assert_eq!(
            blame(3, &[failed(1), failed(2), failed(1)], &[]),
            Vec::<u32>::new()
        );
        assert_eq!(blame(3, &[failed(2), failed(1), failed(1)], &[]), vec![1]);
        assert_eq!(blame(3, &[failed(0), lost(Some(3))], &[]), vec![3]);
        assert_eq!(
            blame(3, &[lost(None), JobEnd::Done], &[]),
            Vec::<u32>::new()
        );
    }

    #[test]
    fn a_failure_every_node_shares_blames_nobody() {
        // Node 0's report won both attempts, but node 1's ranks failed too: the code's failure.
        assert_eq!(
            blame(2, &[failed(0), failed(0)], &[(0, 1), (1, 1)]),
            Vec::<u32>::new()
        );
        assert_eq!(
            blame(2, &[failed(0), failed(0)], &[(0, 0), (0, 1), (1, 0)]),
            Vec::<u32>::new()
        );
        // Only node 1's, in both attempts (its own reports repeat the verdict's node).
        assert_eq!(
            blame(2, &[failed(1), failed(1)], &[(0, 1), (1, 1)]),
            vec![1]
        );
        // Another node failing in an earlier attempt does not clear the last two.
        assert_eq!(
            blame(2, &[failed(0), failed(1), failed(1)], &[(0, 1)]),
            vec![1]
        );
        // A lost node is blamed whatever the failures.
        assert_eq!(blame(2, &[failed(0), lost(Some(1))], &[(0, 1)]), vec![1]);
    }

    #[test]
    fn the_only_node_is_never_blamed_for_failures() {
        assert_eq!(
            blame(1, &[failed(0), failed(0), failed(0)], &[(0, 0), (1, 0)]),
            Vec::<u32>::new()
        );
    }

    fn part(nodes: &[(&str, bool)]) -> Vec<PartitionNode> {
        nodes
            .iter()
            .map(|(n, u)| PartitionNode {
                name: n.to_string(),
                usable: *u,
            })
            .collect()
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn exclusions_never_leave_the_partition_unable_to_run_the_job() {
        let three = part(&[("n1", true), ("n2", true), ("n3", true)]);
        // A 2-node job in 3 nodes can do without one.
        assert_eq!(
            cap_to_partition(&[], &names(&["n2"]), &three, 2),
            Capped {
                excluded: names(&["n2"]),
                kept: vec![]
            }
        );
        // Not without two; the first wanted goes first.
        assert_eq!(
            cap_to_partition(&[], &names(&["n2", "n1"]), &three, 2),
            Capped {
                excluded: names(&["n2"]),
                kept: names(&["n1"])
            }
        );
        // Already excluded nodes count; the only node is never excluded.
        assert_eq!(
            cap_to_partition(&names(&["n3"]), &names(&["n2"]), &three, 2).kept,
            names(&["n2"])
        );
        assert_eq!(
            cap_to_partition(&[], &names(&["n1"]), &part(&[("n1", true)]), 1).kept,
            names(&["n1"])
        );
        // Down nodes do not count as room; a node outside the partition costs nothing.
        let one_down = part(&[("n1", true), ("n2", true), ("n3", false)]);
        assert_eq!(
            cap_to_partition(&[], &names(&["n2"]), &one_down, 2).kept,
            names(&["n2"])
        );
        assert_eq!(
            cap_to_partition(&[], &names(&["n3", "x9"]), &one_down, 2).excluded,
            names(&["n3", "x9"])
        );
    }

    #[test]
    fn sinfo_states_that_take_no_job() {
        for s in [
            "idle", "alloc", "mix", "comp", "idle*", "alloc#", "resv", "plnd",
        ] {
            assert!(usable_state(s), "{s}");
        }
        for s in [
            "down", "down*", "drain", "drng", "fail", "maint", "unk*", "",
        ] {
            assert!(!usable_state(s), "{s}");
        }
    }

    #[test]
    fn names_come_from_the_step_node_list() {
        let env = |k: &str| match k {
            "SLURM_STEP_NODELIST" => Some("n[1-3]".to_string()),
            "SLURM_JOB_NODELIST" => Some("other".to_string()),
            _ => None,
        };
        let names = slurm_node_names(&env);
        assert_eq!(names, vec!["n1", "n2", "n3"]);
        assert_eq!(names_of(&[2, 0, 7], &names), vec!["n3", "n1"]);
        assert!(slurm_node_names(&|_| None).is_empty());
    }
}

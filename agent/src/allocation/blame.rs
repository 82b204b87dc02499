//! Which nodes the next allocation should avoid (Slurm's `ExcNodeList`), from how this
//! allocation's attempts ended. Pure.
//!
//! - a node that was lost (its agent died or went silent) is blamed at once;
//! - a node whose ranks failed or hung in the last two attempts in a row is blamed; one failure
//!   alone is more often the job's own bug than the node's.

use crate::job::hostlist;
use crate::supervise::JobEnd;

/// Node ranks to keep out of the next allocation, in ascending order.
pub fn nodes_to_blame(ends: &[JobEnd]) -> Vec<u32> {
    let mut out: Vec<u32> = ends
        .iter()
        .filter_map(|e| match e {
            JobEnd::Lost { node, .. } => *node,
            _ => None,
        })
        .collect();
    let failed = |e: &JobEnd| match e {
        JobEnd::Failed { node, .. } => Some(*node),
        _ => None,
    };
    if let [.., a, b] = ends {
        if let (Some(x), Some(y)) = (failed(a), failed(b)) {
            if x == y {
                out.push(x);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Slurm node names by node rank: the step's node list (`SLURM_NODEID` indexes it), else the
/// job's. Empty outside Slurm or when the list cannot be read.
pub fn slurm_node_names(env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    [
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ]
    .iter()
    .find_map(|v| env(v).filter(|s| !s.trim().is_empty()))
    .and_then(|l| hostlist::expand(&l).ok())
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

    #[test]
    fn a_lost_node_and_a_node_failing_twice_in_a_row_are_blamed() {
        assert_eq!(nodes_to_blame(&[]), Vec::<u32>::new());
        assert_eq!(nodes_to_blame(&[failed(1)]), Vec::<u32>::new());
        // Not in a row: another node failed in between.
        assert_eq!(
            nodes_to_blame(&[failed(1), failed(2), failed(1)]),
            Vec::<u32>::new()
        );
        assert_eq!(nodes_to_blame(&[failed(2), failed(1), failed(1)]), vec![1]);
        let lost = JobEnd::Lost {
            reason: "gone".into(),
            node: Some(3),
        };
        assert_eq!(nodes_to_blame(&[failed(0), lost.clone()]), vec![3]);
        let unknown = JobEnd::Lost {
            reason: "gone".into(),
            node: None,
        };
        assert_eq!(nodes_to_blame(&[unknown, JobEnd::Done]), Vec::<u32>::new());
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

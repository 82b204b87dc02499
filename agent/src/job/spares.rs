//! Hot spares (docs/design.md, "Hot spares"): the choice of a standby, used by the rendezvous'
//! state machine (job/rendezvous/decide/) when node rank 0 assigns an attempt.
//!
//! Pure: which node id plays each group rank ("slot") of an attempt, and which standby takes the slot
//! of a lost node. A slot keeps its global ranks, so a promotion changes no other rank's number.

/// What node rank 0 knows of a standby when it must fill a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standby {
    pub node: u32,
    /// Passed `vigil health` at its last check (a standby that failed is never promoted).
    pub healthy: bool,
    /// `SLURM_TOPOLOGY_ADDR` (`switch1.switch7.node3`), when Slurm knows the topology.
    pub topology: Option<String>,
}

/// A standby taking a lost node's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promotion {
    pub slot: u32,
    pub lost: u32,
    pub standby: u32,
}

/// How close two nodes are: the number of leading topology levels they share (the leaf is the
/// node itself, so it never counts), or, with `--segment K`, whether node ids fall in one block
/// of K (NVRx's `segment`); 0 when nothing is known.
pub fn closeness(a: (u32, Option<&str>), b: (u32, Option<&str>), segment: Option<u32>) -> usize {
    if let (Some(x), Some(y)) = (a.1, b.1) {
        let (xs, ys): (Vec<&str>, Vec<&str>) = (x.split('.').collect(), y.split('.').collect());
        let parents = xs.len().min(ys.len()).saturating_sub(1);
        return xs
            .iter()
            .zip(&ys)
            .take(parents)
            .take_while(|(p, q)| p == q)
            .count();
    }
    match segment {
        Some(k) if k > 0 && a.0 / k == b.0 / k => 1,
        _ => 0,
    }
}

/// The standby for `lost`'s slot: healthy ones only; the closest in the topology first, then the
/// lowest node id. `None` when no healthy standby is left.
pub fn pick(lost: (u32, Option<&str>), standbys: &[Standby], segment: Option<u32>) -> Option<u32> {
    standbys
        .iter()
        .filter(|s| s.healthy)
        .max_by(|a, b| {
            let ca = closeness(lost, (a.node, a.topology.as_deref()), segment);
            let cb = closeness(lost, (b.node, b.topology.as_deref()), segment);
            ca.cmp(&cb).then(b.node.cmp(&a.node))
        })
        .map(|s| s.node)
}

/// The slots of the next attempt: each slot whose node was lost goes to a standby (`pick`), each
/// standby at most once. `Err` names the slots no healthy standby is left for: the job then ends
/// for a requeue, as without spares.
pub fn refill(
    slots: &[u32],
    lost: &[(u32, Option<String>)],
    standbys: &[Standby],
    segment: Option<u32>,
) -> Result<(Vec<u32>, Vec<Promotion>), Vec<u32>> {
    let mut left: Vec<Standby> = standbys.to_vec();
    let mut next = slots.to_vec();
    let mut promotions = Vec::new();
    let mut unfilled = Vec::new();
    for (slot, node) in slots.iter().enumerate() {
        let Some((_, topo)) = lost.iter().find(|(n, _)| n == node) else {
            continue;
        };
        match pick((*node, topo.as_deref()), &left, segment) {
            Some(s) => {
                left.retain(|c| c.node != s);
                next[slot] = s;
                promotions.push(Promotion {
                    slot: slot as u32,
                    lost: *node,
                    standby: s,
                });
            }
            None => unfilled.push(slot as u32),
        }
    }
    if unfilled.is_empty() {
        Ok((next, promotions))
    } else {
        Err(unfilled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sb(node: u32, healthy: bool, topo: Option<&str>) -> Standby {
        Standby {
            node,
            healthy,
            topology: topo.map(str::to_string),
        }
    }

    #[test]
    fn health_first_then_topology_then_order() {
        let lost = (2, Some("s1.leafA.n2"));
        let standbys = [
            sb(8, true, Some("s1.leafB.n8")),
            sb(9, false, Some("s1.leafA.n9")),
            sb(10, true, Some("s1.leafA.n10")),
            sb(11, true, Some("s1.leafA.n11")),
        ];
        // n9 shares the leaf switch but failed its health check; n10 and n11 share it: the lower.
        assert_eq!(pick(lost, &standbys, None), Some(10));
        assert_eq!(pick(lost, &standbys[..2], None), Some(8));
        assert_eq!(pick(lost, &[sb(9, false, None)], None), None);
    }

    #[test]
    fn segments_group_node_ids_when_there_is_no_topology() {
        let standbys = [sb(4, true, None), sb(9, true, None)];
        assert_eq!(pick((10, None), &standbys, Some(4)), Some(9));
        assert_eq!(pick((10, None), &standbys, None), Some(4));
    }

    #[test]
    fn refill_keeps_every_other_slot_and_uses_a_standby_once() {
        let slots = [0, 1, 2, 3];
        let lost = [(1, None), (3, None)];
        let (next, promos) =
            refill(&slots, &lost, &[sb(4, true, None), sb(5, true, None)], None).unwrap();
        assert_eq!(next, vec![0, 4, 2, 5]);
        assert_eq!(promos.len(), 2);
        assert_eq!(
            refill(&slots, &lost, &[sb(4, true, None)], None),
            Err(vec![3]),
            "one standby for two lost nodes"
        );
    }

    proptest! {
        #[test]
        fn a_refill_never_reuses_a_node_nor_promotes_an_unhealthy_one(
            n_active in 1u32..12, lost_mask in any::<u16>(), health in any::<u16>(), n_spare in 0u32..6,
        ) {
            let slots: Vec<u32> = (0..n_active).collect();
            let lost: Vec<(u32, Option<String>)> =
                slots.iter().filter(|s| lost_mask & (1 << **s) != 0).map(|s| (*s, None)).collect();
            let standbys: Vec<Standby> = (0..n_spare)
                .map(|i| sb(n_active + i, health & (1 << i) != 0, None))
                .collect();
            match refill(&slots, &lost, &standbys, None) {
                Ok((next, promos)) => {
                    let mut seen = next.clone();
                    seen.sort_unstable();
                    seen.dedup();
                    prop_assert_eq!(seen.len(), next.len());
                    for p in &promos {
                        prop_assert!(standbys.iter().any(|s| s.node == p.standby && s.healthy));
                        prop_assert_eq!(next[p.slot as usize], p.standby);
                    }
                    for (slot, node) in slots.iter().enumerate() {
                        if !lost.iter().any(|(l, _)| l == node) {
                            prop_assert_eq!(next[slot], *node);
                        }
                    }
                }
                Err(unfilled) => {
                    let healthy = standbys.iter().filter(|s| s.healthy).count();
                    prop_assert!(lost.len() > healthy);
                    prop_assert_eq!(unfilled.len(), lost.len() - healthy);
                }
            }
        }
    }
}

//! Tests of the rendezvous' state machine, its steps and its free functions.

use super::*;
use crate::job::rendezvous::wire::to_json;
use crate::job::rendezvous::wire::{WireHangCandidate, WireSteps};
use crate::job::spares::closeness;
use crate::supervise::{choose_stop_step, StepReport, AGREEMENT_BUDGET};
use proptest::prelude::*;
use std::time::Duration;

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
        in_process: false,
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
            attempts: [0, 1],
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
            attempts: [0, 1],
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
        note.starts_with(
            "attempt 0 starts with 2 of up to 3 nodes: no other joined within the last call (1.5s,"
        ) && note.contains("node rank(s) 1 take no part"),
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
    assert_eq!(go.attempt, 3);
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

/// A job of agents driven through attempts with nothing between them but the bytes they would
/// read from the store: node rank 0's proposal is every node's verdict.
struct Job {
    agents: Vec<Rendezvous>,
    nproc: Vec<u32>,
    topology: Vec<Option<String>>,
    /// Agents gone for good (their decisions are no longer asked for).
    gone: Vec<u32>,
}

/// One attempt as every agent saw it: the verdict's bytes, each live agent's decision.
struct Attempt {
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
                    in_process: true,
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
    fn attempt(&mut self, c: u32, health: &[Option<bool>]) -> Attempt {
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
        Attempt {
            verdict,
            proposal,
            decisions,
        }
    }

    /// Attempt `c` ends with `end` on every live agent.
    fn end(&mut self, c: u32, end: &JobEnd) {
        let v = to_json(&WireEnd::from(end));
        for n in self.live() {
            let d = self.agents[n as usize].ended(c, &v);
            assert_eq!(d, Decision::Tell(FromCoord::attempt_ended(c, end.clone())));
        }
    }
}

/// Every live agent decided the same attempt from one verdict: the ranks partition
/// `0..world_size` exactly once, each slot is played once, the rest are standbys.
fn check_one_verdict(job: &Job, c: u32, cy: &Attempt) -> Result<(), TestCaseError> {
    let mut seen = Vec::new();
    let mut group_ranks = Vec::new();
    let mut world = None;
    let mut standbys = 0;
    for (n, d) in &cy.decisions {
        match d {
            Decision::Run(
                attempt,
                FromCoord::Event(Event::Joined {
                    attempt: jc,
                    placement:
                        Placement {
                            group_rank,
                            rank_offset,
                            world_size,
                        },
                    max_restarts,
                    ..
                }),
            ) => {
                prop_assert_eq!((*attempt, *jc, *max_restarts), (c, c, 3));
                prop_assert!(world.is_none_or(|w| w == *world_size));
                world = Some(*world_size);
                group_ranks.push(*group_rank);
                let nproc = job.nproc[*n as usize];
                seen.extend(*rank_offset..*rank_offset + nproc);
            }
            Decision::Run(attempt, FromCoord::Event(Event::Standby { attempt: sc })) => {
                prop_assert_eq!((*attempt, *sc), (c, c));
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
        let cy = job.attempt(0, &health);
        if spares == 0 {
            prop_assert!(cy.proposal.is_ok());
        }
        match &cy.proposal {
            Ok(_) => check_one_verdict(&job, 0, &cy)?,
            Err(why) => {
                prop_assert!(matches!(why, Unassignable::NoStandby { .. }), "{}", why);
                for d in cy.decisions.values() {
                    let is_lost = matches!(d, Decision::Tell(FromCoord::Event(Event::AttemptEnded { end: JobEnd::Lost { .. }, .. })));
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
            let cy = job.attempt(c, &health);
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
        let cy = job.attempt(0, &all_healthy);
        check_one_verdict(&job, 0, &cy)?;
        let loss = job.agents[0].lease_lost(Some(lost), "gone".into());
        let failed = JobEnd::Failed { node: lost, reason: "gone".into() };
        prop_assert_eq!(
            loss,
            Loss::ToStandby {
                members: nnodes - 1,
                attempts: [0, 1],
                then: AfterLoss::EndAttempt { attempt: 0, end: failed.clone() },
                node: lost,
                reason: "gone".into(),
                standby_gone: None,
            }
        );
        job.gone.push(lost);
        job.end(0, &failed);
        let mut health: Vec<Option<bool>> = health[..nnodes].iter().map(|h| Some(*h)).collect();
        health[0] = None;
        let healthy = |n: u32| health[n as usize] != Some(false);
        let cy = job.attempt(1, &health);
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
        let cy = job.attempt(0, &vec![None; nnodes]);
        check_one_verdict(&job, 0, &cy)?;
        // Standbys go first: each is lost to nobody's slot.
        for (i, s) in (active..nnodes as u32).take(standbys_lost as usize).enumerate() {
            let loss = job.agents[0].lease_lost(Some(s), "gone".into());
            // Each one lost is said, with the standbys left ready.
            let ready = spares - 1 - i as u32;
            prop_assert!(matches!(loss, Loss::ToStandby { then: AfterLoss::Nothing, standby_gone: Some(r), .. } if r == ready), "{:?}", loss);
            job.gone.push(s);
        }
        let left = spares.saturating_sub(standbys_lost);
        let loss = job.agents[0].lease_lost(Some(victim), "gone".into());
        if left > 0 {
            prop_assert!(matches!(loss, Loss::ToStandby { .. }), "{:?}", loss);
            return Ok(());
        }
        let Loss::Job { attempt: 0, end } = loss else {
            return Err(TestCaseError::fail(format!("{loss:?}")));
        };
        prop_assert_eq!(&end, &JobEnd::Lost { reason: "gone".into(), node: Some(victim) });
        // Later losses change nothing; the next join ends at once with the same verdict.
        prop_assert_eq!(job.agents[0].lease_lost(Some(victim), "again".into()), Loss::Nothing);
        prop_assert_eq!(job.agents[0].join(1, None), Joining::Ended(end.clone()));
        let verdict = to_json(&Verdict::End(WireEnd::from(&end)));
        for n in job.live() {
            let d = job.agents[n as usize].verdict(1, &verdict);
            prop_assert_eq!(d, Decision::Tell(FromCoord::attempt_ended(1, end.clone())));
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
        let cy = job.attempt(c, &health);
        assert_eq!(cy.proposal.unwrap().go.slot_of(1), Some(1));
        job.end(c, &failed);
    }
    let cy = job.attempt(2, &health);
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
        Decision::Run(2, FromCoord::Event(Event::Standby { attempt: 2 }))
    );
    // Benched for good: with no standby left to bench the next, it stays out.
    job.end(2, &JobEnd::Done);
    let p = job.attempt(3, &health).proposal.unwrap();
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
        in_process: false,
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
            attempts: [0, 1],
            then: AfterLoss::EndAttempt {
                attempt: 0,
                end: end.clone()
            },
            node: 0,
            reason: "gone".into(),
            standby_gone: None,
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
        Decision::Run(1, FromCoord::Event(Event::Joined { placement, .. })) => {
            assert_eq!(placement.group_rank, 0)
        }
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
            attempt: 0,
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
            attempts: [0, 1],
            then: AfterLoss::CompleteJoin(0),
            node: 0,
            reason: "gone".into(),
            standby_gone: None,
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
            set(key::dropped(2), "gone"),
            Step::Tell(FromCoord::StandbyGone {
                node: 2,
                reason: "gone".into(),
                ready: 0
            }),
            Step::CountJoins(0)
        ]
    );
    assert_eq!(h.joins_counted(0, 1), vec![]);
    assert_eq!(h.joins_counted(0, 2), vec![set(key::all(0), "")]);
    let records = [(0, to_json(&info(1))), (1, to_json(&info(1)))];
    let steps = h.propose(0, &records);
    assert_eq!(steps[0], set(key::members(1), "2"));
    assert!(
        matches!(&steps[1], Step::Tell(FromCoord::Hosts { attempt: 0, hosts }) if hosts.active.len() == 2)
    );
    // With standbys, how many are ready (none: the only one was lost) goes with the verdict.
    assert_eq!(
        steps[2],
        Step::Tell(FromCoord::SparesReady {
            attempt: 0,
            ready: 0
        })
    );
    let Step::Propose(0, go) = &steps[3] else {
        panic!("{steps:?}")
    };
    // Every node, the proposer included, runs what won.
    let d = h.verdict(0, go);
    let run = h.steps(d);
    assert_eq!(run[0], Step::Wait(key::end(0), Patience::Forever));
    assert!(matches!(
        &run[1],
        Step::Tell(FromCoord::Event(Event::Joined { attempt: 0, .. }))
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
fn a_lost_node_ends_the_attempt_it_played_or_the_job() {
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
        steps[..3],
        [
            set(key::members(0), "2"),
            set(key::members(1), "2"),
            set(key::dropped(1), "gone")
        ]
    );
    assert!(matches!(&steps[3], Step::SetFirst(k, _) if *k == key::end(0)));
    // Without a standby the job ends for every node, this attempt and the next.
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
fn reports_end_a_attempt_once_every_slot_is_done_or_one_failed() {
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
        vec![Step::MergeTimeouts {
            attempt: 1,
            round: 0
        }]
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
fn a_attempt_runs_through_step_alone() {
    let mut job = Job::new(vec![2, 2], 2, vec![None; 2]);
    for (n, a) in job.agents.iter_mut().enumerate() {
        a.join(0, None);
        let nth = n as i64 + 1;
        let members = None;
        let steps = a.step(Fact::Counted {
            attempt: 0,
            nth,
            members,
        });
        assert_eq!(steps, a.counted(0, nth, None));
    }
    let records: Vec<(u32, Vec<u8>)> = (0..2).map(|n| (n, to_json(&info(2)))).collect();
    let records = &records;
    let steps = job.agents[0].step(Fact::Records {
        attempt: 0,
        records,
    });
    let Some(Step::Propose(0, go)) = steps.last().cloned() else {
        panic!("{steps:?}")
    };
    for a in job.agents.iter_mut() {
        let steps = a.step(Fact::Verdict {
            attempt: 0,
            value: &go,
        });
        assert_eq!(steps[0], Step::Wait(key::end(0), Patience::Forever));
    }
    let a = &mut job.agents[1];
    assert_eq!(
        a.step(Fact::DoneCounted {
            attempt: 0,
            count: 1
        }),
        vec![]
    );
    let end = to_json(&WireEnd::Done);
    assert_eq!(
        a.step(Fact::DoneCounted {
            attempt: 0,
            count: 2
        }),
        vec![Step::SetFirst(key::end(0), end.clone())]
    );
    assert_eq!(
        a.step(Fact::Ended {
            attempt: 0,
            value: &end
        }),
        vec![Step::Tell(FromCoord::attempt_ended(0, JobEnd::Done))]
    );
}

#[test]
fn a_standby_lost_is_told_with_the_spares_left_and_is_dropped_for_good() {
    // 2 active + 2 standbys; node rank 0 assigns attempt 0 and tells how many standbys are ready.
    let mut job = Job::new(vec![1; 4], 2, vec![None; 4]);
    let records: Vec<(u32, Vec<u8>)> = (0..4).map(|n| (n, to_json(&info(1)))).collect();
    let head = &mut job.agents[0];
    head.join(0, None);
    let steps = head.step(Fact::Records {
        attempt: 0,
        records: &records,
    });
    assert!(
        steps.contains(&Step::Tell(FromCoord::SparesReady {
            attempt: 0,
            ready: 2
        })),
        "{steps:?}"
    );
    let go = steps.iter().find_map(|s| match s {
        Step::Propose(0, v) => Some(v.clone()),
        _ => None,
    });
    head.step(Fact::Verdict {
        attempt: 0,
        value: &go.unwrap(),
    });
    // Standby 3 is lost: the job runs on, it is said with one standby left, and it is told it
    // is out should its agent wake.
    let steps = head.step(Fact::LeaseLost {
        node: Some(3),
        reason: "node 3 was lost".into(),
    });
    assert!(
        steps.contains(&Step::Tell(FromCoord::StandbyGone {
            node: 3,
            reason: "node 3 was lost".into(),
            ready: 1
        })),
        "{steps:?}"
    );
    assert!(steps.contains(&Step::Set(key::dropped(3), b"node 3 was lost".to_vec())));
    assert!(!steps
        .iter()
        .any(|s| matches!(s, Step::SetFirst(k, _) if k == &key::end(0))));
    assert_eq!(head.members(), vec![0, 1, 2]);
    // An active node lost to the last standby ends the attempt, and tells no standby gone.
    let steps = head.step(Fact::LeaseLost {
        node: Some(1),
        reason: "node 1 was lost".into(),
    });
    assert!(!steps
        .iter()
        .any(|s| matches!(s, Step::Tell(FromCoord::StandbyGone { .. }))));
    assert!(steps
        .iter()
        .any(|s| matches!(s, Step::SetFirst(k, _) if k == &key::end(0))));
}

#[test]
fn an_in_process_generation_is_proposed_once_and_every_running_node_hears_the_winner() {
    let mut job = Job::new(vec![2, 2], 2, vec![None; 2]);
    for (n, a) in job.agents.iter_mut().enumerate() {
        a.join(0, None);
        a.step(Fact::Counted {
            attempt: 0,
            nth: n as i64 + 1,
            members: None,
        });
    }
    let records: Vec<(u32, Vec<u8>)> = (0..2).map(|n| (n, to_json(&info(2)))).collect();
    let records = &records;
    let steps = job.agents[0].step(Fact::Records {
        attempt: 0,
        records,
    });
    let Some(Step::Propose(0, go)) = steps.last().cloned() else {
        panic!("{steps:?}")
    };
    for a in job.agents.iter_mut() {
        let steps = a.step(Fact::Verdict {
            attempt: 0,
            value: &go,
        });
        // Beside the attempt's end, every running node parks on its first generation.
        assert_eq!(steps.last(), Some(&Step::WaitGeneration(0, 1)), "{steps:?}");
    }
    // The node that began it proposes it; the first written wins.
    let a = &mut job.agents[1];
    let replaced = [2u32];
    assert_eq!(
        a.step(Fact::GenerationBegun {
            attempt: 0,
            generation: 1,
            replaced: &replaced,
        }),
        vec![Step::SetFirst(key::generation(0, 1), to_json(&replaced))]
    );
    // Every node hears the winner and parks on the next one.
    let value = to_json(&replaced);
    for a in job.agents.iter_mut() {
        let steps = a.step(Fact::GenerationRead {
            attempt: 0,
            generation: 1,
            value: &value,
        });
        assert_eq!(
            steps,
            vec![
                Step::Tell(FromCoord::Event(Event::GenerationBegun {
                    attempt: 0,
                    generation: 1,
                    replaced: Some(vec![2]),
                })),
                Step::WaitGeneration(0, 2),
            ]
        );
    }
    // An unreadable record is told as such (the supervisor restarts the whole job); one of a
    // attempt this node no longer runs is nobody's news.
    let a = &mut job.agents[0];
    let steps = a.step(Fact::GenerationRead {
        attempt: 0,
        generation: 2,
        value: b"{",
    });
    assert!(matches!(
        &steps[0],
        Step::Tell(FromCoord::Event(Event::GenerationBegun {
            replaced: None,
            ..
        }))
    ));
    let stale = a.step(Fact::GenerationRead {
        attempt: 7,
        generation: 1,
        value: &value,
    });
    assert_eq!(stale, vec![]);
}

#[test]
fn without_in_process_restarts_a_running_node_parks_on_the_end_alone() {
    let mut a = head(1, 1);
    a.join(0, None);
    let records = vec![(0, to_json(&info(2)))];
    let go = a.assign(0, &records).unwrap().go;
    let steps = a.step(Fact::Verdict {
        attempt: 0,
        value: &to_json(&Verdict::Go(go)),
    });
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert_eq!(steps[0], Step::Wait(key::end(0), Patience::Forever));
    assert!(
        matches!(
            &steps[1],
            Step::Tell(FromCoord::Event(Event::Joined { .. }))
        ),
        "{steps:?}"
    );
}

#[test]
fn a_join_writes_the_record_with_the_last_health_check_or_ends_a_lost_job() {
    let me = info(2);
    // Without standbys the record and the count go in one request; with, members are read.
    let mut a = head(2, 2);
    let steps = a.step(Fact::Join {
        attempt: 0,
        calculated: None,
        me: &me,
    });
    let record = to_json(&me);
    assert_eq!(
        steps,
        vec![Step::Join {
            attempt: 0,
            record,
            members: false
        }]
    );
    let mut a = head(3, 2);
    a.health(false);
    let steps = a.step(Fact::Join {
        attempt: 0,
        calculated: None,
        me: &me,
    });
    let record = to_json(&NodeInfo {
        healthy: Some(false),
        ..me.clone()
    });
    assert_eq!(
        steps,
        vec![Step::Join {
            attempt: 0,
            record,
            members: true
        }]
    );
    // Node rank 0 lost the job: the attempt joined ends at once, for every node.
    let mut a = head(2, 2);
    a.join(0, None);
    a.step(Fact::Silent {
        node: Some(1),
        reason: "gone".into(),
    });
    let steps = a.step(Fact::Join {
        attempt: 1,
        calculated: None,
        me: &me,
    });
    let end = JobEnd::Lost {
        reason: "gone".into(),
        node: Some(1),
    };
    let mut want = poison(1, &end);
    want.push(Step::Tell(FromCoord::attempt_ended(1, end)));
    assert_eq!(steps, want);
}

#[test]
fn the_reports_are_counted_over_the_slots_and_a_standby_reports_none() {
    // --nnodes 1:2: node 0 plays the slot, node 1 waits.
    let mut slot = agent(2, 1, 0);
    let mut standby = agent(2, 1, 1);
    let t = Timeouts::default();
    let report = StepReport {
        max_step: Some(7),
        steps_per_s: None,
    };
    for (fact, want) in [
        (
            Fact::ReportDone { attempt: 3 },
            vec![Step::Add(key::done(3), Counted::Done(3))],
        ),
        (
            Fact::ShareTimeouts {
                attempt: 3,
                round: 1,
                timeouts: &t,
            },
            vec![
                Step::Set(
                    key::node_timeouts(3, 1, 0),
                    to_json(&WireTimeouts::from(&t)),
                ),
                Step::WaitTimeouts {
                    attempt: 3,
                    round: 1,
                },
                Step::Add(
                    key::timeouts_count(3, 1),
                    Counted::Timeouts {
                        attempt: 3,
                        round: 1,
                    },
                ),
            ],
        ),
        (
            Fact::StopSteps {
                attempt: 3,
                report: &report,
            },
            vec![
                Step::Set(key::stop_steps(3, 0), to_json(&WireSteps::from(&report))),
                Step::Add(key::stop_count(3), Counted::Steps(3)),
            ],
        ),
    ] {
        assert_eq!(standby.step(fact.clone()), vec![], "{fact:?}");
        assert_eq!(slot.step(fact.clone()), want, "{fact:?}");
    }
    // Each count comes back as the fact that completes its report.
    assert_eq!(
        Counted::Done(3).fact(1),
        Fact::DoneCounted {
            attempt: 3,
            count: 1
        }
    );
    assert_eq!(
        Counted::Timeouts {
            attempt: 3,
            round: 1
        }
        .fact(2),
        Fact::TimeoutsCounted {
            attempt: 3,
            round: 1,
            count: 2
        }
    );
    assert_eq!(
        Counted::Steps(3).fact(1),
        Fact::StepsCounted {
            attempt: 3,
            count: 1
        }
    );
    // Any node may ask for a stop; the first trigger written wins.
    assert_eq!(
        standby.step(Fact::StopTrigger {
            attempt: 3,
            trigger: "a signal"
        }),
        vec![Step::SetFirst(key::stop(3), to_json(&"a signal"))]
    );
}

#[test]
fn node_rank_0_reads_an_early_verdict_then_cleans_the_store_and_reads_the_records() {
    let mut h = head(3, 3);
    assert_eq!(
        h.step(Fact::AllJoined { attempt: 0 }),
        vec![Step::ReadEarlyVerdict(0)]
    );
    assert_eq!(
        h.step(Fact::NoEarlyVerdict { attempt: 0 }),
        vec![
            Step::ResetStore { previous: None },
            Step::ReadRecords {
                attempt: 0,
                members: vec![0, 1, 2]
            }
        ]
    );
    assert_eq!(
        h.step(Fact::NoEarlyVerdict { attempt: 4 })[0],
        Step::ResetStore { previous: Some(3) }
    );
}

#[test]
fn the_successor_claims_the_coordinators_lease_from_nobody_or_from_the_frozen_one() {
    // --nnodes 3:4 with the store outside the job; node 1 runs attempt 0 when node 0 is lost.
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
    // The coordinator itself has nothing to do; another reads the leases.
    assert_eq!(agents[0].step(Fact::CoordinatorGone { old: 1 }), vec![]);
    let n1 = &mut agents[1];
    assert_eq!(
        n1.step(Fact::CoordinatorGone { old: 0 }),
        vec![Step::ReadLeases { old: 0 }]
    );
    // The lowest live agent claims it from nobody; a higher one leaves it.
    let leased = [false, true, true, true];
    let claim = n1.step(Fact::LeasesRead {
        old: 0,
        leased: &leased,
        job_ended: false,
    });
    let alive = vec![1, 2, 3];
    assert_eq!(
        claim,
        vec![Step::ClaimCoordinator {
            old: 0,
            alive: alive.clone(),
            from: vec![]
        }]
    );
    let mut n2 = agents[2].clone();
    assert_eq!(
        n2.step(Fact::LeasesRead {
            old: 0,
            leased: &leased,
            job_ended: false
        }),
        vec![]
    );
    let n1 = &mut agents[1];
    // Still held by the frozen coordinator (its lease expired): claimed from its value, once.
    assert_eq!(
        n1.step(Fact::CoordinatorClaimed {
            old: 0,
            alive: &alive,
            from: b"",
            held: b"0",
        }),
        vec![Step::ClaimCoordinator {
            old: 0,
            alive: alive.clone(),
            from: b"0".to_vec()
        }]
    );
    assert_eq!(
        n1.step(Fact::CoordinatorClaimed {
            old: 0,
            alive: &alive,
            from: b"0",
            held: b"0",
        }),
        vec![]
    );
    // Another agent won it: nothing.
    assert_eq!(
        n1.step(Fact::CoordinatorClaimed {
            old: 0,
            alive: &alive,
            from: b"",
            held: b"2",
        }),
        vec![]
    );
    assert!(!n1.is_head());
    // Won: the loss record cleared, said, coordinating, and node 0 lost to the standby.
    let steps = n1.step(Fact::CoordinatorClaimed {
        old: 0,
        alive: &alive,
        from: b"0",
        held: b"1",
    });
    assert!(n1.is_head());
    assert_eq!(
        steps[..3],
        [
            Step::Delete(key::COORD_LOST.to_string()),
            Step::Tell(FromCoord::Coordinating { lost: 0 }),
            Step::Coordinate,
        ]
    );
    let end = to_json(&WireEnd::from(&JobEnd::Failed {
        node: 0,
        reason: "node 0 was lost: its agent, the job's coordinator, lost its connection to the store or was silent for --node-timeout".into(),
    }));
    assert_eq!(steps.last(), Some(&Step::SetFirst(key::end(0), end)));
    // Waiting on a verdict only the coordinator writes: it now waits on every member.
    let mut sp: Vec<Rendezvous> = (0..3).map(|n| agent(3, 2, n)).collect();
    sp[1].join(0, None);
    let alive = [1, 2];
    let steps = sp[1].step(Fact::CoordinatorClaimed {
        old: 0,
        alive: &alive,
        from: b"",
        held: b"1",
    });
    assert_eq!(steps[3], Step::Wait(key::all(0), Patience::Join));
}

#[test]
fn a_leaving_agent_ends_the_attempt_then_says_it_left_by_its_role() {
    let end = JobEnd::Lost {
        reason: "x".into(),
        node: None,
    };
    // Not coordinating: its highest step, left (not lost), its lease given back.
    let mut n1 = agent(2, 2, 1);
    assert_eq!(
        n1.step(Fact::Leave {
            poison: Some((2, end.clone())),
            highest_step: Some(9),
            hosts_store: false,
        }),
        vec![
            Step::Bounded(poison(2, &end)),
            Step::BestEffort(vec![
                Step::Set(key::highest(1), b"9".to_vec()),
                Step::Set(key::alive(1), b"-1".to_vec()),
                Step::Delete(key::lease(1)),
            ])
        ]
    );
    // A standby that departed keeps its lease: its connection's end is its loss.
    let mut s = agent(3, 2, 2);
    assert_eq!(
        s.step(Fact::Depart {
            reason: "signal".into()
        }),
        vec![Step::Set(key::left(2), b"signal".to_vec())]
    );
    let leave = Fact::Leave {
        poison: None,
        highest_step: None,
        hosts_store: false,
    };
    assert_eq!(s.step(leave.clone()), vec![]);
    // The coordinator through a store outside the job writes the job's end.
    let mut c = agent(2, 2, 0);
    assert_eq!(
        c.step(leave),
        vec![Step::BestEffort(vec![
            Step::Set(key::alive(0), b"-1".to_vec()),
            Step::Set(key::JOB_END.to_string(), vec![]),
        ])]
    );
    // Node rank 0 hosting the store keeps it up for the others.
    assert_eq!(
        head(2, 2).step(Fact::Leave {
            poison: None,
            highest_step: None,
            hosts_store: true,
        }),
        vec![Step::HoldStore]
    );
    // Deposed: it steps down, is lost, and ends nothing for the job when it leaves.
    let steps = c.step(Fact::Deposed {
        reason: "taken over".into(),
    });
    assert_eq!(
        steps,
        vec![
            Step::StepDown,
            Step::Tell(FromCoord::lost("taken over".into(), true))
        ]
    );
    assert!(c.deposed() && !c.is_head());
    let steps = c.step(Fact::Leave {
        poison: Some((0, end)),
        highest_step: None,
        hosts_store: false,
    });
    assert!(matches!(&steps[..], [Step::BestEffort(_)]), "{steps:?}");
}

fn hang_candidate(rank: u32, step: u64, since: u64, stopped: bool) -> WireHangCandidate {
    WireHangCandidate {
        rank,
        pid: 100 + rank as i32,
        step: Some(step),
        section: Some("step".into()),
        silent_since_ms: since,
        stopped,
        waiting: None,
    }
}

#[test]
fn a_node_s_hang_report_asks_every_node_writes_its_candidates_and_counts_itself() {
    let mut r = agent(2, 2, 1);
    let mine = vec![hang_candidate(3, 9, 1_030, false)];
    let steps = r.step(Fact::HangReport {
        attempt: 3,
        round: 1,
        candidates: &mine,
    });
    let counted = Counted::Hangs {
        attempt: 3,
        round: 1,
    };
    assert_eq!(
        steps,
        vec![
            Step::SetFirst(key::hang(3, 1), b"1".to_vec()),
            Step::Set(key::hang_report(3, 1, 1), to_json(&mine)),
            Step::Add(key::hang_count(3, 1), counted),
        ]
    );
    // The count comes back as the fact the choice waits on.
    let fact = Fact::HangsCounted {
        attempt: 3,
        round: 1,
        count: 2,
    };
    assert_eq!(
        r.step(counted.fact(2)),
        r.step(fact),
        "the count is the same fact"
    );
    assert_eq!(
        r.step(counted.fact(2)),
        vec![Step::ChooseHung {
            attempt: 3,
            round: 1
        }]
    );
    // A node with no candidate still writes (an empty list) and counts: the verdict waits on it.
    let steps = r.step(Fact::HangReport {
        attempt: 3,
        round: 2,
        candidates: &[],
    });
    assert_eq!(
        steps[1],
        Step::Set(key::hang_report(3, 2, 1), b"[]".to_vec())
    );
}

#[test]
fn the_last_node_to_report_its_hang_candidates_chooses_the_rank_for_the_job() {
    let mut r = agent(2, 2, 1);
    let counted = |count| Fact::HangsCounted {
        attempt: 3,
        round: 1,
        count,
    };
    assert!(r.step(counted(1)).is_empty(), "node 0 still to report");
    let choose = Step::ChooseHung {
        attempt: 3,
        round: 1,
    };
    assert_eq!(r.step(counted(2)), vec![choose]);
    // Node 0's ranks wait in the collective; node 1's rank 3 went silent after them.
    let all = vec![
        vec![
            hang_candidate(0, 9, 1_000, false),
            hang_candidate(1, 9, 1_004, false),
        ],
        vec![
            hang_candidate(2, 9, 1_002, false),
            hang_candidate(3, 9, 1_030, false),
        ],
    ];
    let read = |all| Fact::HangsRead {
        attempt: 3,
        round: 1,
        all,
    };
    let named = to_json(&Some(hang_candidate(3, 9, 1_030, false)));
    let verdict = key::hang_named(3, 1);
    assert_eq!(
        r.step(read(all)),
        vec![Step::SetFirst(verdict.clone(), named)]
    );
    // A stopped rank is named first; no candidate anywhere names none.
    let all = vec![
        vec![hang_candidate(0, 9, 1_000, true)],
        vec![hang_candidate(3, 9, 1_030, false)],
    ];
    let named = to_json(&Some(hang_candidate(0, 9, 1_000, true)));
    assert_eq!(
        r.step(read(all)),
        vec![Step::SetFirst(verdict.clone(), named)]
    );
    // A rank not waiting in a collective comes before those that do, though its silence began
    // first; a rank whose place is unknown counts as not waiting.
    let at = |rank, since, waiting| WireHangCandidate {
        waiting,
        ..hang_candidate(rank, 9, since, false)
    };
    let all = vec![
        vec![at(0, 1_004, Some(true)), at(1, 1_003, Some(true))],
        vec![at(2, 1_002, Some(true)), at(3, 1_000, Some(false))],
    ];
    let named = to_json(&Some(at(3, 1_000, Some(false))));
    assert_eq!(
        r.step(read(all)),
        vec![Step::SetFirst(verdict.clone(), named)]
    );
    let all = vec![vec![at(0, 1_004, Some(true))], vec![at(3, 1_000, None)]];
    let named = to_json(&Some(at(3, 1_000, None)));
    assert_eq!(
        r.step(read(all)),
        vec![Step::SetFirst(verdict.clone(), named)]
    );
    let none: Option<WireHangCandidate> = None;
    let all = vec![vec![], vec![]];
    assert_eq!(
        r.step(read(all)),
        vec![Step::SetFirst(verdict, to_json(&none))]
    );
}

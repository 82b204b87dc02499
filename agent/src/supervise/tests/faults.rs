//! Node faults (an unfit node, a GPU) and stragglers.

use super::*;

#[test]
fn an_unfit_node_ends_before_joining_and_asks_to_be_left_out() {
    let t = Instant::now();
    // Before the rendezvous of the first attempt (its health check failed): nothing ran.
    let (mut s, _) = node(1, 2, 3);
    let a = s.handle(
        t,
        Event::NodeFault {
            reason: "gpu_ecc".into(),
            at_gate: true,
        },
    );
    let o = finish(&a).unwrap();
    assert_eq!(o.exit_code(), EXIT_LOST);
    assert!(matches!(o, Outcome::Lost { requeue: true, .. }), "{o:?}");
    assert!(s.exclude_asked());
    // The other nodes learn that this node is to be left out.
    assert!(has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::Leave {
            poison: Some((0, JobEnd::Lost { node: Some(1), .. })),
            ..
        })
    )));
    assert!(!has(&a, |x| matches!(x, Action::SpawnAttempt { .. })));
}

#[test]
fn an_unfit_node_while_ranks_run_stops_them_and_asks_to_be_left_out() {
    // A critical XID on one of this node's GPUs mid-attempt.
    let t = Instant::now();
    let (mut s, _) = node(1, 2, 3);
    s.handle(t, joined(0, 2, 3));
    started(&mut s, t, 20);
    let a = s.handle(
        t,
        Event::NodeFault {
            reason: "XID 79 on GPU 1".into(),
            at_gate: false,
        },
    );
    assert_eq!(signals(&a), vec![(vec![20, 21], SIGTERM)]);
    // The other nodes learn of it at once, as of a failure here.
    let end = a
        .iter()
        .find_map(|x| match x {
            Action::Job(JobRequest::ReportEnd { end, .. }) => Some(end.clone()),
            _ => None,
        })
        .expect("the failure is reported to the job");
    assert!(
        matches!(&end, JobEnd::Failed { node: 1, reason } if reason.contains("XID 79")),
        "{end:?}"
    );
    s.handle(
        t,
        Event::Reaped {
            pid: 20,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    s.handle(
        t,
        Event::Reaped {
            pid: 21,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    // The job's verdict: restarts are left, but this node leaves instead.
    let a = s.handle(t, Event::AttemptEnded { attempt: 0, end });
    let o = finish(&a).unwrap();
    assert!(matches!(o, Outcome::Lost { requeue: true, .. }), "{o:?}");
    assert!(has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::Leave {
            poison: Some((_, JobEnd::Lost { node: Some(1), .. })),
            ..
        })
    )));
    assert!(!has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::Join { .. })
    )));
}

#[test]
fn a_node_fault_stops_the_ranks_and_the_node_leaves_for_a_requeue_without_restarting() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 3));
    spawn_all(&mut s, t, 100);
    let a = s.handle(
        t,
        Event::NodeFault {
            reason: "GPU 1: critical XID 79 (fallen off the bus)".into(),
            at_gate: false,
        },
    );
    assert!(has(&a, |x| matches!(
        x,
        Action::Record(Record::NodeFault { .. })
    )));
    assert_eq!(signals(&a), vec![(vec![100, 101], SIGTERM)]);
    s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    // Restarts were left, but a node that cannot run ranks is not restarted on.
    assert!(!has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::Join { .. })
    )));
    match finish(&a) {
        Some(Outcome::Lost {
            reason,
            requeue: true,
        }) => assert!(reason.contains("XID 79"), "{reason}"),
        other => panic!("expected a lost node to requeue, got {other:?}"),
    }
    assert!(s.exclude_asked());
}

#[test]
fn a_node_fault_between_attempts_starts_no_rank_in_the_next_one() {
    let t = Instant::now();
    let mut c = cfg(1, 3);
    c.backoff = Backoff {
        base: Duration::from_secs(5),
        cap: Duration::from_secs(5),
        reset_after: Duration::from_secs(600),
    };
    let (mut s, _) = Solo::new(c);
    spawn_all(&mut s, t, 100);
    // The rank fails twice: a back-off before the third attempt, during which the GPU faults.
    s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(1),
        },
    );
    spawn_all(&mut s, t, 200);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 200,
            how: ExitKind::Code(1),
        },
    );
    assert!(
        !has(&a, |x| matches!(x, Action::SpawnAttempt { .. })),
        "the test needs a back-off: {a:?}"
    );
    s.handle(
        t,
        Event::NodeFault {
            reason: "ECC".into(),
            at_gate: false,
        },
    );
    let a = s.handle(t + Duration::from_secs(60), Event::Tick);
    assert!(
        !has(&a, |x| matches!(x, Action::SpawnAttempt { .. })),
        "no rank may start on a faulty node: {a:?}"
    );
    assert!(matches!(
        finish(&a),
        Some(Outcome::Lost { requeue: true, .. })
    ));
}

#[test]
fn stragglers_stop_the_job_at_a_step_and_blame_their_nodes_only_when_asked() {
    let t = Instant::now();
    // Without --stop-if-straggler a report changes nothing.
    let (mut s, _) = Solo::new(cfg(1, 0));
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    let a = s.handle(t, Event::Stragglers { nodes: vec![1] });
    assert!(a.is_empty(), "{a:?}");
    assert!(s.blamed_nodes().is_empty());

    let mut c = cfg(1, 0);
    c.stop_if_straggler = true;
    let (mut s, _) = Solo::new(c);
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    send(&mut s, t, 0, RankMsg::Progress { step: 9 });
    let a = s.handle(t, Event::Stragglers { nodes: vec![1, 1] });
    assert!(has(&a, |x| matches!(
        x,
        Action::Record(Record::StopTriggered { trigger, .. }) if trigger == "straggler"
    )));
    assert_eq!(stop_requests(&a), vec![Some(10)]);
    assert_eq!(s.blamed_nodes(), &[1]);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(0),
        },
    );
    assert_eq!(
        finish(&a),
        Some(&Outcome::Stopped {
            trigger: "straggler".into(),
            step: Some(10)
        })
    );
}

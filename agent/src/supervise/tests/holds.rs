//! Ranks that hold the stop signals for `should_stop(step)`: when they are killed.

use super::*;

fn stop_record(actions: &[Action]) -> Option<(StopReason, Vec<i32>, Vec<i32>)> {
    actions.iter().find_map(|a| match a {
        Action::Record(Record::Stop {
            reason,
            pids,
            killed,
            ..
        }) => Some((*reason, pids.clone(), killed.clone())),
        _ => None,
    })
}

#[test]
fn a_failure_stop_kills_ranks_that_hold_sigterm_at_once_and_signals_the_others() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(3, 1));
    spawn_all(&mut s, t, 100);
    for lr in 0..3 {
        register(&mut s, t, lr);
    }
    send(&mut s, t, 0, held());
    send(&mut s, t, 1, held());
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Code(1),
        },
    );
    // Rank 0 would only note SIGTERM (or stay blocked in a collective) for the whole grace.
    assert_eq!(
        signals(&a),
        vec![(vec![100], SIGKILL), (vec![102], SIGTERM)]
    );
    assert_eq!(
        stop_record(&a),
        Some((StopReason::RankFailed, vec![100, 102], vec![100]))
    );
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Signal(SIGKILL),
        },
    );
    assert!(s.failures().len() == 1, "a rank we killed is no failure");
    assert!(spawns(&a).is_empty(), "rank 2 still runs");
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 102,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    assert_eq!(spawns(&a), vec![1]);
}

#[test]
fn a_rank_that_says_it_holds_sigterm_after_a_failure_stop_began_is_killed_then() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 1));
    spawn_all(&mut s, t, 100);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Code(1),
        },
    );
    assert_eq!(signals(&a), vec![(vec![100], SIGTERM)]);
    // Its message was on the way when the stop began.
    register(&mut s, t, 0);
    let a = send(&mut s, t, 0, held());
    assert_eq!(signals(&a), vec![(vec![100], SIGKILL)]);
}

#[test]
fn a_hung_rank_and_a_lost_node_kill_holders_at_once_a_stop_at_a_step_does_not() {
    let t = Instant::now();
    // Another node failed or was lost: ours are stopped at once.
    for end in [
        JobEnd::Failed {
            node: 1,
            reason: "rank 3 hung".into(),
        },
        JobEnd::Lost {
            reason: "node 1 lost".into(),
            node: Some(1),
        },
    ] {
        let (mut s, _) = node(0, 2, 0);
        s.handle(t, joined(0, 0, 0));
        started(&mut s, t, 10);
        s.handle(
            t,
            Event::Message {
                local_rank: 0,
                msg: held(),
            },
        );
        let a = s.handle(t, Event::AttemptEnded { attempt: 0, end });
        assert_eq!(signals(&a), vec![(vec![10], SIGKILL), (vec![11], SIGTERM)]);
    }
    // Another node stopped for good (a signal): ours get the grace to save.
    let (mut s, _) = node(0, 2, 0);
    s.handle(t, joined(0, 0, 0));
    started(&mut s, t, 10);
    s.handle(
        t,
        Event::Message {
            local_rank: 0,
            msg: held(),
        },
    );
    let end = JobEnd::Stopped {
        node: 1,
        reason: "node 1 received SIGTERM".into(),
        exit_code: 143,
    };
    let a = s.handle(t, Event::AttemptEnded { attempt: 0, end });
    assert_eq!(signals(&a), vec![(vec![10, 11], SIGTERM)]);
    // A failure while the job stops at a step: the ranks were asked to save at that step.
    let (mut s, _) = Solo::new(cfg(2, 3));
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    register(&mut s, t, 1);
    send(&mut s, t, 0, held());
    s.handle(t, signal(&s, SIGTERM));
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Code(3),
        },
    );
    assert_eq!(signals(&a), vec![(vec![100], SIGTERM)]);
}

#[test]
fn a_hung_rank_that_holds_the_termination_signal_is_killed_after_its_stacks() {
    let t = Instant::now();
    let mut c = cfg(2, 0);
    c.timeouts.heartbeat = Some(Duration::from_secs(2));
    let (mut s, _) = Solo::new(c);
    spawn_all(&mut s, t, 100);
    for lr in 0..2 {
        register(&mut s, t, lr);
        send(&mut s, t, lr, held());
        send(&mut s, t, lr, RankMsg::Heartbeat { step: None });
    }
    let t1 = t + Duration::from_secs(1);
    send(&mut s, t1, 1, RankMsg::Heartbeat { step: None });
    let t2 = t + Duration::from_secs(2);
    let a = s.handle(t2, Event::Tick);
    assert!(has(&a, |x| matches!(
        x,
        Action::CaptureStacks { local_rank: 0, .. }
    )));
    let a = s.handle(t2, Event::StacksCaptured { local_rank: 0 });
    assert_eq!(signals(&a), vec![(vec![100, 101], SIGKILL)]);
}

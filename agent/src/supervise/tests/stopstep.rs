//! The stop at an agreed step: the request, the window, another node's trigger.

use super::*;

#[test]
fn sigterm_asks_ranks_that_speak_to_the_shim_for_one_step_and_signals_none() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 3));
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    register(&mut s, t, 1);
    send(&mut s, t, 0, RankMsg::Progress { step: 40 });
    send(&mut s, t, 1, RankMsg::Progress { step: 41 });
    let a = s.handle(t + Duration::from_secs(1), signal(&s, SIGTERM));
    assert!(signals(&a).is_empty(), "no rank is signalled: {a:?}");
    // One step past the highest reported: no pace is known yet.
    assert_eq!(stop_requests(&a), vec![Some(42)]);
    assert!(has(&a, |x| matches!(
        x,
        Action::Record(Record::StopAgreed { step: Some(42), .. })
    )));
    // Both checkpoint and exit 0: the allocation ends stopped, never restarted.
    let t2 = t + Duration::from_secs(2);
    s.handle(
        t2,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(0),
        },
    );
    let a = s.handle(
        t2,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Code(0),
        },
    );
    assert_eq!(
        finish(&a),
        Some(&Outcome::Stopped {
            trigger: "SIGTERM".into(),
            step: Some(42)
        })
    );
    assert_eq!(finish(&a).unwrap().exit_code(), EXIT_LOST);
    assert!(!has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::Join { .. })
    )));
}

#[test]
fn the_stop_step_leaves_room_for_the_fastest_rank() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(1, 0));
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    // 10 steps per second.
    for i in 0..=10u64 {
        send(
            &mut s,
            t + Duration::from_millis(100 * i),
            0,
            RankMsg::Progress { step: i },
        );
    }
    let a = s.handle(t + Duration::from_secs(2), signal(&s, libc::SIGUSR1));
    assert_eq!(stop_requests(&a), vec![Some(10 + 10 + 1)]);
    assert_eq!(s.stop_asked(), Some(("SIGUSR1".to_string(), Some(21))));
}

#[test]
fn ranks_without_the_shim_get_the_signal_and_their_exit_is_no_failure() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 3));
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0); // rank 1 never connects
    send(&mut s, t, 0, RankMsg::Progress { step: 7 });
    let a = s.handle(t, signal(&s, SIGTERM));
    assert_eq!(signals(&a), vec![(vec![101], SIGTERM)]);
    assert_eq!(stop_requests(&a), vec![Some(8)]);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    assert!(has(&a, |x| matches!(
        x,
        Action::Record(Record::RankExited { expected: true, .. })
    )));
    assert!(s.failures().is_empty());
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(0),
        },
    );
    assert!(matches!(finish(&a), Some(Outcome::Stopped { .. })));
}

#[test]
fn with_no_rank_asking_for_steps_a_sigterm_is_forwarded_as_before() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 3));
    spawn_all(&mut s, t, 100);
    // Connected and heartbeating, but never calling should_stop(step): it may handle SIGTERM
    // itself, so it gets it at once.
    send(
        &mut s,
        t,
        0,
        RankMsg::Register {
            rank: 0,
            local_rank: 0,
            pid: 100,
            attempt: 0,
        },
    );
    send(&mut s, t, 0, RankMsg::Heartbeat { step: Some(4) });
    let a = s.handle(t, signal(&s, SIGTERM));
    assert_eq!(signals(&a), vec![(vec![100, 101], SIGTERM)]);
    assert!(stop_requests(&a).is_empty());
}

#[test]
fn a_failure_while_stopping_ends_the_allocation_without_a_restart() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 3));
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    register(&mut s, t, 1);
    s.handle(t, signal(&s, SIGTERM));
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(3),
        },
    );
    assert_eq!(signals(&a), vec![(vec![101], SIGTERM)]);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Failed { restarts: 0 }));
    assert!(!has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::Join { .. })
    )));
}

#[test]
fn a_rank_that_ignores_the_request_is_stopped_when_the_window_ends_and_named() {
    let t = Instant::now();
    let mut c = cfg(2, 0);
    c.term_timeout = Duration::from_secs(5);
    let (mut s, _) = Solo::new(c);
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    register(&mut s, t, 1);
    s.handle(t, signal(&s, SIGTERM));
    s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(0),
        },
    );
    assert_eq!(s.next_deadline(), Some(t + Duration::from_secs(5)));
    assert!(s.handle(t + Duration::from_secs(4), Event::Tick).is_empty());
    let a = s.handle(t + Duration::from_secs(5), Event::Tick);
    assert!(has(
        &a,
        |x| matches!(x, Action::Record(Record::StopOverdue { ranks, .. }) if ranks == &vec![1])
    ));
    assert_eq!(signals(&a), vec![(vec![101], SIGTERM)]);
    // Then SIGKILL after the grace, as any stop.
    let a = s.handle(t + Duration::from_secs(10), Event::Tick);
    assert_eq!(signals(&a), vec![(vec![101], SIGKILL)]);
    let a = s.handle(
        t + Duration::from_secs(10),
        Event::Reaped {
            pid: 101,
            how: ExitKind::Signal(SIGKILL),
        },
    );
    assert!(matches!(finish(&a), Some(Outcome::Stopped { .. })), "{a:?}");
}

#[test]
fn a_second_signal_is_obeyed_at_once() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(1, 0));
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    s.handle(t, signal(&s, SIGTERM));
    let a = s.handle(t, signal(&s, SIGTERM));
    assert_eq!(signals(&a), vec![(vec![100], SIGTERM)]);
}

#[test]
fn the_allocation_end_within_the_lead_asks_for_a_stop() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(1, 0));
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    send(&mut s, t, 0, RankMsg::Progress { step: 3 });
    let at = t + Duration::from_secs(50);
    s.handle(
        t,
        Event::StopAt {
            at: Some(at),
            window: Duration::from_secs(60),
        },
    );
    assert_eq!(s.next_deadline(), Some(at));
    assert!(stop_requests(&s.handle(at - Duration::from_secs(1), Event::Tick)).is_empty());
    let a = s.handle(at, Event::Tick);
    assert_eq!(stop_requests(&a), vec![Some(4)]);
    assert_eq!(s.stop_asked(), Some(("time-limit".to_string(), Some(4))));
    // The ranks now have the window to stop.
    assert_eq!(s.next_deadline(), Some(at + Duration::from_secs(60)));
}

#[test]
fn a_rank_that_connects_after_the_agreement_is_told_the_step() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 0));
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    send(&mut s, t, 0, RankMsg::Progress { step: 5 });
    s.handle(t, signal(&s, SIGTERM));
    let a = send(
        &mut s,
        t,
        1,
        RankMsg::Register {
            rank: 1,
            local_rank: 1,
            pid: 101,
            attempt: 0,
        },
    );
    assert_eq!(stop_requests(&a), vec![Some(6)]);
}

#[test]
fn another_nodes_trigger_reports_our_steps_and_signals_nothing_yet() {
    let t = Instant::now();
    let (mut s, _) = node(1, 2, 0);
    s.handle(t, joined(0, 2, 0));
    started(&mut s, t, 100);
    for lr in 0..2 {
        s.handle(
            t,
            Event::Message {
                local_rank: lr,
                msg: RankMsg::Register {
                    rank: 2 + lr,
                    local_rank: lr,
                    pid: 100 + lr,
                    attempt: 0,
                },
            },
        );
        s.handle(
            t,
            Event::Message {
                local_rank: lr,
                msg: RankMsg::Progress { step: 0 },
            },
        );
    }
    s.handle(
        t,
        Event::Message {
            local_rank: 1,
            msg: RankMsg::Progress { step: 9 },
        },
    );
    let a = s.handle(
        t,
        Event::StopAsked {
            attempt: 0,
            trigger: "SIGUSR2".into(),
        },
    );
    assert!(signals(&a).is_empty());
    assert!(has(
        &a,
        |x| matches!(x, Action::Job(JobRequest::StopSteps { attempt: 0, report }) if report.max_step == Some(9))
    ));
    let a = s.handle(
        t,
        Event::StopStep {
            attempt: 0,
            step: Some(30),
        },
    );
    assert_eq!(stop_requests(&a), vec![Some(30)]);
    // A stale attempt's answer changes nothing.
    assert!(s
        .handle(
            t,
            Event::StopStep {
                attempt: 7,
                step: Some(1)
            }
        )
        .is_empty());
}

#[test]
fn a_nodes_own_signal_after_another_nodes_trigger_is_not_a_second_signal() {
    // Slurm signals every node; node 1 learns of node 0's trigger before its own SIGTERM arrives.
    let t = Instant::now();
    let (mut s, _) = node(1, 1, 0);
    s.handle(t, joined(0, 1, 0));
    started(&mut s, t, 100);
    for msg in [
        RankMsg::Register {
            rank: 1,
            local_rank: 0,
            pid: 100,
            attempt: 0,
        },
        RankMsg::Progress { step: 7 },
    ] {
        s.handle(t, Event::Message { local_rank: 0, msg });
    }
    s.handle(
        t,
        Event::StopAsked {
            attempt: 0,
            trigger: "SIGTERM".into(),
        },
    );
    let a = s.handle(t, signal(&s, SIGTERM));
    assert!(signals(&a).is_empty(), "{a:?}");
    let a = s.handle(
        t,
        Event::StopStep {
            attempt: 0,
            step: Some(9),
        },
    );
    assert_eq!(stop_requests(&a), vec![Some(9)]);
    // A second signal to this agent: now, and the ranks holding SIGTERM are told so.
    let a = s.handle(t, signal(&s, SIGTERM));
    assert_eq!(signals(&a), vec![(vec![100], SIGTERM)]);
    assert_eq!(stop_requests(&a), vec![None]);
}

#[test]
fn a_rank_signalled_on_its_own_stops_the_job_at_one_step_as_a_signal_to_the_agent() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 3));
    spawn_all(&mut s, t, 100);
    register(&mut s, t, 0);
    register(&mut s, t, 1);
    send(&mut s, t, 0, held());
    send(&mut s, t, 1, held());
    send(&mut s, t, 0, RankMsg::Progress { step: 40 });
    send(&mut s, t, 1, RankMsg::Progress { step: 41 });
    let t1 = t + Duration::from_secs(1);
    let a = send(
        &mut s,
        t1,
        1,
        RankMsg::Signalled {
            signal: libc::SIGTERM as u32,
        },
    );
    assert!(has(&a, |x| matches!(
        x,
        Action::Record(Record::RankSignalled {
            rank: 1,
            signal: libc::SIGTERM,
            ..
        })
    )));
    assert!(signals(&a).is_empty(), "no rank is signalled: {a:?}");
    assert_eq!(stop_requests(&a), vec![Some(42)]);
    // Slurm signals the agent too: not a second signal, so not obeyed at once.
    let a = s.handle(t1, signal(&s, SIGTERM));
    assert!(
        signals(&a).is_empty() && stop_requests(&a).is_empty(),
        "{a:?}"
    );
    // Signals that are no stop signals (or garbage) change nothing.
    for signal in [libc::SIGINT as u32, u32::MAX] {
        assert!(send(&mut s, t1, 0, RankMsg::Signalled { signal }).is_empty());
    }
    s.handle(
        t1,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(0),
        },
    );
    let a = s.handle(
        t1,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Code(0),
        },
    );
    // Stopped, not finished: the job is to go on in the next allocation.
    assert_eq!(
        finish(&a),
        Some(&Outcome::Stopped {
            trigger: "SIGTERM".into(),
            step: Some(42)
        })
    );
}

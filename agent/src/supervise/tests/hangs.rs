//! Hangs: the probe, the root cause, the diagnosis, disconnects.

use super::*;

#[test]
fn hung_rank_gets_only_the_termination_signal() {
    let t = Instant::now();
    let mut c = cfg(2, 0);
    c.timeouts.heartbeat = Some(Duration::from_secs(1));
    c.termination_signal = SIGKILL;
    let (mut s, _) = Solo::new(c);
    spawn_all(&mut s, t, 100);
    for lr in 0..2 {
        let reg = RankMsg::Register {
            rank: lr,
            local_rank: lr,
            pid: 100 + lr,
            attempt: 0,
        };
        s.handle(
            t,
            Event::Message {
                local_rank: lr,
                msg: reg,
            },
        );
        s.handle(
            t,
            Event::Message {
                local_rank: lr,
                msg: RankMsg::Heartbeat { step: None },
            },
        );
    }
    let t1 = t + Duration::from_millis(500);
    s.handle(
        t1,
        Event::Message {
            local_rank: 0,
            msg: RankMsg::Heartbeat { step: None },
        },
    );
    assert_eq!(
        s.next_deadline(),
        Some(t + Duration::from_secs(1)),
        "rank 1 is due first"
    );
    let a = s.handle(t + Duration::from_secs(1), Event::Tick);
    assert!(a.iter().any(|x| matches!(
        x,
        Action::CaptureStacks {
            local_rank: 1,
            pid: 101,
            via_shim: true
        }
    )));
    assert!(signals(&a).is_empty(), "stacks first, then signals");
    let a = s.handle(
        t + Duration::from_secs(1),
        Event::StacksCaptured { local_rank: 1 },
    );
    assert_eq!(
        signals(&a),
        vec![(vec![100], SIGTERM), (vec![101], SIGKILL)]
    );
    assert_eq!(
        s.failures()[0].hang.as_ref().unwrap().timeout,
        HangKind::Heartbeat
    );
}

/// Two registered ranks that heartbeat at `t`; local rank 0 once more at `t + 500 ms`.
fn two_beating(t: Instant, stopped: Vec<u32>) -> Solo {
    let mut c = cfg(2, 0);
    c.timeouts.heartbeat = Some(Duration::from_secs(1));
    let (mut s, _) = Solo::new(c);
    s.stopped = stopped;
    spawn_all(&mut s, t, 100);
    for lr in 0..2 {
        let reg = RankMsg::Register {
            rank: lr,
            local_rank: lr,
            pid: 100 + lr,
            attempt: 0,
        };
        for msg in [reg, RankMsg::Heartbeat { step: None }] {
            s.handle(
                t,
                Event::Message {
                    local_rank: lr,
                    msg,
                },
            );
        }
    }
    let msg = RankMsg::Heartbeat { step: None };
    s.handle(
        t + Duration::from_millis(500),
        Event::Message { local_rank: 0, msg },
    );
    s
}

fn hangs(actions: &[Action]) -> Vec<(u32, Hang)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Record(Record::Hang {
                local_rank, hang, ..
            }) => Some((*local_rank, hang.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_stopped_rank_is_named_hung_before_the_ranks_waiting_on_it() {
    let t = Instant::now();
    // Rank 1 went silent first (waiting on rank 0), but rank 0's process is stopped.
    let mut s = two_beating(t, vec![0]);
    let now = t + Duration::from_secs(1);
    let a = s.handle(now, Event::Tick);
    // Where the main thread is, is asked only of a rank silent for 3/4 of its timeout: rank 0
    // spoke half a timeout ago (the signal that asks would interrupt a rank still going).
    assert!(a
        .iter()
        .any(|x| matches!(x, Action::ProbeStopped { ranks, ask_where } if ranks == &[(0, 100), (1, 101)] && ask_where == &[1])));
    let h = hangs(&a);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].0, 0);
    assert!(h[0].1.stopped);
    assert_eq!(h[0].1.silent_ms, 500);
    s.handle(now, Event::StacksCaptured { local_rank: 0 });
    assert_eq!(s.failures().len(), 1);
    assert_eq!(s.failures()[0].local_rank, 0);

    // Nothing stopped: the rank that ran out first is hung, as before.
    let mut s = two_beating(t, vec![]);
    let h = hangs(&s.handle(now, Event::Tick));
    assert_eq!((h[0].0, h[0].1.stopped), (1, false));
}

fn raised(s: &mut Solo, at: Instant, lr: u32) -> Vec<Action> {
    let error = "RuntimeError: Parent directory /ckpt does not exist.".to_string();
    send(s, at, lr, RankMsg::Raised { error })
}

#[test]
fn a_rank_that_raised_and_has_not_exited_is_hung_before_the_ranks_waiting_on_it() {
    let t = Instant::now();
    // Rank 1 went silent first (waiting on rank 0); rank 0 raised (a failed save) at 600 ms and
    // its interpreter is still shutting down when rank 1's heartbeat timeout runs out.
    let mut s = two_beating(t, vec![]);
    let a = raised(&mut s, t + Duration::from_millis(600), 0);
    let rec = a.iter().find_map(|x| match x {
        Action::Record(Record::RankRaised {
            local_rank,
            pid,
            error,
            ..
        }) => Some((*local_rank, *pid, error.clone())),
        _ => None,
    });
    let (lr, pid, error) = rec.expect("a rank_raised record");
    assert_eq!((lr, pid), (0, 100));
    assert!(error.starts_with("RuntimeError"), "{error}");
    // Told twice (a hook that ran twice): recorded once.
    assert!(!has(
        &raised(&mut s, t + Duration::from_millis(700), 0),
        |x| { matches!(x, Action::Record(Record::RankRaised { .. })) }
    ));
    let h = hangs(&s.handle(t + Duration::from_secs(1), Event::Tick));
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!(h[0].0, 0);
    // Named for what it did, not as a stopped process.
    assert!(!h[0].1.stopped);
    assert!(h[0]
        .1
        .raised
        .as_deref()
        .unwrap()
        .starts_with("RuntimeError"));
}

#[test]
fn a_rank_that_raised_without_a_timeout_of_its_own_is_still_the_culprit() {
    let t = Instant::now();
    // Section timeouts only: rank 1 left its section when it raised and has no deadline; ranks
    // 0 and 2 wait in the all-reduce, inside theirs, and rank 2 went silent last.
    let mut s = three_in_step(t, [5, 5, 5], [0, 0, 10]);
    let end = RankMsg::SectionEnd {
        name: "step".into(),
    };
    send(&mut s, t + Duration::from_millis(5), 1, end);
    raised(&mut s, t + Duration::from_millis(5), 1);
    s.waiting = vec![(0, true), (2, true)];
    let h = hangs(&s.handle(t + Duration::from_secs(1), Event::Tick));
    assert_eq!((h.len(), h[0].0), (1, 1), "{h:?}");
    assert!(!h[0].1.stopped && h[0].1.raised.is_some(), "{h:?}");
}

#[test]
fn a_probe_answer_after_the_rank_spoke_again_declares_nothing() {
    let t = Instant::now();
    let mut c = cfg(1, 0);
    c.timeouts.heartbeat = Some(Duration::from_secs(1));
    let (s, _) = Solo::new(c);
    let mut s = s.s;
    // Driven by hand: the probe's answer comes after a heartbeat.
    s.handle(
        t,
        Event::RankSpawned {
            local_rank: 0,
            pid: 7,
        },
    );
    let reg = RankMsg::Register {
        rank: 0,
        local_rank: 0,
        pid: 7,
        attempt: 0,
    };
    for msg in [reg, RankMsg::Heartbeat { step: None }] {
        s.handle(t, Event::Message { local_rank: 0, msg });
    }
    let now = t + Duration::from_secs(2);
    let a = s.handle(now, Event::Tick);
    assert!(a.iter().any(|x| matches!(x, Action::ProbeStopped { .. })));
    assert!(s.handle(now, Event::Tick).is_empty(), "one probe at a time");
    let msg = RankMsg::Heartbeat { step: None };
    s.handle(now, Event::Message { local_rank: 0, msg });
    let a = s.handle(
        now,
        Event::Probed {
            stopped: vec![],
            waiting: vec![],
        },
    );
    assert!(hangs(&a).is_empty(), "{a:?}");
}

#[test]
fn disconnect_pauses_monitoring_until_reregistration() {
    let t = Instant::now();
    let mut c = cfg(1, 0);
    c.timeouts.heartbeat = Some(Duration::from_secs(1));
    let (mut s, _) = Solo::new(c);
    spawn_all(&mut s, t, 100);
    let reg = RankMsg::Register {
        rank: 0,
        local_rank: 0,
        pid: 100,
        attempt: 0,
    };
    s.handle(
        t,
        Event::Message {
            local_rank: 0,
            msg: reg.clone(),
        },
    );
    s.handle(
        t,
        Event::Message {
            local_rank: 0,
            msg: RankMsg::Heartbeat { step: None },
        },
    );
    assert!(s.next_deadline().is_some());
    s.handle(t, Event::Disconnected { local_rank: 0 });
    assert_eq!(s.next_deadline(), None);
    let t5 = t + Duration::from_secs(5);
    s.handle(
        t5,
        Event::Message {
            local_rank: 0,
            msg: reg,
        },
    );
    assert_eq!(
        s.next_deadline(),
        Some(t5 + Duration::from_secs(1)),
        "a fresh window after reconnecting"
    );
}

/// Three registered ranks, each reporting step `steps[lr]` and opening section "step" (timeout
/// 1 s) at `t + opens[lr]`.
fn three_in_step(t: Instant, steps: [u64; 3], opens_ms: [u64; 3]) -> Solo {
    let mut c = cfg(3, 0);
    c.timeouts
        .sections
        .insert("step".into(), Duration::from_secs(1));
    let (mut s, _) = Solo::new(c);
    spawn_all(&mut s, t, 100);
    for lr in 0..3u32 {
        register(&mut s, t, lr);
        send(
            &mut s,
            t,
            lr,
            RankMsg::Progress {
                step: steps[lr as usize],
            },
        );
    }
    for lr in 0..3u32 {
        let at = t + Duration::from_millis(opens_ms[lr as usize]);
        let msg = RankMsg::SectionStart {
            name: "step".into(),
        };
        send(&mut s, at, lr, msg);
    }
    s
}

#[test]
fn the_rank_that_went_silent_last_is_hung_not_those_waiting_for_it() {
    let t = Instant::now();
    // Ranks 0 and 2 opened the section and wait in a collective for rank 1, which opened it
    // 20 ms later and is stuck: rank 0 runs out first.
    let mut s = three_in_step(t, [5, 5, 5], [0, 20, 5]);
    let now = t + Duration::from_secs(1);
    assert_eq!(s.next_deadline(), Some(now), "rank 0 is due first");
    let h = hangs(&s.handle(now, Event::Tick));
    assert_eq!((h.len(), h[0].0, h[0].1.stopped), (1, 1, false), "{h:?}");
    assert_eq!(h[0].1.silent_ms, 980, "its own timeout's silence");
}

#[test]
fn a_rank_not_waiting_in_a_collective_is_hung_before_those_that_wait_there() {
    let t = Instant::now();
    // Rank 1 opened its section first and sleeps in user code; ranks 0 and 2 opened theirs
    // after it and wait for it in the all-reduce: only their stacks tell them apart.
    let mut s = three_in_step(t, [5, 5, 5], [5, 0, 20]);
    s.waiting = vec![(0, true), (1, false), (2, true)];
    let h = hangs(&s.handle(t + Duration::from_secs(1), Event::Tick));
    assert_eq!((h.len(), h[0].0), (1, 1), "{h:?}");
    // A rank that did not answer counts as not waiting: rank 1 again, though rank 2 is later.
    let mut s = three_in_step(t, [5, 5, 5], [5, 0, 20]);
    s.waiting = vec![(0, true), (2, true)];
    let h = hangs(&s.handle(t + Duration::from_secs(1), Event::Tick));
    assert_eq!(h[0].0, 1, "{h:?}");
    // Without any answer, today's rule: the silence that began last.
    let mut s = three_in_step(t, [5, 5, 5], [5, 0, 20]);
    let h = hangs(&s.handle(t + Duration::from_secs(1), Event::Tick));
    assert_eq!(h[0].0, 2, "{h:?}");
}

#[test]
fn a_rank_behind_the_others_is_hung_before_one_that_went_silent_later() {
    let t = Instant::now();
    // Rank 2 is still at step 4: the others, at step 5, wait for it, whenever it went silent.
    let mut s = three_in_step(t, [5, 5, 4], [10, 20, 0]);
    let h = hangs(&s.handle(t + Duration::from_secs(1), Event::Tick));
    assert_eq!(h[0].0, 2, "{h:?}");
}

#[test]
fn a_rank_that_spoke_well_after_the_others_went_silent_is_no_candidate() {
    let t = Instant::now();
    // Rank 1 opened its section 400 ms after the others: still going while they were stuck.
    let mut s = three_in_step(t, [5, 5, 5], [0, 400, 5]);
    let h = hangs(&s.handle(t + Duration::from_secs(1), Event::Tick));
    assert_eq!(h[0].0, 2, "{h:?}");
}

/// Node 0 of a job of 4 ranks on 2 nodes: its ranks 0 and 1 open section "step" (timeout 1 s)
/// at `t` and `t + 10 ms`.
fn node0_of_two(t: Instant) -> Supervisor {
    let mut c = cfg(2, 0);
    c.timeouts
        .sections
        .insert("step".into(), Duration::from_secs(1));
    let (mut s, _) = Supervisor::new(c);
    let placement = Placement {
        group_rank: 0,
        rank_offset: 0,
        world_size: 4,
    };
    s.handle(
        t,
        Event::Joined {
            attempt: 0,
            placement,
            max_restarts: 0,
            calculated: None,
        },
    );
    started(&mut s, t, 100);
    for lr in 0..2u32 {
        let reg = RankMsg::Register {
            rank: lr,
            local_rank: lr,
            pid: 100 + lr,
            attempt: 0,
        };
        let open = RankMsg::SectionStart {
            name: "step".into(),
        };
        let at = t + Duration::from_millis(10 * lr as u64);
        for msg in [reg, RankMsg::Progress { step: 5 }, open] {
            s.handle(
                at,
                Event::Message {
                    local_rank: lr,
                    msg,
                },
            );
        }
    }
    s
}

fn reports(actions: &[Action]) -> Vec<(u32, Vec<(u32, bool)>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Job(JobRequest::HangReport {
                round, candidates, ..
            }) => Some((
                *round,
                candidates.iter().map(|c| (c.rank, c.stopped)).collect(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn on_several_nodes_a_due_hang_waits_for_the_job_s_verdict_and_the_named_node_acts() {
    let t = Instant::now();
    let due = t + Duration::from_secs(1);
    let mut s = node0_of_two(t);
    let a = s.handle(due, Event::Tick);
    assert!(has(&a, |x| matches!(x, Action::ProbeStopped { .. })));
    let a = s.handle(
        due,
        Event::Probed {
            stopped: vec![],
            waiting: vec![],
        },
    );
    assert!(hangs(&a).is_empty(), "not alone: {a:?}");
    assert_eq!(reports(&a), vec![(0, vec![(0, false), (1, false)])]);
    // Its own request comes back: nothing more to report.
    assert!(reports(&s.handle(
        due,
        Event::HangAsked {
            attempt: 0,
            round: 0
        }
    ))
    .is_empty());
    assert!(
        s.handle(due, Event::Tick).is_empty(),
        "no probe while it waits"
    );
    // The job names rank 3, on node 1: this node waits for that node's stop.
    let hung = Some(HungRank {
        rank: 3,
        pid: 900,
        stopped: false,
    });
    let named = Event::HangNamed {
        attempt: 0,
        round: 0,
        hung,
    };
    assert!(hangs(&s.handle(due, named)).is_empty());
    let later = due + Duration::from_secs(5);
    assert!(s.handle(later, Event::Tick).is_empty());
    // Nothing came of it for long: this node decides alone.
    let late = s.next_deadline().expect("a wait");
    assert!(late > later);
    assert!(has(&s.handle(late, Event::Tick), |x| matches!(
        x,
        Action::ProbeStopped { .. }
    )));
    let h = hangs(&s.handle(
        late,
        Event::Probed {
            stopped: vec![],
            waiting: vec![],
        },
    ));
    assert_eq!(h[0].0, 1, "the local rule: {h:?}");
}

#[test]
fn the_job_s_verdict_naming_a_rank_here_declares_it_hung() {
    let t = Instant::now();
    let due = t + Duration::from_secs(1);
    let mut s = node0_of_two(t);
    s.handle(due, Event::Tick);
    s.handle(
        due,
        Event::Probed {
            stopped: vec![],
            waiting: vec![],
        },
    );
    let hung = Some(HungRank {
        rank: 0,
        pid: 100,
        stopped: false,
    });
    let a = s.handle(
        due,
        Event::HangNamed {
            attempt: 0,
            round: 0,
            hung,
        },
    );
    let h = hangs(&a);
    assert_eq!((h.len(), h[0].0), (1, 0), "{a:?}");
    // The next verdict of the attempt is round 1.
    assert!(reports(&s.handle(
        due,
        Event::HangAsked {
            attempt: 0,
            round: 0
        }
    ))
    .is_empty());
}

#[test]
fn asked_by_another_node_a_node_names_its_stopped_rank_at_once_and_reports_it() {
    let t = Instant::now();
    let mut s = node0_of_two(t);
    let now = t + Duration::from_millis(900);
    let a = s.handle(
        now,
        Event::HangAsked {
            attempt: 0,
            round: 0,
        },
    );
    assert!(
        has(&a, |x| matches!(x, Action::ProbeStopped { .. })),
        "{a:?}"
    );
    let a = s.handle(
        now,
        Event::Probed {
            stopped: vec![1],
            waiting: vec![],
        },
    );
    let h = hangs(&a);
    assert_eq!((h.len(), h[0].0, h[0].1.stopped), (1, 1, true), "{a:?}");
    assert_eq!(reports(&a), vec![(0, vec![(0, false), (1, true)])]);
}

#[test]
fn a_node_that_named_a_rank_reports_that_one_to_later_asks() {
    let t = Instant::now();
    let due = t + Duration::from_secs(1);
    let mut s = node0_of_two(t);
    s.handle(due, Event::Tick);
    let a = s.handle(
        due,
        Event::Probed {
            stopped: vec![1],
            waiting: vec![],
        },
    );
    assert_eq!(reports(&a), vec![(0, vec![(0, false), (1, true)])]);
    let hung = Some(HungRank {
        rank: 1,
        pid: 101,
        stopped: true,
    });
    let named = Event::HangNamed {
        attempt: 0,
        round: 0,
        hung,
    };
    assert!(
        hangs(&s.handle(due, named)).is_empty(),
        "named here already"
    );
    // Another node asks again (its ranks still wait): the rank named here, not a waiting one.
    let a = s.handle(
        due,
        Event::HangAsked {
            attempt: 0,
            round: 1,
        },
    );
    assert_eq!(reports(&a), vec![(1, vec![(1, true)])]);
}

#[test]
fn silence_begins_at_the_last_message_not_at_the_heartbeat_the_timeout_runs_from() {
    // As the chaos soak's job: every rank heartbeats after a step (at `t`), then opens the next
    // step's section; rank 1 opens it 20 ms after the others and is stuck. The heartbeat timeout
    // (1 s, from `t`) is every rank's first to run out.
    let t = Instant::now();
    let mut c = cfg(3, 0);
    c.timeouts.heartbeat = Some(Duration::from_secs(1));
    c.timeouts
        .sections
        .insert("step".into(), Duration::from_secs(1));
    let (mut s, _) = Solo::new(c);
    spawn_all(&mut s, t, 100);
    for lr in 0..3u32 {
        register(&mut s, t, lr);
        send(&mut s, t, lr, RankMsg::Heartbeat { step: Some(5) });
    }
    for (lr, ms) in [(0u32, 5u64), (1, 20), (2, 0)] {
        let msg = RankMsg::SectionStart {
            name: "step".into(),
        };
        send(&mut s, t + Duration::from_millis(ms), lr, msg);
    }
    let h = hangs(&s.handle(t + Duration::from_secs(1), Event::Tick));
    assert_eq!((h.len(), h[0].0), (1, 1), "{h:?}");
}

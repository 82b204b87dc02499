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
    assert!(a
        .iter()
        .any(|x| matches!(x, Action::ProbeStopped { ranks } if ranks == &[(0, 100), (1, 101)])));
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
    let a = s.handle(now, Event::Probed { stopped: vec![] });
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

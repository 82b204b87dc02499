//! Calculated timeouts: the requests, the job's value of a round, nothing learned after a hang.

use super::*;

#[test]
fn on_request_configured_timeouts_stay_until_every_rank_asks() {
    let t = Instant::now();
    let mut c = cfg(2, 0);
    c.timeouts.heartbeat = Some(Duration::from_secs(30));
    let (mut s, _) = Solo::new(c);
    spawn_all(&mut s, t, 100);
    let announce = RankMsg::CalculateTimeouts {
        heartbeat: false,
        out_of_section: false,
        all_sections: false,
        sections: vec![],
    };
    for lr in 0..2 {
        let reg = RankMsg::Register {
            rank: lr,
            local_rank: lr,
            pid: 100 + lr,
            attempt: 0,
        };
        send(&mut s, t, lr, reg);
        assert!(
            send(&mut s, t, lr, announce.clone()).is_empty(),
            "not answered"
        );
    }
    let mut now = t;
    for _ in 0..40 {
        now += Duration::from_millis(10);
        for lr in 0..2 {
            let a = send(&mut s, now, lr, RankMsg::Heartbeat { step: None });
            assert!(a.is_empty(), "nothing calculated unasked: {a:?}");
        }
    }
    assert_eq!(s.timeouts().heartbeat, Some(Duration::from_secs(30)));
    let a = send(&mut s, now, 0, calc_hb());
    assert!(a.is_empty(), "rank 1 has not asked yet: {a:?}");
    let a = send(&mut s, now, 1, calc_hb());
    assert!(a.contains(&Action::SaveTimeouts(s.timeouts().clone())));
    assert_eq!(s.timeouts().heartbeat, Some(monitor::CALC_FLOOR));
    let answer = AgentMsg::TimeoutsCalculated {
        heartbeat: true,
        sections: false,
        out_of_section: false,
    };
    for local_rank in 0..2 {
        assert!(a.contains(&Action::SendToRank {
            local_rank,
            msg: answer.clone()
        }));
    }
}

#[test]
fn nothing_is_learned_after_a_hang() {
    let t = Instant::now();
    let mut c = cfg(1, 0);
    c.timeouts.heartbeat = Some(Duration::from_secs(2));
    let (mut s, _) = Solo::new(c);
    spawn_all(&mut s, t, 100);
    let reg = RankMsg::Register {
        rank: 0,
        local_rank: 0,
        pid: 100,
        attempt: 0,
    };
    send(&mut s, t, 0, reg);
    let mut now = t;
    for _ in 0..5 {
        now += Duration::from_millis(10);
        send(&mut s, now, 0, RankMsg::Heartbeat { step: None });
    }
    let hung = now + Duration::from_secs(2);
    s.handle(hung, Event::Tick);
    // The rank wakes up after 3 s and heartbeats on while it is being stopped.
    now += Duration::from_secs(3);
    for _ in 0..20 {
        now += Duration::from_millis(10);
        let a = send(&mut s, now, 0, RankMsg::Heartbeat { step: None });
        assert!(
            !a.iter()
                .any(|x| matches!(x, Action::Job(JobRequest::ShareTimeouts { .. }))),
            "the hang's gap must not be learned: {a:?}"
        );
    }
    assert_eq!(s.timeouts().heartbeat, Some(Duration::from_secs(2)));
}

#[test]
fn multi_node_timeouts_apply_the_job_value_and_only_node_zero_saves() {
    let t = Instant::now();
    let job = Timeouts {
        heartbeat: Some(Duration::from_secs(9)),
        ..Default::default()
    };
    for node_rank in [0, 1] {
        let mut c = cfg(1, 0);
        c.node_rank = node_rank;
        c.saves_timeouts = node_rank == 0;
        c.timeouts.heartbeat = Some(Duration::from_secs(60));
        let (mut s, _) = Supervisor::new(c);
        s.handle(t, joined(0, node_rank, 0));
        let a = s.handle(
            t,
            Event::JobTimeouts {
                attempt: 0,
                round: 0,
                timeouts: job.clone(),
            },
        );
        assert_eq!(s.timeouts().heartbeat, Some(Duration::from_secs(9)));
        assert_eq!(
            a.contains(&Action::SaveTimeouts(job.clone())),
            node_rank == 0
        );
        assert!(a.contains(&Action::SendToAll(s.timeouts().to_msg())));
    }
}

/// A rank of `s` registers and heartbeats 20 times, 10 ms apart, from `t`: enough to calculate.
fn beats(s: &mut Supervisor, t: Instant) -> Vec<Action> {
    let reg = RankMsg::Register {
        rank: 0,
        local_rank: 0,
        pid: 100,
        attempt: 0,
    };
    let mut out = s.handle(
        t,
        Event::Message {
            local_rank: 0,
            msg: reg,
        },
    );
    for i in 0..20u64 {
        let msg = RankMsg::Heartbeat { step: Some(i) };
        let at = t + Duration::from_millis(10 * i);
        out.extend(s.handle(at, Event::Message { local_rank: 0, msg }));
    }
    out
}

#[test]
fn vigil_calculates_on_its_own_only_when_asked_to() {
    let t = Instant::now();
    for calculates in [false, true] {
        let mut c = cfg(1, 0);
        c.timeouts.heartbeat = Some(Duration::from_secs(60));
        c.calculates = calculates;
        let (mut s, _) = Supervisor::new(c);
        s.handle(t, joined(0, 0, 0));
        started(&mut s, t, 100);
        let shared = beats(&mut s, t)
            .iter()
            .any(|a| matches!(a, Action::Job(JobRequest::ShareTimeouts { round: 0, .. })));
        assert_eq!(shared, calculates, "--calculate-timeouts: {calculates}");
    }
}

//! Several nodes: joins, the job's verdicts, lost coordination, standbys. The coordination
//! events are driven by hand, as the store would deliver them.

use super::*;

#[test]
fn multi_node_requests_are_answered_with_the_job_value_of_their_round() {
    let t = Instant::now();
    let (mut s, _) = node(1, 1, 0);
    s.handle(t, joined(0, 1, 0));
    started(&mut s, t, 300);
    let reg = RankMsg::Register {
        rank: 1,
        local_rank: 0,
        pid: 300,
        attempt: 0,
    };
    let msg = |m: RankMsg| Event::Message {
        local_rank: 0,
        msg: m,
    };
    s.handle(t, msg(reg));
    for i in 1..=3 {
        s.handle(
            t + Duration::from_millis(100 * i),
            msg(RankMsg::Heartbeat { step: None }),
        );
    }
    let a = s.handle(t + Duration::from_millis(300), msg(calc_hb()));
    let shared = a.iter().find_map(|x| match x {
        Action::Job(JobRequest::ShareTimeouts {
            attempt: 0,
            round,
            timeouts,
        }) => Some((*round, timeouts.clone())),
        _ => None,
    });
    let (round, mine) = shared.expect("this node shares its calculation");
    assert_eq!(
        round, 1,
        "requests count from round 1; round 0 is vigil's own"
    );
    assert!(mine.heartbeat.is_some());
    let job = Timeouts {
        initial: Some(Duration::from_secs(40)),
        heartbeat: Some(Duration::from_secs(9)),
        ..Default::default()
    };
    let stale = s.handle(
        t,
        Event::JobTimeouts {
            attempt: 0,
            round: 7,
            timeouts: job.clone(),
        },
    );
    assert!(stale.is_empty(), "another round's result is not this one's");
    let a = s.handle(
        t,
        Event::JobTimeouts {
            attempt: 0,
            round: 1,
            timeouts: job.clone(),
        },
    );
    assert_eq!(
        s.timeouts(),
        &job,
        "the job's maximum over nodes is in force"
    );
    assert!(
        !has(&a, |x| matches!(x, Action::SaveTimeouts(_))),
        "node rank 0 saves"
    );
    assert!(a.contains(&Action::SendToRank {
        local_rank: 0,
        msg: AgentMsg::TimeoutsCalculated {
            heartbeat: true,
            sections: false,
            out_of_section: false
        }
    }));
}

#[test]
fn multi_node_ranks_start_only_once_every_node_joined() {
    let t = Instant::now();
    let (mut s, first) = node(1, 2, 3);
    assert!(spawns(&first).is_empty());
    assert!(first.contains(&Action::Job(JobRequest::Join {
        attempt: 0,
        calculated: None
    })));
    // The job's budget and this node's global ranks come from the rendezvous.
    let a = s.handle(t, joined(0, 6, 1));
    assert_eq!(spawns(&a), vec![0]);
    assert_eq!(s.max_restarts(), 1);
    let a = s.handle(
        t,
        Event::RankSpawned {
            local_rank: 1,
            pid: 50,
        },
    );
    assert!(a.contains(&Action::Record(Record::RankStarted {
        attempt: 0,
        local_rank: 1,
        rank: 7,
        pid: 50
    })));
    // A Joined for another attempt is not ours.
    assert!(spawns(&s.handle(t, joined(5, 0, 1))).is_empty());
}

#[test]
fn multi_node_local_failure_is_reported_and_the_verdict_decides() {
    let t = Instant::now();
    let (mut s, _) = node(1, 2, 1);
    s.handle(t, joined(0, 2, 1));
    started(&mut s, t, 10);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 11,
            how: ExitKind::Code(4),
        },
    );
    let reported = a.iter().find_map(|x| match x {
        Action::Job(JobRequest::ReportEnd { attempt: 0, end }) => Some(end.clone()),
        _ => None,
    });
    assert_eq!(
        reported,
        Some(JobEnd::Failed {
            node: 1,
            reason: "rank 3 exited with code 4".into()
        })
    );
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 10,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    // Every local rank is down, but the job's verdict has not come: no decision yet.
    assert!(!has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::Join { .. }) | Action::Finish(_)
    )));
    let a = s.handle(
        t,
        Event::AttemptEnded {
            attempt: 0,
            end: reported.unwrap(),
        },
    );
    assert!(a.contains(&Action::Job(JobRequest::Join {
        attempt: 1,
        calculated: None
    })));
    assert_eq!(s.attempt(), 1);
}

#[test]
fn multi_node_peer_failure_stops_ours_without_counting_them_as_failures() {
    let t = Instant::now();
    let (mut s, _) = node(0, 2, 0);
    s.handle(t, joined(0, 0, 0));
    started(&mut s, t, 10);
    let end = JobEnd::Failed {
        node: 3,
        reason: "rank 9 hung".into(),
    };
    let a = s.handle(t, Event::AttemptEnded { attempt: 0, end });
    assert_eq!(signals(&a), vec![(vec![10, 11], SIGTERM)]);
    assert!(!has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::ReportEnd { .. })
    )));
    s.handle(
        t,
        Event::Reaped {
            pid: 10,
            how: ExitKind::Code(1),
        },
    );
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 11,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    assert!(s.failures().is_empty());
    // Budget 0: the job failed; nobody else needs poisoning, every node got the same verdict.
    assert_eq!(finish(&a), Some(&Outcome::Failed { restarts: 0 }));
    assert!(a.contains(&Action::Job(JobRequest::Leave {
        poison: None,
        highest_step: None
    })));
}

#[test]
fn multi_node_done_here_waits_for_the_others() {
    let t = Instant::now();
    let (mut s, _) = node(1, 1, 2);
    s.handle(t, joined(0, 1, 2));
    started(&mut s, t, 10);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 10,
            how: ExitKind::Code(0),
        },
    );
    assert!(a.contains(&Action::Job(JobRequest::ReportDone { attempt: 0 })));
    assert!(finish(&a).is_none());
    // Another node failed after ours finished: this node restarts with the job.
    let failed = JobEnd::Failed {
        node: 0,
        reason: "x".into(),
    };
    let a = s.handle(
        t,
        Event::AttemptEnded {
            attempt: 0,
            end: failed,
        },
    );
    assert!(a.contains(&Action::Job(JobRequest::Join {
        attempt: 1,
        calculated: None
    })));
    s.handle(t, joined(1, 1, 2));
    started(&mut s, t, 20);
    s.handle(
        t,
        Event::Reaped {
            pid: 20,
            how: ExitKind::Code(0),
        },
    );
    let a = s.handle(
        t,
        Event::AttemptEnded {
            attempt: 1,
            end: JobEnd::Done,
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Succeeded));
}

#[test]
fn multi_node_signal_stops_everyone_for_good() {
    let t = Instant::now();
    let (mut s, _) = node(2, 1, 5);
    s.handle(t, joined(0, 2, 5));
    started(&mut s, t, 10);
    let a = s.handle(t, signal(&s, SIGTERM));
    let stopped = JobEnd::Stopped {
        node: 2,
        reason: "node 2 received SIGTERM".into(),
        exit_code: 143,
    };
    assert!(a.contains(&Action::Job(JobRequest::ReportEnd {
        attempt: 0,
        end: stopped.clone()
    })));
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 10,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Signaled { signal: SIGTERM }));
    assert!(a.contains(&Action::Job(JobRequest::Leave {
        poison: Some((0, stopped)),
        highest_step: None
    })));
    // Another node learns of it, even while joining, and ends with the same status.
    let (mut other, _) = node(0, 1, 5);
    let a = other.handle(
        t,
        Event::AttemptEnded {
            attempt: 0,
            end: JobEnd::Stopped {
                node: 2,
                reason: "r".into(),
                exit_code: 143,
            },
        },
    );
    assert_eq!(finish(&a).map(Outcome::exit_code), Some(143));
}

#[test]
fn multi_node_lost_coordination_ends_with_the_requeue_status() {
    let t = Instant::now();
    let (mut s, _) = node(1, 2, 5);
    s.handle(t, joined(0, 2, 5));
    started(&mut s, t, 10);
    let a = s.handle(
        t,
        Event::CoordinationLost {
            reason: "gone".into(),
            requeue: true,
        },
    );
    assert_eq!(signals(&a), vec![(vec![10, 11], SIGTERM)]);
    s.handle(
        t,
        Event::Reaped {
            pid: 10,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 11,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    let o = finish(&a).unwrap();
    assert_eq!(o.exit_code(), EXIT_LOST);
    assert!(!has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::Join { .. })
    )));
    // Refused before joining (a node rank taken twice): bad input, not a requeue.
    let (mut r, _) = node(1, 1, 0);
    let a = r.handle(
        t,
        Event::CoordinationLost {
            reason: "taken".into(),
            requeue: false,
        },
    );
    assert_eq!(finish(&a).map(Outcome::exit_code), Some(2));
}

#[test]
fn a_verdict_on_the_next_attempt_reaches_a_node_heading_for_it() {
    // Node 0 restarts after attempt 0 failed; node 1 left the job and poisoned attempt 1.
    let t = Instant::now();
    let (mut s, _) = node(0, 1, 3);
    s.handle(t, joined(0, 0, 3));
    started(&mut s, t, 100);
    s.handle(
        t,
        Event::AttemptEnded {
            attempt: 0,
            end: JobEnd::Failed {
                node: 1,
                reason: "x".into(),
            },
        },
    );
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    assert!(has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::Join { attempt: 1, .. })
    )));
    let lost = JobEnd::Lost {
        reason: "node 1 left".into(),
        node: Some(1),
    };
    let a = s.handle(
        t,
        Event::AttemptEnded {
            attempt: 1,
            end: lost,
        },
    );
    assert!(matches!(finish(&a), Some(Outcome::Lost { .. })), "{a:?}");
}

#[test]
fn a_standby_runs_no_ranks_follows_the_jobs_verdicts_and_ends_with_the_job() {
    let t = Instant::now();
    let (mut s, first) = node(2, 2, 3);
    assert!(has(&first, |x| matches!(
        x,
        Action::Job(JobRequest::Join { attempt: 0, .. })
    )));
    let a = s.handle(t, Event::Standby { attempt: 0 });
    assert!(has(&a, |x| matches!(
        x,
        Action::Record(Record::Standby { attempt: 0 })
    )));
    assert!(!has(&a, |x| matches!(x, Action::SpawnAttempt { .. })));
    assert!(!has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::ReportDone { .. })
    )));
    // Another node failed: every node, the standby too, goes to the next attempt.
    let a = s.handle(
        t,
        Event::AttemptEnded {
            attempt: 0,
            end: JobEnd::Failed {
                node: 1,
                reason: "lost".into(),
            },
        },
    );
    assert!(
        has(&a, |x| matches!(
            x,
            Action::Job(JobRequest::Join { attempt: 1, .. })
        )),
        "{a:?}"
    );
    // Promoted in attempt 1: it runs ranks.
    let a = s.handle(t, joined(1, 2, 3));
    assert!(has(&a, |x| matches!(
        x,
        Action::SpawnAttempt { attempt: 1, .. }
    )));
    started(&mut s, t, 40);
    for pid in [40, 41] {
        s.handle(
            t,
            Event::Reaped {
                pid,
                how: ExitKind::Code(0),
            },
        );
    }
    let a = s.handle(
        t,
        Event::AttemptEnded {
            attempt: 1,
            end: JobEnd::Done,
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Succeeded));
}

#[test]
fn a_standby_when_the_job_finishes_finishes_too() {
    let t = Instant::now();
    let (mut s, _) = node(2, 2, 0);
    s.handle(t, Event::Standby { attempt: 0 });
    let a = s.handle(
        t,
        Event::AttemptEnded {
            attempt: 0,
            end: JobEnd::Done,
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Succeeded));
}

//! In-process restarts: a failed rank replaced alone, and when the whole job restarts instead.

use super::*;
use generation::InProcessConfig;

fn in_process(nproc: u32, restarts: u32) -> SupervisorConfig {
    SupervisorConfig {
        in_process: InProcessConfig {
            restarts,
            abort_timeout: Duration::from_secs(10),
        },
        ..cfg(nproc, 1)
    }
}

fn register(s: &mut Solo, now: Instant, lr: u32, generation: u64) -> Vec<Action> {
    let reg = RankMsg::Register {
        rank: lr,
        local_rank: lr,
        pid: 100 + lr,
        attempt: 0,
    };
    let mut out = send(s, now, lr, reg);
    out.extend(send(s, now, lr, RankMsg::Restartable { generation }));
    out
}

/// Three restartable ranks of one node; local rank 1 (pid 101) is killed.
fn started(restarts: u32) -> (Solo, Instant) {
    let t0 = Instant::now();
    let (mut s, _) = Solo::new(in_process(3, restarts));
    spawn_all(&mut s, t0, 100);
    for lr in 0..3 {
        register(&mut s, t0, lr, 0);
    }
    (s, t0)
}

fn kill_rank_1(s: &mut Solo, at: Instant, pid: i32) -> Vec<Action> {
    let how = ExitKind::Signal(SIGKILL);
    s.handle(at, Event::Reaped { pid, how })
}

fn spawned_again(out: &[Action]) -> Option<u64> {
    out.iter().find_map(|a| match a {
        Action::SpawnRank {
            local_rank: 1,
            generation,
            replaced,
            ..
        } if replaced == &vec![1] => Some(*generation),
        _ => None,
    })
}

/// The attempt is being stopped for a whole restart: the failure is reported to the job.
fn whole_restart(out: &[Action]) -> bool {
    out.iter()
        .any(|a| matches!(a, Action::Job(JobRequest::ReportEnd { attempt: 0, .. })))
}

#[test]
fn a_failed_rank_is_replaced_alone_and_the_others_are_told() {
    let (mut s, t0) = started(2);
    let t1 = t0 + Duration::from_secs(5);
    let out = kill_rank_1(&mut s, t1, 101);
    assert_eq!(spawned_again(&out), Some(1));
    assert!(out.contains(&Action::SendToAll(AgentMsg::Generation {
        generation: 1,
        replaced: vec![1]
    })));
    assert!(!out.iter().any(|a| matches!(a, Action::SpawnAttempt { .. })));
    assert!(!whole_restart(&out));
    assert!(s.failures().is_empty());
    assert_eq!(s.generation(), 1);
    // The survivors come back and the replacement registers: the generation is recovered.
    s.handle(
        t1,
        Event::RankSpawned {
            local_rank: 1,
            pid: 201,
        },
    );
    send(&mut s, t1, 0, RankMsg::Restartable { generation: 1 });
    send(&mut s, t1, 2, RankMsg::Restartable { generation: 1 });
    let t2 = t1 + Duration::from_secs(2);
    let out = register(&mut s, t2, 1, 1);
    assert!(out.iter().any(|a| matches!(
        a,
        Action::Record(Record::GenerationRecovered { generation: 1, seconds, .. }) if *seconds == 2.0
    )));
    // Once every rank reported a step of generation 1, the job trains again.
    let step = |s: &mut Solo, at, lr| send(s, at, lr, RankMsg::Heartbeat { step: Some(31) });
    let stepping = |out: &[Action]| {
        out.iter().find_map(|a| match a {
            Action::Record(Record::GenerationStepping {
                generation: 1,
                seconds,
                ..
            }) => Some(*seconds),
            _ => None,
        })
    };
    assert_eq!(stepping(&step(&mut s, t2, 0)), None);
    assert_eq!(stepping(&step(&mut s, t2, 2)), None);
    let t3 = t1 + Duration::from_secs(3);
    assert_eq!(stepping(&step(&mut s, t3, 1)), Some(3.0));
    // A second failure later is recovered again, with the new pid.
    let out = kill_rank_1(&mut s, t3, 201);
    assert_eq!(spawned_again(&out), Some(2));
}

#[test]
fn a_survivor_overdue_past_the_abort_timeout_restarts_the_whole_job() {
    let (mut s, t0) = started(2);
    kill_rank_1(&mut s, t0, 101);
    s.handle(
        t0,
        Event::RankSpawned {
            local_rank: 1,
            pid: 201,
        },
    );
    send(&mut s, t0, 0, RankMsg::Restartable { generation: 1 });
    assert_eq!(s.next_deadline(), Some(t0 + Duration::from_secs(10)));
    let out = s.handle(t0 + Duration::from_secs(10), Event::Tick);
    assert!(out.iter().any(|a| matches!(
        a,
        Action::Record(Record::InProcessDeclined { reason, .. }) if reason.contains("rank 2 did not come back")
    )));
    assert!(whole_restart(&out));
}

#[test]
fn a_second_failure_during_recovery_or_none_left_restarts_the_whole_job() {
    let (mut s, t0) = started(2);
    kill_rank_1(&mut s, t0, 101);
    let how = ExitKind::Code(1);
    let out = s.handle(t0, Event::Reaped { pid: 100, how });
    assert!(out.iter().any(|a| matches!(
        a,
        Action::Record(Record::InProcessDeclined { reason, .. }) if reason.contains("being recovered")
    )));
    assert!(whole_restart(&out));

    let (mut s, t0) = started(0);
    let out = kill_rank_1(&mut s, t0, 101);
    assert_eq!(spawned_again(&out), None);
    assert!(whole_restart(&out));
    assert!(!out
        .iter()
        .any(|a| matches!(a, Action::Record(Record::InProcessDeclined { .. }))));
}

#[test]
fn a_rank_not_under_restartable_makes_the_job_restart_whole() {
    let t0 = Instant::now();
    let (mut s, _) = Solo::new(in_process(2, 3));
    spawn_all(&mut s, t0, 100);
    register(&mut s, t0, 0, 0);
    let out = kill_rank_1(&mut s, t0, 101);
    assert_eq!(spawned_again(&out), None);
    assert!(out.iter().any(|a| matches!(
        a,
        Action::Record(Record::InProcessDeclined { reason, .. }) if reason.contains("local rank 1 does not run")
    )));
}

#[test]
fn a_hung_rank_is_killed_and_its_exit_replaces_it() {
    let t0 = Instant::now();
    let (mut s, _) = Solo::new(SupervisorConfig {
        timeouts: monitor::Timeouts {
            heartbeat: Some(Duration::from_secs(5)),
            ..Default::default()
        },
        ..in_process(3, 2)
    });
    spawn_all(&mut s, t0, 100);
    for lr in 0..3 {
        register(&mut s, t0, lr, 0);
        send(&mut s, t0, lr, RankMsg::Heartbeat { step: Some(1) });
    }
    let t1 = t0 + Duration::from_secs(3);
    for lr in [0, 2] {
        send(&mut s, t1, lr, RankMsg::Heartbeat { step: Some(2) });
    }
    s.stopped = vec![1];
    let t2 = t0 + Duration::from_secs(6);
    s.handle(t2, Event::Tick);
    let out = s.handle(t2, Event::StacksCaptured { local_rank: 1 });
    assert!(out.contains(&Action::SignalGroups {
        pgids: vec![101],
        signal: SIGKILL
    }));
    assert!(!out
        .iter()
        .any(|a| matches!(a, Action::Job(JobRequest::ReportEnd { .. }))));
    let out = kill_rank_1(&mut s, t2, 101);
    assert_eq!(spawned_again(&out), Some(1));
}

fn heard(s: &mut Solo, at: Instant, generation: u64, replaced: Option<Vec<u32>>) -> Vec<Action> {
    let ev = Event::GenerationBegun {
        attempt: 0,
        generation,
        replaced,
    };
    s.handle(at, ev)
}

fn told(out: &[Action]) -> Option<(u64, Vec<u32>)> {
    out.iter().find_map(|a| match a {
        Action::SendToAll(AgentMsg::Generation {
            generation,
            replaced,
        }) => Some((*generation, replaced.clone())),
        _ => None,
    })
}

#[test]
fn a_generation_begun_on_another_node_is_followed_by_every_rank_here() {
    let (mut s, t0) = started(5);
    let t1 = t0 + Duration::from_secs(1);
    let out = heard(&mut s, t1, 1, Some(vec![7]));
    assert_eq!(told(&out), Some((1, vec![7])), "{out:?}");
    assert!(!whole_restart(&out), "{out:?}");
    assert!(!out.iter().any(|a| matches!(a, Action::SpawnRank { .. })));
    // Its own record comes back as an echo: nothing more.
    assert!(heard(&mut s, t1, 1, Some(vec![7])).is_empty());
    // Every rank here back in its wrapper completes the recovery on this node.
    let mut out = Vec::new();
    for lr in 0..3 {
        out.extend(send(&mut s, t1, lr, RankMsg::Restartable { generation: 1 }));
    }
    assert!(
        out.iter().any(|a| matches!(
            a,
            Action::Record(Record::GenerationRecovered { generation: 1, .. })
        )),
        "{out:?}"
    );
}

#[test]
fn a_generation_this_node_cannot_follow_restarts_the_whole_job() {
    // Two generations begun at once: the one that lost hears the other's.
    let (mut s, t0) = started(5);
    let out = kill_rank_1(&mut s, t0, 101);
    assert_eq!(spawned_again(&out), Some(1));
    let out = heard(&mut s, t0, 1, Some(vec![7]));
    assert!(whole_restart(&out), "{out:?}");
    // A record that cannot be read.
    let (mut s, t0) = started(5);
    assert!(whole_restart(&heard(&mut s, t0, 1, None)));
    // A rank here that never said it is restartable.
    let t0 = Instant::now();
    let (mut s, _) = Solo::new(in_process(2, 5));
    spawn_all(&mut s, t0, 100);
    register(&mut s, t0, 0, 0);
    let out = heard(&mut s, t0, 1, Some(vec![7]));
    assert!(whole_restart(&out), "{out:?}");
    assert_eq!(told(&out), None);
}

#[test]
fn a_stop_asked_while_a_generation_is_recovered_is_taken_at_once() {
    // docs/reliability.md violation 10: no rank can reach a stop step while the generation's
    // survivors are not back in their wrappers, so the node stops now (its ranks SIGKILLed: they
    // hold SIGTERM and have nothing to save) and the stop is the job's end at once.
    let (mut s, t0) = started(5);
    // They call `vigil.should_stop(step)`: they report steps and hold the stop signals.
    for lr in 0..3 {
        send(&mut s, t0, lr, RankMsg::Progress { step: 9 });
        send(&mut s, t0, lr, held());
    }
    let out = kill_rank_1(&mut s, t0, 101);
    assert_eq!(spawned_again(&out), Some(1));
    let t1 = t0 + Duration::from_secs(1);
    let out = s.handle(
        t1,
        Event::StopAsked {
            attempt: 0,
            trigger: "SIGTERM".into(),
        },
    );
    assert!(
        signals(&out).iter().any(|(_, sig)| *sig == SIGKILL),
        "{out:?}"
    );
    assert!(
        has(&out, |a| matches!(
            a,
            Action::Job(JobRequest::ReportEnd {
                attempt: 0,
                end: JobEnd::Stopped { .. },
            })
        )),
        "{out:?}"
    );
}

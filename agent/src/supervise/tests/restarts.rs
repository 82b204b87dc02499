//! Restarts and the verdict on an attempt: success, failure, the budget, back-off, progress.

use super::*;

#[test]
fn starts_attempt_zero() {
    let (_, actions) = Solo::new(cfg(2, 0));
    assert_eq!(spawns(&actions), vec![0]);
}

#[test]
fn all_ranks_zero_is_success() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 3));
    spawn_all(&mut s, t, 100);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(0),
        },
    );
    assert!(finish(&a).is_none());
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Code(0),
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Succeeded));
    assert!(a.contains(&Action::ReapGroups {
        pgids: vec![100, 101]
    }));
    assert!(s.is_finished());
}

#[test]
fn failure_stops_others_then_restarts_with_next_attempt() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(3, 1));
    spawn_all(&mut s, t, 100);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Code(3),
        },
    );
    assert_eq!(signals(&a), vec![(vec![100, 102], SIGTERM)]);
    assert_eq!(s.next_deadline(), Some(t + Duration::from_secs(15)));
    assert_eq!(s.failures()[0].local_rank, 1);
    // The ranks we stopped are not failures.
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
            pid: 102,
            how: ExitKind::Code(1),
        },
    );
    assert_eq!(spawns(&a), vec![1]);
    assert_eq!(s.attempt(), 1);
    assert!(s.failures().is_empty());
    assert_eq!(s.next_deadline(), None);
}

#[test]
fn budget_spent_fails_with_root_cause() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(1, 1));
    spawn_all(&mut s, t, 10);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 10,
            how: ExitKind::Code(1),
        },
    );
    assert_eq!(spawns(&a), vec![1]);
    spawn_all(&mut s, t, 20);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 20,
            how: ExitKind::Signal(libc::SIGSEGV),
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Failed { restarts: 1 }));
    assert_eq!(s.failures()[0].how, Some(ExitKind::Signal(libc::SIGSEGV)));
    assert_eq!(finish(&a).unwrap().exit_code(), 1);
}

#[test]
fn rank_ignoring_sigterm_is_killed_at_deadline() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 0));
    spawn_all(&mut s, t, 100);
    s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(1),
        },
    );
    let early = s.handle(t + Duration::from_secs(14), Event::Tick);
    assert!(signals(&early).is_empty());
    let a = s.handle(t + Duration::from_secs(15), Event::Tick);
    assert_eq!(signals(&a), vec![(vec![101], SIGKILL)]);
    assert_eq!(s.next_deadline(), None);
    let a = s.handle(
        t + Duration::from_secs(15),
        Event::Reaped {
            pid: 101,
            how: ExitKind::Signal(SIGKILL),
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Failed { restarts: 0 }));
}

#[test]
fn spawn_failure_stops_started_ranks_and_never_restarts() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 5));
    s.handle(
        t,
        Event::RankSpawned {
            local_rank: 0,
            pid: 100,
        },
    );
    let a = s.handle(
        t,
        Event::SpawnFailed {
            local_rank: 1,
            error: "no such file".into(),
        },
    );
    assert_eq!(signals(&a), vec![(vec![100], SIGTERM)]);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Signal(SIGTERM),
        },
    );
    let o = finish(&a).unwrap();
    assert_eq!(o.exit_code(), 2);
    assert!(spawns(&a).is_empty());
}

#[test]
fn orphans_and_unknown_pids_are_ignored() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(1, 0));
    spawn_all(&mut s, t, 100);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 4242,
            how: ExitKind::Code(1),
        },
    );
    assert!(a.is_empty());
}

#[test]
fn rank_spawned_during_stop_is_signalled() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 0));
    s.handle(
        t,
        Event::RankSpawned {
            local_rank: 0,
            pid: 100,
        },
    );
    s.handle(t, signal(&s, SIGTERM));
    let a = s.handle(
        t,
        Event::RankSpawned {
            local_rank: 1,
            pid: 101,
        },
    );
    assert_eq!(signals(&a), vec![(vec![101], SIGTERM)]);
}

const B: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(30),
    reset_after: Duration::from_secs(300),
};

#[test]
fn backoff_is_immediate_first_then_doubles_to_the_cap() {
    let quick = Duration::from_millis(10);
    let mut streak = 0;
    let mut waits = Vec::new();
    for _ in 0..8 {
        let (w, s) = B.next(streak, quick, false);
        waits.push(w.as_secs());
        streak = s;
    }
    assert_eq!(waits, vec![0, 1, 2, 4, 8, 16, 30, 30]);
    // A long attempt starts a new streak: immediate again, then the base.
    let (w, s) = B.next(streak, Duration::from_secs(300), false);
    assert_eq!((w, s), (Duration::ZERO, 1));
    assert_eq!(B.next(s, quick, false).0, Duration::from_secs(1));
    assert_eq!(Backoff::OFF.next(7, quick, false).0, Duration::ZERO);
    // An attempt that made progress starts a new streak too, however short it was.
    let (w, s) = B.next(5, quick, true);
    assert_eq!((w, s), (Duration::ZERO, 1));
    assert_eq!(B.next(s, quick, false).0, Duration::from_secs(1));
}

/// Attempt `attempt` (pids from `base`) steps from `from` to `to` and, when `save` is given, saves a
/// checkpoint at that step; then its rank fails. The restart's back-off.
fn attempt_with(s: &mut Solo, base: i32, steps: (u64, u64), save: Option<u64>) -> u64 {
    // After the last back-off, if any.
    let t = s.next_deadline().unwrap_or_else(Instant::now);
    s.handle(t, Event::Tick);
    spawn_all(s, t, base);
    for step in steps.0..=steps.1 {
        send(s, t, 0, RankMsg::Heartbeat { step: Some(step) });
        if save == Some(step) {
            let name = "checkpointing".to_string();
            send(s, t, 0, RankMsg::SectionStart { name: name.clone() });
            send(s, t, 0, RankMsg::SectionEnd { name });
        }
    }
    let a = fail_at(s, t + Duration::from_millis(1), base);
    restart_waits(&a)[0]
}

#[test]
fn the_backoff_grows_only_for_attempts_that_failed_without_progress() {
    let (mut s, _) = Solo::new(SupervisorConfig {
        backoff: B,
        ..cfg(1, 10)
    });
    // Without checkpoints: every attempt gets 50 steps past the best, so never a wait (before:
    // 0, 1, 2, 4 s).
    let waits: Vec<u64> = (0..4)
        .map(|i| {
            attempt_with(
                &mut s,
                10 * (i + 1),
                (i as u64 * 40, i as u64 * 40 + 90),
                None,
            )
        })
        .collect();
    assert_eq!(waits, vec![0, 0, 0, 0]);
    // An attempt that dies before a new step: the streak grows (the first restart after progress
    // waits the base); a step of jitter is not progress either (--min-progress-steps, 10 by
    // default); 20 steps past the best are.
    let best = 3 * 40 + 90;
    assert_eq!(attempt_with(&mut s, 50, (0, 0), None), 1000);
    assert_eq!(attempt_with(&mut s, 60, (best - 5, best + 1), None), 2000);
    assert_eq!(attempt_with(&mut s, 70, (best, best + 20), None), 0);
    assert_eq!(s.attempt(), 7);
}

#[test]
fn with_checkpoints_progress_is_a_checkpoint_past_the_last() {
    let (mut s, _) = Solo::new(SupervisorConfig {
        backoff: B,
        ..cfg(1, 10)
    });
    // Saves at 100, 200: progress each time.
    assert_eq!(attempt_with(&mut s, 10, (0, 150), Some(100)), 0);
    assert_eq!(attempt_with(&mut s, 20, (101, 250), Some(200)), 0);
    // New steps but no checkpoint past 200: redone work, the streak grows.
    assert_eq!(attempt_with(&mut s, 30, (201, 290), None), 1000);
    assert_eq!(attempt_with(&mut s, 40, (201, 295), None), 2000);
    assert_eq!(attempt_with(&mut s, 50, (201, 350), Some(300)), 0);
}

/// Fails the one rank of the current attempt at `t` (the verdict comes back at once).
fn fail_at(s: &mut Solo, t: Instant, pid: i32) -> Vec<Action> {
    s.handle(
        t,
        Event::Reaped {
            pid,
            how: ExitKind::Code(1),
        },
    )
}

fn restart_waits(actions: &[Action]) -> Vec<u64> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Record(Record::Restart { backoff_ms, .. }) => Some(*backoff_ms),
            _ => None,
        })
        .collect()
}

#[test]
fn restarts_back_off_through_next_deadline() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(SupervisorConfig {
        backoff: B,
        ..cfg(1, 10)
    });
    spawn_all(&mut s, t, 10);
    let a = fail_at(&mut s, t, 10);
    assert_eq!((restart_waits(&a), spawns(&a)), (vec![0], vec![1]));
    spawn_all(&mut s, t, 20);
    let failed = t + Duration::from_secs(1);
    let a = fail_at(&mut s, failed, 20);
    assert_eq!((restart_waits(&a), spawns(&a)), (vec![1000], vec![]));
    let until = failed + Duration::from_secs(1);
    assert_eq!(s.next_deadline(), Some(until));
    let early = s.handle(until - Duration::from_millis(1), Event::Tick);
    assert!(spawns(&early).is_empty());
    assert_eq!(spawns(&s.handle(until, Event::Tick)), vec![2]);
    assert_eq!(s.attempt(), 2);
}

#[test]
fn a_signal_during_a_backoff_ends_the_agent() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(SupervisorConfig {
        backoff: B,
        ..cfg(1, 10)
    });
    spawn_all(&mut s, t, 10);
    fail_at(&mut s, t, 10);
    spawn_all(&mut s, t, 20);
    fail_at(&mut s, t, 20);
    assert!(s.next_deadline().is_some());
    let a = s.handle(t, signal(&s, SIGTERM));
    assert_eq!(finish(&a), Some(&Outcome::Signaled { signal: SIGTERM }));
    assert!(spawns(&a).is_empty());
    assert_eq!(s.next_deadline(), None);
}

#[test]
fn lost_coordination_during_a_backoff_ends_the_agent() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(SupervisorConfig {
        backoff: B,
        ..cfg(1, 10)
    });
    spawn_all(&mut s, t, 10);
    fail_at(&mut s, t, 10);
    spawn_all(&mut s, t, 20);
    fail_at(&mut s, t, 20);
    let a = s.handle(
        t,
        Event::CoordinationLost {
            reason: "gone".into(),
            requeue: true,
        },
    );
    assert!(matches!(finish(&a), Some(Outcome::Lost { .. })));
}

proptest::proptest! {
    /// The first restart of a streak never waits; no wait exceeds the cap; within a streak
    /// waits never shrink; a long attempt always restarts at once.
    #[test]
    fn backoff_bounds(
        base_ms in 0u64..5_000,
        cap_ms in 0u64..60_000,
        reset_ms in 0u64..600_000,
        rans in proptest::collection::vec((0u64..700_000, proptest::bool::ANY), 1..40),
    ) {
        let b = Backoff {
            base: Duration::from_millis(base_ms),
            cap: Duration::from_millis(cap_ms),
            reset_after: Duration::from_millis(reset_ms),
        };
        let mut streak = 0;
        let mut last = Duration::ZERO;
        for (ran, progressed) in rans {
            let ran = Duration::from_millis(ran);
            let (w, next) = b.next(streak, ran, progressed);
            proptest::prop_assert!(w <= b.cap);
            if streak == 0 || ran >= b.reset_after || progressed {
                proptest::prop_assert_eq!(w, Duration::ZERO);
                proptest::prop_assert_eq!(next, 1);
            } else {
                proptest::prop_assert!(w >= last);
                proptest::prop_assert!(w <= b.base.saturating_mul(1 << (streak - 1).min(31)));
            }
            last = w;
            streak = next;
        }
    }

    /// Whatever order ranks exit in, the supervisor ends exactly once, restarts at most
    /// `max_restarts` times and only ever signals pids of its own attempt.
    #[test]
    fn ends_once_within_budget(
        nproc in 1u32..5,
        max_restarts in 0u32..4,
        codes in proptest::collection::vec(0i32..3, 1..60),
    ) {
        let t = Instant::now();
        let (mut s, _) = Solo::new(cfg(nproc, max_restarts));
        let mut base = 1000;
        spawn_all(&mut s, t, base);
        let mut finishes = 0;
        let mut restarts = 0;
        for (i, code) in codes.iter().enumerate() {
            if s.is_finished() { break; }
            let lr = (i as u32) % nproc;
            let pid = base + lr as i32;
            let a = s.handle(t, Event::Reaped { pid, how: ExitKind::Code(*code) });
            for (pgids, _) in signals(&a) {
                for p in pgids { proptest::prop_assert!(p >= base && p < base + nproc as i32); }
            }
            if finish(&a).is_some() { finishes += 1; }
            if !spawns(&a).is_empty() {
                restarts += 1;
                base += 100;
                spawn_all(&mut s, t, base);
            }
        }
        proptest::prop_assert!(finishes <= 1);
        proptest::prop_assert!(restarts <= max_restarts);
    }
}

#[test]
fn attempts_that_stop_making_progress_are_not_restarted() {
    let t = Instant::now();
    let mut c = cfg(1, 10);
    c.no_progress = Some((2, 1));
    let (mut s, _) = Solo::new(c);
    let mut base = 100;
    let mut current = |s: &mut Solo, reached: u64| {
        spawn_all(s, t, base);
        register(s, t, 0);
        send(s, t, 0, RankMsg::Progress { step: reached });
        let a = s.handle(
            t,
            Event::Reaped {
                pid: base,
                how: ExitKind::Code(1),
            },
        );
        base += 10;
        a
    };
    // Progress, then none twice: the second time without progress ends the job.
    assert!(finish(&current(&mut s, 5)).is_none());
    assert!(finish(&current(&mut s, 5)).is_none());
    let a = current(&mut s, 5);
    assert_eq!(
        finish(&a),
        Some(&Outcome::NoProgress {
            attempts: 3,
            step: Some(5)
        })
    );
    assert_eq!(s.attempt(), 2);
}

#[test]
fn attempts_that_do_progress_keep_restarting() {
    let t = Instant::now();
    let mut c = cfg(1, 3);
    c.no_progress = Some((1, 1));
    let (mut s, _) = Solo::new(c);
    for (i, reached) in [5u64, 6, 7].into_iter().enumerate() {
        let base = 100 + 10 * i as i32;
        spawn_all(&mut s, t, base);
        register(&mut s, t, 0);
        send(&mut s, t, 0, RankMsg::Progress { step: reached });
        let a = s.handle(
            t,
            Event::Reaped {
                pid: base,
                how: ExitKind::Code(1),
            },
        );
        assert!(finish(&a).is_none(), "attempt {i}: {a:?}");
    }
}

#[test]
fn with_a_checkpoint_file_its_value_is_the_progress_not_the_steps() {
    // NVRx's tracker: the file read at the start (100) is the baseline; the ranks' steps grow
    // every attempt but the file does not, so two attempts without progress end the job.
    let t = Instant::now();
    let mut c = cfg(1, 10);
    c.no_progress = Some((2, 1));
    c.progress_from_file = true;
    let (mut s, _) = Solo::new(c);
    let read = |s: &mut Solo, at_start: bool, it: u64| {
        s.handle(
            t,
            Event::CheckpointIteration {
                at_start,
                iteration: Some(it),
            },
        )
    };
    read(&mut s, true, 100);
    let current = |s: &mut Solo, base: i32, step: u64, file: u64| {
        spawn_all(s, t, base);
        register(s, t, 0);
        send(s, t, 0, RankMsg::Progress { step });
        read(s, false, file);
        s.handle(
            t,
            Event::Reaped {
                pid: base,
                how: ExitKind::Code(1),
            },
        )
    };
    assert!(finish(&current(&mut s, 100, 5, 150)).is_none(), "150 > 100");
    assert!(finish(&current(&mut s, 110, 6, 150)).is_none());
    let a = current(&mut s, 120, 7, 150);
    assert!(
        matches!(finish(&a), Some(Outcome::NoProgress { attempts: 3, .. })),
        "{a:?}"
    );
}

#[test]
fn an_attempt_starts_with_the_assignment_the_rendezvous_gave() {
    let t = Instant::now();
    let (mut s, _) = node(1, 2, 3);
    let a = s.handle(
        t,
        Event::Joined {
            attempt: 0,
            placement: Placement {
                group_rank: 1,
                rank_offset: 2,
                world_size: 6,
            },
            max_restarts: 3,
            calculated: None,
        },
    );
    assert!(has(&a, |a| matches!(
        a,
        Action::Record(Record::AttemptStart {
            attempt: 0,
            nproc: 2,
            rank_offset: 2,
            world_size: 6,
            restarts_left: 3,
            ..
        })
    )));
}

#[test]
fn no_steps_between_a_restart_and_the_next_attempts_ranks() {
    // From the restart on, `attempt()` is the next attempt, which must not show the steps the last
    // attempt's ranks reached (found by bench/chaos.py): the steps carry their own attempt.
    let t = Instant::now();
    let (mut s, _) = Solo::new(SupervisorConfig {
        backoff: B,
        ..cfg(1, 10)
    });
    spawn_all(&mut s, t, 10);
    // Attempt 0 reached step 229 too: attempt 1 makes no progress, so its failure backs off.
    send(&mut s, t, 0, RankMsg::Heartbeat { step: Some(229) });
    fail_at(&mut s, t, 10);
    spawn_all(&mut s, t, 20);
    let reg = RankMsg::Register {
        rank: 0,
        local_rank: 0,
        pid: 20,
        attempt: 1,
    };
    send(&mut s, t, 0, reg);
    send(&mut s, t, 0, RankMsg::Heartbeat { step: Some(229) });
    let steps = |s: &Solo| {
        s.attempt_steps()
            .map(|a| (a.attempt, a.min, a.max, a.running))
    };
    assert_eq!(steps(&s), Some((1, 229, 229, true)));
    let failed = t + Duration::from_secs(1);
    let a = fail_at(&mut s, failed, 20);
    assert_eq!((restart_waits(&a), s.attempt()), (vec![1000], 2));
    assert_eq!(steps(&s), Some((1, 229, 229, false)), "during the back-off");
    let until = failed + Duration::from_secs(1);
    assert_eq!(spawns(&s.handle(until, Event::Tick)), vec![2]);
    spawn_all(&mut s, until, 30);
    assert_eq!(steps(&s), None, "the new ranks reported nothing yet");
}

#[test]
fn during_a_back_off_the_steps_are_the_dead_attempts_under_its_own_number() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(SupervisorConfig {
        backoff: B,
        ..cfg(2, 10)
    });
    // Attempt 0 reaches step 9; attempt 1 gets no further, so its failure backs off.
    spawn_all(&mut s, t, 10);
    send(&mut s, t, 0, RankMsg::Heartbeat { step: Some(9) });
    fail_at(&mut s, t, 10);
    fail_at(&mut s, t, 11);
    assert_eq!(s.attempt(), 1);
    spawn_all(&mut s, t, 20);
    let a = t + Duration::from_secs(1);
    let b = t + Duration::from_secs(2);
    send(&mut s, a, 0, RankMsg::Heartbeat { step: Some(7) });
    send(&mut s, a, 1, RankMsg::Heartbeat { step: Some(7) });
    // Rank 1 goes on alone (rank 0 hangs): the lowest step, 7, was reached at `a`.
    send(&mut s, b, 1, RankMsg::Heartbeat { step: Some(9) });
    let running = s.attempt_steps().unwrap();
    assert_eq!((running.attempt, running.min, running.max), (1, 7, 9));
    assert_eq!(running.at, a);
    assert!(running.running);
    let f = t + Duration::from_secs(3);
    fail_at(&mut s, f, 21);
    fail_at(&mut s, f, 20);
    // Backing off, the supervisor's attempt is already 2; the ranks' steps stay attempt 1's.
    assert_eq!(s.attempt(), 2);
    assert!(s.next_deadline().is_some());
    let dead = s.attempt_steps().unwrap();
    assert_eq!(
        (dead.attempt, dead.min, dead.max, dead.running),
        (1, 7, 9, false)
    );
}

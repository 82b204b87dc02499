use super::*;
use monitor::HangKind;
use std::collections::VecDeque;
use std::time::Duration;
use vigil_ipc::AgentMsg;

/// A supervisor whose coordination is looped back: what the job's rendezvous and store answer
/// when this is the only node. (`multi_node_*` tests below drive the coordination events by
/// hand instead.)
struct Solo {
    s: Supervisor,
    /// Local ranks whose process the loopback runtime reports stopped.
    stopped: Vec<u32>,
}

impl std::ops::Deref for Solo {
    type Target = Supervisor;
    fn deref(&self) -> &Supervisor {
        &self.s
    }
}

impl Solo {
    fn new(cfg: SupervisorConfig) -> (Solo, Vec<Action>) {
        let (s, first) = Supervisor::new(cfg);
        let mut solo = Solo {
            s,
            stopped: Vec::new(),
        };
        let out = solo.loopback(Instant::now(), first);
        (solo, out)
    }

    fn handle(&mut self, now: Instant, ev: Event) -> Vec<Action> {
        let a = self.s.handle(now, ev);
        self.loopback(now, a)
    }

    fn loopback(&mut self, now: Instant, actions: Vec<Action>) -> Vec<Action> {
        let mut out = Vec::new();
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(a) = queue.pop_front() {
            let reply = match &a {
                Action::Job(JobRequest::Join { cycle, calculated }) => Some(Event::Joined {
                    cycle: *cycle,
                    rank_offset: self.s.job.rank_offset,
                    world_size: self.s.job.world_size,
                    max_restarts: self.s.job.max_restarts,
                    calculated: calculated.clone(),
                }),
                Action::Job(JobRequest::ReportEnd { cycle, end }) => Some(Event::CycleEnded {
                    cycle: *cycle,
                    end: end.clone(),
                }),
                Action::Job(JobRequest::ReportDone { cycle }) => Some(Event::CycleEnded {
                    cycle: *cycle,
                    end: JobEnd::Done,
                }),
                Action::ProbeStopped { ranks } => Some(Event::Probed {
                    stopped: ranks
                        .iter()
                        .map(|(lr, _)| *lr)
                        .filter(|lr| self.stopped.contains(lr))
                        .collect(),
                }),
                Action::Job(JobRequest::StopTrigger { cycle, trigger }) => Some(Event::StopAsked {
                    cycle: *cycle,
                    trigger: trigger.clone(),
                }),
                Action::Job(JobRequest::StopSteps { cycle, report }) => Some(Event::StopStep {
                    cycle: *cycle,
                    step: choose_stop_step(&[*report], AGREEMENT_BUDGET),
                }),
                Action::Job(JobRequest::ShareTimeouts {
                    cycle,
                    round,
                    timeouts,
                }) => Some(Event::JobTimeouts {
                    cycle: *cycle,
                    round: *round,
                    timeouts: timeouts.clone(),
                }),
                _ => None,
            };
            out.push(a);
            if let Some(ev) = reply {
                queue.extend(self.s.handle(now, ev));
            }
        }
        out
    }
}

fn cfg(nproc: u32, max_restarts: u32) -> SupervisorConfig {
    SupervisorConfig::basic(nproc, max_restarts)
}

/// Spawns every rank of the current cycle with pids `base + local_rank`.
fn spawn_all(s: &mut Solo, now: Instant, base: i32) -> Vec<Action> {
    let mut out = Vec::new();
    for lr in 0..s.config().nproc {
        out.extend(s.handle(
            now,
            Event::RankSpawned {
                local_rank: lr,
                pid: base + lr as i32,
            },
        ));
    }
    out
}

fn send(s: &mut Solo, now: Instant, local_rank: u32, msg: RankMsg) -> Vec<Action> {
    s.handle(now, Event::Message { local_rank, msg })
}

fn calc_hb() -> RankMsg {
    RankMsg::CalculateTimeouts {
        heartbeat: true,
        out_of_section: false,
        all_sections: false,
        sections: vec![],
    }
}

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
            cycle: 0,
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
        cycle: 0,
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

/// A signal to the agent, with the window the runtime gives it outside Slurm: --term-timeout.
fn signal(s: &Supervisor, signal: i32) -> Event {
    Event::Signal {
        signal,
        window: s.config().term_timeout,
    }
}

fn finish(actions: &[Action]) -> Option<&Outcome> {
    actions.iter().find_map(|a| match a {
        Action::Finish(o) => Some(o),
        _ => None,
    })
}

fn signals(actions: &[Action]) -> Vec<(Vec<i32>, i32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SignalGroups { pgids, signal } => Some((pgids.clone(), *signal)),
            _ => None,
        })
        .collect()
}

fn spawns(actions: &[Action]) -> Vec<u32> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SpawnCycle { cycle } => Some(*cycle),
            _ => None,
        })
        .collect()
}

#[test]
fn starts_cycle_zero() {
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
fn failure_stops_others_then_restarts_with_next_cycle() {
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
    assert_eq!(s.cycle(), 1);
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
fn a_signal_brings_its_window_and_holds_to_it() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 0));
    spawn_all(&mut s, t, 100);
    let window = Duration::from_secs(5);
    s.handle(
        t,
        Event::Signal {
            signal: SIGTERM,
            window,
        },
    );
    // Another event between keeps the window the signal brought.
    let early = s.handle(t + Duration::from_secs(4), Event::Tick);
    assert!(signals(&early).is_empty());
    let a = s.handle(t + window, Event::Tick);
    assert_eq!(signals(&a), vec![(vec![100, 101], SIGKILL)]);
}

#[test]
fn signal_is_forwarded_and_never_restarts() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 5));
    spawn_all(&mut s, t, 100);
    let a = s.handle(t, signal(&s, libc::SIGHUP));
    assert_eq!(signals(&a), vec![(vec![100, 101], libc::SIGHUP)]);
    assert_eq!(s.next_deadline(), Some(t + Duration::from_secs(30)));
    s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(1),
        },
    );
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Signal(libc::SIGHUP),
        },
    );
    let o = finish(&a).unwrap();
    assert_eq!(
        o,
        &Outcome::Signaled {
            signal: libc::SIGHUP
        }
    );
    assert_eq!(o.exit_code(), 128 + libc::SIGHUP);
    assert!(spawns(&a).is_empty());
}

#[test]
fn second_sigint_escalates_at_once() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(1, 0));
    spawn_all(&mut s, t, 100);
    s.handle(t, signal(&s, SIGINT));
    let t1 = t + Duration::from_millis(200);
    s.handle(t1, signal(&s, SIGINT));
    assert_eq!(s.next_deadline(), Some(t1));
    let a = s.handle(t1, Event::Tick);
    assert_eq!(signals(&a), vec![(vec![100], SIGKILL)]);
}

#[test]
fn signal_during_failure_stop_cancels_restart() {
    let t = Instant::now();
    let (mut s, _) = Solo::new(cfg(2, 5));
    spawn_all(&mut s, t, 100);
    s.handle(
        t,
        Event::Reaped {
            pid: 100,
            how: ExitKind::Code(1),
        },
    );
    let a = s.handle(t, signal(&s, SIGTERM));
    assert_eq!(signals(&a), vec![(vec![101], SIGTERM)]);
    let a = s.handle(
        t,
        Event::Reaped {
            pid: 101,
            how: ExitKind::Code(0),
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Signaled { signal: SIGTERM }));
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
            cycle: 0,
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
            cycle: 0,
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
        cycle: 0,
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
        cycle: 0,
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

// Multi-node: the coordination events are driven by hand, as the store would deliver them.

fn joined(cycle: u32, rank_offset: u32, max_restarts: u32) -> Event {
    Event::Joined {
        cycle,
        rank_offset,
        world_size: 0,
        max_restarts,
        calculated: None,
    }
}

fn node(node_rank: u32, nproc: u32, max_restarts: u32) -> (Supervisor, Vec<Action>) {
    let mut c = cfg(nproc, max_restarts);
    c.node_rank = node_rank;
    c.saves_timeouts = node_rank == 0;
    Supervisor::new(c)
}

fn started(s: &mut Supervisor, t: Instant, base: i32) {
    for lr in 0..s.config().nproc {
        s.handle(
            t,
            Event::RankSpawned {
                local_rank: lr,
                pid: base + lr as i32,
            },
        );
    }
}

fn has(actions: &[Action], pred: impl Fn(&Action) -> bool) -> bool {
    actions.iter().any(pred)
}

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
        cycle: 0,
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
            cycle: 0,
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
            cycle: 0,
            round: 7,
            timeouts: job.clone(),
        },
    );
    assert!(stale.is_empty(), "another round's result is not this one's");
    let a = s.handle(
        t,
        Event::JobTimeouts {
            cycle: 0,
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
        cycle: 0,
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
        cycle: 0,
        local_rank: 1,
        rank: 7,
        pid: 50
    })));
    // A Joined for another cycle is not ours.
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
        Action::Job(JobRequest::ReportEnd { cycle: 0, end }) => Some(end.clone()),
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
        Event::CycleEnded {
            cycle: 0,
            end: reported.unwrap(),
        },
    );
    assert!(a.contains(&Action::Job(JobRequest::Join {
        cycle: 1,
        calculated: None
    })));
    assert_eq!(s.cycle(), 1);
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
    let a = s.handle(t, Event::CycleEnded { cycle: 0, end });
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
    assert!(a.contains(&Action::Job(JobRequest::ReportDone { cycle: 0 })));
    assert!(finish(&a).is_none());
    // Another node failed after ours finished: this node restarts with the job.
    let failed = JobEnd::Failed {
        node: 0,
        reason: "x".into(),
    };
    let a = s.handle(
        t,
        Event::CycleEnded {
            cycle: 0,
            end: failed,
        },
    );
    assert!(a.contains(&Action::Job(JobRequest::Join {
        cycle: 1,
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
        Event::CycleEnded {
            cycle: 1,
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
        cycle: 0,
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
        Event::CycleEnded {
            cycle: 0,
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
    assert!(!has(&a, |x| matches!(x, Action::SpawnCycle { .. })));
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
    let a = s.handle(t, Event::CycleEnded { cycle: 0, end });
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
                cycle: 0,
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
        let (w, s) = B.next(streak, quick);
        waits.push(w.as_secs());
        streak = s;
    }
    assert_eq!(waits, vec![0, 1, 2, 4, 8, 16, 30, 30]);
    // A long attempt starts a new streak: immediate again, then the base.
    let (w, s) = B.next(streak, Duration::from_secs(300));
    assert_eq!((w, s), (Duration::ZERO, 1));
    assert_eq!(B.next(s, quick).0, Duration::from_secs(1));
    assert_eq!(Backoff::OFF.next(7, quick).0, Duration::ZERO);
}

/// Fails the one rank of the current cycle at `t` (the verdict comes back at once).
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
    assert_eq!(s.cycle(), 2);
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
        rans in proptest::collection::vec(0u64..700_000, 1..40),
    ) {
        let b = Backoff {
            base: Duration::from_millis(base_ms),
            cap: Duration::from_millis(cap_ms),
            reset_after: Duration::from_millis(reset_ms),
        };
        let mut streak = 0;
        let mut last = Duration::ZERO;
        for ran in rans {
            let ran = Duration::from_millis(ran);
            let (w, next) = b.next(streak, ran);
            proptest::prop_assert!(w <= b.cap);
            if streak == 0 || ran >= b.reset_after {
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
    /// `max_restarts` times and only ever signals pids of its own cycle.
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

/// Connects a rank that calls `should_stop(step)` (it reported step 0).
fn register(s: &mut Solo, t: Instant, local_rank: u32) {
    send(
        s,
        t,
        local_rank,
        RankMsg::Register {
            rank: local_rank,
            local_rank,
            pid: 100 + local_rank,
            cycle: 0,
        },
    );
    send(s, t, local_rank, RankMsg::Progress { step: 0 });
}

fn stop_requests(actions: &[Action]) -> Vec<Option<u64>> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SendToAll(AgentMsg::StopRequest { at_step, .. })
            | Action::SendToRank {
                msg: AgentMsg::StopRequest { at_step, .. },
                ..
            } => Some(*at_step),
            _ => None,
        })
        .collect()
}

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
            cycle: 0,
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
            cycle: 0,
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
                    cycle: 0,
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
            cycle: 0,
            trigger: "SIGUSR2".into(),
        },
    );
    assert!(signals(&a).is_empty());
    assert!(has(
        &a,
        |x| matches!(x, Action::Job(JobRequest::StopSteps { cycle: 0, report }) if report.max_step == Some(9))
    ));
    let a = s.handle(
        t,
        Event::StopStep {
            cycle: 0,
            step: Some(30),
        },
    );
    assert_eq!(stop_requests(&a), vec![Some(30)]);
    // A stale cycle's answer changes nothing.
    assert!(s
        .handle(
            t,
            Event::StopStep {
                cycle: 7,
                step: Some(1)
            }
        )
        .is_empty());
}

#[test]
fn attempts_that_stop_making_progress_are_not_restarted() {
    let t = Instant::now();
    let mut c = cfg(1, 10);
    c.no_progress = Some((2, 1));
    let (mut s, _) = Solo::new(c);
    let mut base = 100;
    let mut attempt = |s: &mut Solo, reached: u64| {
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
    assert!(finish(&attempt(&mut s, 5)).is_none());
    assert!(finish(&attempt(&mut s, 5)).is_none());
    let a = attempt(&mut s, 5);
    assert_eq!(
        finish(&a),
        Some(&Outcome::NoProgress {
            attempts: 3,
            step: Some(5)
        })
    );
    assert_eq!(s.cycle(), 2);
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
    let attempt = |s: &mut Solo, base: i32, step: u64, file: u64| {
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
    assert!(finish(&attempt(&mut s, 100, 5, 150)).is_none(), "150 > 100");
    assert!(finish(&attempt(&mut s, 110, 6, 150)).is_none());
    let a = attempt(&mut s, 120, 7, 150);
    assert!(
        matches!(finish(&a), Some(Outcome::NoProgress { attempts: 3, .. })),
        "{a:?}"
    );
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
        Event::CycleEnded {
            cycle: 0,
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
        Action::Job(JobRequest::Join { cycle: 1, .. })
    )));
    let lost = JobEnd::Lost {
        reason: "node 1 left".into(),
        node: Some(1),
    };
    let a = s.handle(
        t,
        Event::CycleEnded {
            cycle: 1,
            end: lost,
        },
    );
    assert!(matches!(finish(&a), Some(Outcome::Lost { .. })), "{a:?}");
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
            cycle: 0,
        },
        RankMsg::Progress { step: 7 },
    ] {
        s.handle(t, Event::Message { local_rank: 0, msg });
    }
    s.handle(
        t,
        Event::StopAsked {
            cycle: 0,
            trigger: "SIGTERM".into(),
        },
    );
    let a = s.handle(t, signal(&s, SIGTERM));
    assert!(signals(&a).is_empty(), "{a:?}");
    let a = s.handle(
        t,
        Event::StopStep {
            cycle: 0,
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
        !has(&a, |x| matches!(x, Action::SpawnCycle { .. })),
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
        !has(&a, |x| matches!(x, Action::SpawnCycle { .. })),
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

#[test]
fn a_standby_runs_no_ranks_follows_the_jobs_verdicts_and_ends_with_the_job() {
    let t = Instant::now();
    let (mut s, first) = node(2, 2, 3);
    assert!(has(&first, |x| matches!(
        x,
        Action::Job(JobRequest::Join { cycle: 0, .. })
    )));
    let a = s.handle(t, Event::Standby { cycle: 0 });
    assert!(has(&a, |x| matches!(
        x,
        Action::Record(Record::Standby { cycle: 0 })
    )));
    assert!(!has(&a, |x| matches!(x, Action::SpawnCycle { .. })));
    assert!(!has(&a, |x| matches!(
        x,
        Action::Job(JobRequest::ReportDone { .. })
    )));
    // Another node failed: every node, the standby too, goes to the next attempt.
    let a = s.handle(
        t,
        Event::CycleEnded {
            cycle: 0,
            end: JobEnd::Failed {
                node: 1,
                reason: "lost".into(),
            },
        },
    );
    assert!(
        has(&a, |x| matches!(
            x,
            Action::Job(JobRequest::Join { cycle: 1, .. })
        )),
        "{a:?}"
    );
    // Promoted in attempt 1: it runs ranks.
    let a = s.handle(t, joined(1, 2, 3));
    assert!(has(&a, |x| matches!(x, Action::SpawnCycle { cycle: 1 })));
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
        Event::CycleEnded {
            cycle: 1,
            end: JobEnd::Done,
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Succeeded));
}

#[test]
fn a_standby_when_the_job_finishes_finishes_too() {
    let t = Instant::now();
    let (mut s, _) = node(2, 2, 0);
    s.handle(t, Event::Standby { cycle: 0 });
    let a = s.handle(
        t,
        Event::CycleEnded {
            cycle: 0,
            end: JobEnd::Done,
        },
    );
    assert_eq!(finish(&a), Some(&Outcome::Succeeded));
}

/// SIGTERM, SIGUSR1 and SIGUSR2, as the shim holds them for `should_stop(step)`.
fn held() -> RankMsg {
    RankMsg::HoldsSignals {
        signals: [libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2]
            .iter()
            .fold(0, |m, s| m | 1u64 << s),
    }
}

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
        let a = s.handle(t, Event::CycleEnded { cycle: 0, end });
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
    let a = s.handle(t, Event::CycleEnded { cycle: 0, end });
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

#[test]
fn an_attempt_starts_with_the_assignment_the_rendezvous_gave() {
    let t = Instant::now();
    let (mut s, _) = node(1, 2, 3);
    let a = s.handle(
        t,
        Event::Joined {
            cycle: 0,
            rank_offset: 2,
            world_size: 6,
            max_restarts: 3,
            calculated: None,
        },
    );
    assert!(has(&a, |a| matches!(
        a,
        Action::Record(Record::CycleStart {
            cycle: 0,
            nproc: 2,
            rank_offset: 2,
            world_size: 6,
            restarts_left: 3,
            ..
        })
    )));
}

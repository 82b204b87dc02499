//! The supervisor's tests, by concern (one file each); the shared helpers here.

use super::*;
use monitor::HangKind;
use std::collections::VecDeque;
use std::time::Duration;
use vigil_ipc::AgentMsg;

mod faults;
mod hangs;
mod holds;
mod inprocess;
mod multinode;
mod restarts;
mod signals;
mod stopstep;
mod timeouts;

/// A supervisor whose coordination is looped back: what the job's rendezvous and store answer
/// when this is the only node. (The tests in `multinode.rs` drive the coordination events by
/// hand instead.)
struct Solo {
    s: Supervisor,
    /// Local ranks whose process the loopback runtime reports stopped.
    stopped: Vec<u32>,
    /// Where the loopback runtime reports the main threads of the ranks asked (`true`: waiting
    /// in a collective); a rank not in it does not answer.
    waiting: Vec<(u32, bool)>,
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
            waiting: Vec::new(),
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
                Action::Job(JobRequest::Join {
                    attempt,
                    calculated,
                }) => Some(Event::Joined {
                    attempt: *attempt,
                    placement: self.s.job.placement,
                    max_restarts: self.s.job.max_restarts,
                    calculated: calculated.clone(),
                }),
                Action::Job(JobRequest::ReportEnd { attempt, end }) => Some(Event::AttemptEnded {
                    attempt: *attempt,
                    end: end.clone(),
                }),
                Action::Job(JobRequest::ReportDone { attempt }) => Some(Event::AttemptEnded {
                    attempt: *attempt,
                    end: JobEnd::Done,
                }),
                Action::ProbeStopped { ranks, ask_where } => Some(Event::Probed {
                    stopped: ranks
                        .iter()
                        .map(|(lr, _)| *lr)
                        .filter(|lr| self.stopped.contains(lr))
                        .collect(),
                    waiting: (self.waiting.iter())
                        .filter(|(lr, _)| ask_where.contains(lr))
                        .copied()
                        .collect(),
                }),
                Action::Job(JobRequest::StopTrigger { attempt, trigger }) => {
                    Some(Event::StopAsked {
                        attempt: *attempt,
                        trigger: trigger.clone(),
                    })
                }
                Action::Job(JobRequest::StopSteps { attempt, report }) => Some(Event::StopStep {
                    attempt: *attempt,
                    step: choose_stop_step(&[*report], AGREEMENT_BUDGET),
                }),
                Action::Job(JobRequest::ShareTimeouts {
                    attempt,
                    round,
                    timeouts,
                }) => Some(Event::JobTimeouts {
                    attempt: *attempt,
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

/// Spawns every rank of the current attempt with pids `base + local_rank`.
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
            Action::SpawnAttempt { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect()
}

fn joined(attempt: u32, rank_offset: u32, max_restarts: u32) -> Event {
    Event::Joined {
        attempt,
        placement: Placement {
            group_rank: 0,
            rank_offset,
            world_size: 0,
        },
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
            attempt: 0,
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

/// SIGTERM, SIGUSR1 and SIGUSR2, as the shim holds them for `should_stop(step)`.
fn held() -> RankMsg {
    RankMsg::HoldsSignals {
        signals: [libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2]
            .iter()
            .fold(0, |m, s| m | 1u64 << s),
    }
}

//! What a rank's messages mean: its registration, "training finished", steps, workload control
//! and held signals here, and a closed checkpoint section's `section` record (for goodput);
//! calculation requests and section ends go on to `timeouts.rs`, stop signals a rank received to
//! `stopstep.rs`.
//!
//! What a message tells about the rank is a free function of the parts it touches: its liveness
//! and sections ([`on_liveness`]: the attempt, the timeouts in force), its registration
//! ([`on_registered`]), "training finished" ([`on_finished`]: the job's steps) and workload control
//! ([`on_workload_control`]: what the node was asked). What the message asks for past that stays
//! the supervisor's `on_content`: it hands each kind on to another concern (the timeouts'
//! calculation, the steps, a stop), which between them take every part.

use std::time::Instant;

use vigil_ipc::{AgentMsg, RankMsg};

use super::events::{Action, Record};
use super::monitor::{self, CalcRequest, Timeouts};
use super::state::{Asked, Attempt, Steps};
use super::stopstep;
use super::Supervisor;

impl Supervisor {
    /// A message from `local_rank`: its liveness, then its registration or "training finished"
    /// the first time, then what it asks for or tells.
    pub(super) fn on_message(
        &mut self,
        now: Instant,
        local_rank: u32,
        msg: RankMsg,
        out: &mut Vec<Action>,
    ) {
        let at = (self.attempt, self.job.placement.rank_offset);
        let in_force = &self.timeouts.in_force;
        let rank = (local_rank, &msg);
        let Some((registered, finished)) =
            on_liveness(&mut self.current, at, in_force, now, rank, out)
        else {
            return;
        };
        match &msg {
            RankMsg::Register { .. } if !registered => {
                let stop = self.stop.agreed().then(|| self.stop.msg());
                on_registered(in_force, stop, at, local_rank, out)
            }
            RankMsg::Finished if !finished => on_finished(&mut self.job.steps, at, local_rank, out),
            _ => {}
        }
        self.on_content(now, local_rank, msg, out);
    }

    /// What the message asks for or tells, past the rank's liveness.
    fn on_content(&mut self, now: Instant, local_rank: u32, msg: RankMsg, out: &mut Vec<Action>) {
        match msg {
            RankMsg::CalculateTimeouts {
                heartbeat,
                out_of_section,
                all_sections,
                sections,
            } => {
                let req = CalcRequest {
                    heartbeat,
                    out_of_section,
                    all_sections,
                    sections,
                };
                self.calc().on_calc_request(now, local_rank, req, out);
            }
            RankMsg::Heartbeat { step } => {
                if let Some(step) = step {
                    self.gen_parts().on_step_reported(now, local_rank, out);
                    stopstep::on_step(
                        &mut self.current,
                        &mut self.job.steps,
                        now,
                        local_rank,
                        step,
                    );
                }
                self.calc().maybe_calculate(out)
            }
            RankMsg::SectionEnd { .. } => self.calc().maybe_calculate(out),
            RankMsg::WorkloadControl {
                action,
                description,
            } => {
                let at = (self.attempt, self.job.placement.rank_offset);
                let asked = &mut self.job.asked;
                on_workload_control(asked, at, local_rank, (action, description), out)
            }
            RankMsg::Progress { step } => {
                self.gen_parts().on_step_reported(now, local_rank, out);
                if let Some(r) = self.current.ranks.get_mut(local_rank as usize) {
                    r.listens = true;
                }
                stopstep::on_step(
                    &mut self.current,
                    &mut self.job.steps,
                    now,
                    local_rank,
                    step,
                );
            }
            RankMsg::HoldsSignals { signals } => {
                if let Some(r) = self.current.ranks.get_mut(local_rank as usize) {
                    r.holds = signals;
                }
                self.kill_if_holding(local_rank, out);
            }
            RankMsg::Signalled { signal } => self.on_rank_signalled(now, local_rank, signal, out),
            RankMsg::Restartable { generation } => self
                .gen_parts()
                .on_restartable(now, local_rank, generation, out),
            RankMsg::Raised { error } => {
                let at = (self.attempt, self.job.placement.rank_offset);
                on_raised(&mut self.current, at, local_rank, error, out)
            }
            _ => {}
        }
    }
}

/// A message `msg` from local rank `local_rank` of attempt `attempt` (global ranks from
/// `rank_offset`) at `now`: the rank's liveness and sections (under the timeouts `in_force`), and
/// the records of a closed checkpoint section or of section names no longer kept. Whether the rank
/// had registered and had said "training finished" before it; `None` when the rank is not running
/// (the message means nothing then).
pub(super) fn on_liveness(
    current: &mut Attempt,
    (attempt, rank_offset): (u32, u32),
    in_force: &Timeouts,
    now: Instant,
    (local_rank, msg): (u32, &RankMsg),
    out: &mut Vec<Action>,
) -> Option<(bool, bool)> {
    let rank = current
        .ranks
        .get_mut(local_rank as usize)
        .filter(|r| r.running())?;
    let step = rank.pace.map(|p| p.step);
    let m = rank.monitor.as_mut()?;
    let (registered, finished, capped) = (m.registered(), m.finished(), m.names_capped());
    let save = m.on_msg_keeping(now, msg, &in_force.sections);
    if let Some(save) = save {
        // The checkpoint holds the steps the rank had done (for the back-off's progress).
        current.saved = current.saved.max(step);
        out.push(Action::Record(Record::Section {
            attempt,
            local_rank,
            rank: rank_offset + local_rank,
            name: save.name,
            duration_ms: save.took.as_millis().try_into().unwrap_or(u64::MAX),
            last_recorded: save.last,
        }));
    }
    if !capped && m.names_capped() {
        out.push(Action::Record(Record::SectionNamesCapped {
            attempt,
            local_rank,
            rank: rank_offset + local_rank,
            kept: monitor::MAX_SECTION_NAMES,
        }));
    }
    Some((registered, finished))
}

/// Local rank `local_rank` of attempt `attempt` registered: it gets the timeouts `in_force`, and the
/// stop request (`stop`) if the stop step was agreed before it connected.
pub(super) fn on_registered(
    in_force: &Timeouts,
    stop: Option<AgentMsg>,
    (attempt, rank_offset): (u32, u32),
    local_rank: u32,
    out: &mut Vec<Action>,
) {
    out.push(Action::Record(Record::Registered {
        attempt,
        local_rank,
        rank: rank_offset + local_rank,
    }));
    out.push(Action::SendToRank {
        local_rank,
        msg: in_force.to_msg(),
    });
    if let Some(msg) = stop {
        out.push(Action::SendToRank { local_rank, msg });
    }
}

/// Local rank `local_rank` of attempt `attempt` said "training finished": the job's `steps` keep it.
pub(super) fn on_finished(
    steps: &mut Steps,
    (attempt, rank_offset): (u32, u32),
    local_rank: u32,
    out: &mut Vec<Action>,
) {
    steps.training_finished = true;
    out.push(Action::Record(Record::TrainingFinished {
        attempt,
        local_rank,
        rank: rank_offset + local_rank,
    }));
}

/// NVRx's workload control from local rank `local_rank` of attempt `attempt`: no further attempt,
/// or keep this node out of the job (kept in what the node was `asked`).
pub(super) fn on_workload_control(
    asked: &mut Asked,
    (attempt, rank_offset): (u32, u32),
    local_rank: u32,
    (action, description): (u8, String),
    out: &mut Vec<Action>,
) {
    let name = match action {
        vigil_ipc::WORKLOAD_EXCLUDE_NODE => {
            asked.exclude = true;
            "exclude_this_node"
        }
        vigil_ipc::WORKLOAD_SHUTDOWN => {
            asked.shutdown = true;
            "shutdown_workload"
        }
        _ => return,
    };
    out.push(Action::Record(Record::WorkloadControl {
        attempt,
        rank: rank_offset + local_rank,
        action: name,
        description,
    }));
}

/// Local rank `local_rank` of attempt `attempt` (global ranks from `rank_offset`) said its main
/// thread ended with `error`: the record, once, and the rank is a definite culprit from now on
/// should the others' timeouts run out while it exits ([`super::hangs`]).
pub(super) fn on_raised(
    current: &mut Attempt,
    (attempt, rank_offset): (u32, u32),
    local_rank: u32,
    error: String,
    out: &mut Vec<Action>,
) {
    let Some(r) = current.ranks.get_mut(local_rank as usize) else {
        return;
    };
    let (Some(pid), None) = (r.pid, &r.raised) else {
        return;
    };
    out.push(Action::Record(Record::RankRaised {
        attempt,
        local_rank,
        rank: rank_offset + local_rank,
        pid,
        error: error.clone(),
    }));
    r.raised = Some(error);
}

//! What a rank's messages mean: its registration, "training finished", steps, workload control
//! and held signals here, and a closed checkpoint section's `section` record (for goodput);
//! calculation requests and section ends go on to `timeouts.rs`, stop signals a rank received to
//! `stopstep.rs`.

use std::time::Instant;

use vigil_ipc::RankMsg;

use super::events::{Action, Record};
use super::monitor::{self, CalcRequest};
use super::stopstep;
use super::Supervisor;

impl Supervisor {
    pub(super) fn on_message(
        &mut self,
        now: Instant,
        local_rank: u32,
        msg: RankMsg,
        out: &mut Vec<Action>,
    ) {
        let Some(m) = self
            .attempt
            .ranks
            .get_mut(local_rank as usize)
            .filter(|r| r.running())
            .and_then(|r| r.monitor.as_mut())
        else {
            return;
        };
        let (registered, finished, capped) = (m.registered(), m.finished(), m.names_capped());
        let save = m.on_msg_keeping(now, &msg, &self.timeouts.in_force.sections);
        if let Some(save) = save {
            out.push(Action::Record(Record::Section {
                cycle: self.cycle,
                local_rank,
                rank: self.job.placement.rank_offset + local_rank,
                name: save.name,
                duration_ms: save.took.as_millis().try_into().unwrap_or(u64::MAX),
                last_recorded: save.last,
            }));
        }
        if !capped && m.names_capped() {
            out.push(Action::Record(Record::SectionNamesCapped {
                cycle: self.cycle,
                local_rank,
                rank: self.job.placement.rank_offset + local_rank,
                kept: monitor::MAX_SECTION_NAMES,
            }));
        }
        match &msg {
            RankMsg::Register { .. } if !registered => self.on_registered(local_rank, out),
            RankMsg::Finished if !finished => self.on_finished(local_rank, out),
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
                    stopstep::on_step(
                        &mut self.attempt,
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
            } => self.on_workload_control(local_rank, action, description, out),
            RankMsg::Progress { step } => {
                if let Some(r) = self.attempt.ranks.get_mut(local_rank as usize) {
                    r.listens = true;
                }
                stopstep::on_step(
                    &mut self.attempt,
                    &mut self.job.steps,
                    now,
                    local_rank,
                    step,
                );
            }
            RankMsg::HoldsSignals { signals } => {
                if let Some(r) = self.attempt.ranks.get_mut(local_rank as usize) {
                    r.holds = signals;
                }
                self.kill_if_holding(local_rank, out);
            }
            RankMsg::Signalled { signal } => self.on_rank_signalled(now, local_rank, signal, out),
            _ => {}
        }
    }

    /// A rank registered: it gets the timeouts in force, and the stop step if one was agreed
    /// before it connected.
    fn on_registered(&mut self, local_rank: u32, out: &mut Vec<Action>) {
        out.push(Action::Record(Record::Registered {
            cycle: self.cycle,
            local_rank,
            rank: self.job.placement.rank_offset + local_rank,
        }));
        out.push(Action::SendToRank {
            local_rank,
            msg: self.timeouts.in_force.to_msg(),
        });
        if self.stop.agreed() {
            out.push(Action::SendToRank {
                local_rank,
                msg: self.stop.msg(),
            });
        }
    }

    fn on_finished(&mut self, local_rank: u32, out: &mut Vec<Action>) {
        self.job.steps.training_finished = true;
        out.push(Action::Record(Record::TrainingFinished {
            cycle: self.cycle,
            local_rank,
            rank: self.job.placement.rank_offset + local_rank,
        }));
    }

    /// NVRx's workload control: no further attempt, or keep this node out of the job.
    fn on_workload_control(
        &mut self,
        local_rank: u32,
        action: u8,
        description: String,
        out: &mut Vec<Action>,
    ) {
        let name = match action {
            vigil_ipc::WORKLOAD_EXCLUDE_NODE => {
                self.job.asked.exclude = true;
                "exclude_this_node"
            }
            vigil_ipc::WORKLOAD_SHUTDOWN => {
                self.job.asked.shutdown = true;
                "shutdown_workload"
            }
            _ => return,
        };
        out.push(Action::Record(Record::WorkloadControl {
            cycle: self.cycle,
            rank: self.job.placement.rank_offset + local_rank,
            action: name,
            description,
        }));
    }
}

//! Timeouts in force: what the ranks report (heartbeats, sections, steps), calculating timeouts
//! from it when vigil or the job's code asks, and adopting the job's value.

use super::*;

/// `loaded` values for the checks that are enabled in `configured`; the rest as configured. The
/// initial timeout is never below the configured one (`monitor::INITIAL_CALC_FLOOR` says why),
/// whatever a saved file says.
fn overlay(configured: &Timeouts, loaded: &Timeouts) -> Timeouts {
    let pick = |c: Option<Duration>, l: Option<Duration>| c.and(l).or(c);
    Timeouts {
        initial: pick(configured.initial, loaded.initial).max(configured.initial),
        heartbeat: pick(configured.heartbeat, loaded.heartbeat),
        sections: configured
            .sections
            .iter()
            .map(|(k, v)| (k.clone(), loaded.sections.get(k).copied().unwrap_or(*v)))
            .collect(),
        out_of_section: pick(configured.out_of_section, loaded.out_of_section),
        warmup: configured.warmup,
    }
}

impl Supervisor {
    /// Timeouts handed over by the job (loaded from the state file by node rank 0, or calculated
    /// over all nodes) replace the ones in force for the checks that are enabled.
    pub(super) fn adopt_timeouts(
        &mut self,
        job: &Timeouts,
        source: &'static str,
        out: &mut Vec<Action>,
    ) {
        let merged = overlay(&self.cfg.timeouts, job);
        self.calculated = Some(job.clone());
        if merged != self.timeouts {
            self.timeouts = merged;
            out.push(Action::Record(Record::TimeoutsUpdated {
                source,
                timeouts: self.timeouts.clone(),
            }));
            out.push(Action::SendToAll(self.timeouts.to_msg()));
        }
    }

    pub(super) fn on_job_timeouts(
        &mut self,
        cycle: u32,
        round: u32,
        timeouts: Timeouts,
        out: &mut Vec<Action>,
    ) {
        if cycle == self.cycle && round > 0 {
            self.answer(round, timeouts, out);
        } else if cycle == self.cycle {
            if self.cfg.saves_timeouts {
                out.push(Action::SaveTimeouts(timeouts.clone()));
            }
            self.adopt_timeouts(&timeouts, "calculated", out);
        }
    }

    pub(super) fn on_message(
        &mut self,
        now: Instant,
        local_rank: u32,
        msg: RankMsg,
        out: &mut Vec<Action>,
    ) {
        let Some(m) = self
            .ranks
            .get_mut(local_rank as usize)
            .filter(|r| r.state == RankState::Running)
            .and_then(|r| r.monitor.as_mut())
        else {
            return;
        };
        let (registered, finished, capped) = (m.registered(), m.finished(), m.names_capped());
        m.on_msg_keeping(now, &msg, &self.timeouts.sections);
        let rank = self.cfg.rank_offset + local_rank;
        if !capped && m.names_capped() {
            out.push(Action::Record(Record::SectionNamesCapped {
                cycle: self.cycle,
                local_rank,
                rank,
                kept: monitor::MAX_SECTION_NAMES,
            }));
        }
        match &msg {
            RankMsg::Register { .. } if !registered => {
                out.push(Action::Record(Record::Registered {
                    cycle: self.cycle,
                    local_rank,
                    rank,
                }));
                out.push(Action::SendToRank {
                    local_rank,
                    msg: self.timeouts.to_msg(),
                });
                // A rank that connects after the stop step was agreed is told it too.
                if self.stop.as_ref().is_some_and(|s| s.agreed.is_some()) {
                    out.push(Action::SendToRank {
                        local_rank,
                        msg: self.stop_msg(),
                    });
                }
            }
            RankMsg::Finished if !finished => {
                self.training_finished = true;
                out.push(Action::Record(Record::TrainingFinished {
                    cycle: self.cycle,
                    local_rank,
                    rank,
                }));
            }
            _ => {}
        }
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
                self.on_calc_request(now, local_rank, req, out);
            }
            RankMsg::Heartbeat { step } => {
                if let Some(step) = step {
                    self.on_step(now, local_rank, step);
                }
                self.maybe_calculate(out)
            }
            RankMsg::SectionEnd { .. } => self.maybe_calculate(out),
            RankMsg::WorkloadControl {
                action,
                description,
            } => {
                let name = match action {
                    vigil_ipc::WORKLOAD_EXCLUDE_NODE => {
                        self.exclude_asked = true;
                        "exclude_this_node"
                    }
                    vigil_ipc::WORKLOAD_SHUTDOWN => {
                        self.shutdown_asked = true;
                        "shutdown_workload"
                    }
                    _ => return,
                };
                out.push(Action::Record(Record::WorkloadControl {
                    cycle: self.cycle,
                    rank: self.cfg.rank_offset + local_rank,
                    action: name,
                    description,
                }));
            }
            RankMsg::Progress { step } => {
                if let Some(r) = self.ranks.get_mut(local_rank as usize) {
                    r.listens = true;
                }
                self.on_step(now, local_rank, step);
            }
            RankMsg::HoldsSignals { signals } => {
                if let Some(r) = self.ranks.get_mut(local_rank as usize) {
                    r.holds = signals;
                }
                self.kill_if_holding(local_rank, out);
            }
            RankMsg::Signalled { signal } => self.on_rank_signalled(now, local_rank, signal, out),
            _ => {}
        }
    }

    /// A rank asks for timeouts to be calculated (NVRx's `calculate_and_set_*`, which every rank
    /// calls together). Once every registered rank of the node asked, this node calculates what
    /// was asked and shares it; the ranks are answered when the job's result comes (`answer`).
    pub(super) fn on_calc_request(
        &mut self,
        now: Instant,
        local_rank: u32,
        req: CalcRequest,
        out: &mut Vec<Action>,
    ) {
        if !self.on_request {
            self.on_request = true;
            self.adopt_calculated_for_requests(out);
        }
        if req == CalcRequest::default() {
            // Only the announcement that this code calculates when it asks.
            return;
        }
        if self.hang_seen || self.phase != Phase::Running {
            out.push(Action::SendToRank {
                local_rank,
                msg: AgentMsg::TimeoutsCalculated {
                    heartbeat: false,
                    sections: false,
                    out_of_section: false,
                },
            });
            return;
        }
        if req.out_of_section {
            if let Some(m) = self.ranks[local_rank as usize].monitor.as_mut() {
                m.bump_out_of_section(now);
            }
        }
        let (all, mut ranks) = self.asking.take().unwrap_or_default();
        if !ranks.contains(&local_rank) {
            ranks.push(local_rank);
        }
        self.asking = Some((all.union(&req), ranks));
        self.maybe_answer_requests(out);
    }

    /// Calculates the collected request once every running, registered rank of the node asked
    /// (a rank that ended or closed its connection is not waited for).
    pub(super) fn maybe_answer_requests(&mut self, out: &mut Vec<Action>) {
        let Some((_, ranks)) = &self.asking else {
            return;
        };
        if self.answering.is_some() || self.hang_seen || self.phase != Phase::Running {
            return;
        }
        let waiting = self.ranks.iter().enumerate().any(|(i, r)| {
            r.state == RankState::Running
                && r.monitor.as_ref().is_some_and(|m| m.watched())
                && !ranks.contains(&(i as u32))
        });
        if waiting {
            return;
        }
        let Some((req, ranks)) = self.asking.take() else {
            return;
        };
        let observed = self.merged_observations();
        let (next, done) = monitor::calculate_requested(
            &self.timeouts,
            &observed,
            self.calculated.as_ref(),
            self.cfg.safety_factor,
            &req,
        );
        let sections = match (done.sections, req.all_sections) {
            (false, _) => Vec::new(),
            (true, true) => observed.sections.keys().cloned().collect(),
            (true, false) => req.sections,
        };
        self.calc_round += 1;
        self.answering = Some(Answering {
            round: self.calc_round,
            done,
            sections,
            ranks,
        });
        out.push(Action::Job(JobRequest::ShareTimeouts {
            cycle: self.cycle,
            round: self.calc_round,
            timeouts: next,
        }));
    }

    /// The job's result of a requested calculation: put it in force, keep and save what was
    /// calculated, and tell each rank that asked what was set.
    pub(super) fn answer(&mut self, round: u32, job: Timeouts, out: &mut Vec<Action>) {
        let Some(Answering {
            done,
            sections,
            ranks,
            ..
        }) = self.answering.take_if(|a| a.round == round)
        else {
            return;
        };
        let mut kept = self.calculated.clone().unwrap_or_default();
        if done.heartbeat {
            kept.initial = job.initial;
            kept.heartbeat = job.heartbeat;
        }
        for name in &sections {
            if let Some(d) = job.sections.get(name) {
                kept.sections.insert(name.clone(), *d);
            }
        }
        if done.out_of_section {
            kept.out_of_section = job.out_of_section;
        }
        let calculated_any = done.heartbeat || done.sections || done.out_of_section;
        if calculated_any {
            self.calculated = Some(kept.clone());
            if self.cfg.saves_timeouts {
                out.push(Action::SaveTimeouts(kept));
            }
        }
        if job != self.timeouts {
            self.timeouts = job;
            out.push(Action::Record(Record::TimeoutsUpdated {
                source: "calculated",
                timeouts: self.timeouts.clone(),
            }));
            out.push(Action::SendToAll(self.timeouts.to_msg()));
        }
        for local_rank in ranks {
            out.push(Action::SendToRank {
                local_rank,
                msg: AgentMsg::TimeoutsCalculated {
                    heartbeat: done.heartbeat,
                    sections: done.sections,
                    out_of_section: done.out_of_section,
                },
            });
        }
        self.maybe_answer_requests(out);
    }

    /// Under NVRx's rule calculated timeouts take precedence over configured ones, disabled ones
    /// included: timeouts this job calculated before (the state file, an earlier cycle) apply to
    /// every check once the job turns out to calculate on request.
    pub(super) fn adopt_calculated_for_requests(&mut self, out: &mut Vec<Action>) {
        let Some(c) = self.calculated.clone() else {
            return;
        };
        let mut next = self.timeouts.clone();
        next.initial = c.initial.max(next.initial);
        next.heartbeat = c.heartbeat.or(next.heartbeat);
        next.out_of_section = c.out_of_section.or(next.out_of_section);
        next.sections.extend(c.sections);
        if next != self.timeouts {
            self.timeouts = next;
            out.push(Action::Record(Record::TimeoutsUpdated {
                source: "loaded",
                timeouts: self.timeouts.clone(),
            }));
            out.push(Action::SendToAll(self.timeouts.to_msg()));
        }
    }

    /// What every rank of this node was seen to need (the maximum over ranks).
    pub(super) fn merged_observations(&self) -> Observed {
        self.ranks
            .iter()
            .filter_map(|r| r.monitor.as_ref().map(|m| m.observed.clone()))
            .reduce(|a, b| a.merge(&b))
            .unwrap_or_default()
    }

    /// Flags mode: once every rank has been observed long enough, set the timeouts from what they
    /// needed. Never when the job's code calculates on request, or after a hang in this cycle.
    pub(super) fn maybe_calculate(&mut self, out: &mut Vec<Action>) {
        if self.calculated_this_cycle
            || self.on_request
            || self.hang_seen
            || !self.timeouts.any()
            || self.ranks.iter().any(|r| r.monitor.is_none())
        {
            return;
        }
        // Asked on every section end until ready: no merged copy of every rank's sections.
        let observed: Vec<&Observed> = self
            .ranks
            .iter()
            .filter_map(|r| r.monitor.as_ref().map(|m| &m.observed))
            .collect();
        if !Observed::all_ready_for(&observed, &self.cfg.timeouts) {
            return;
        }
        let merged = self.merged_observations();
        self.calculated_this_cycle = true;
        let fresh = monitor::calculate(
            &self.timeouts,
            &merged,
            self.calculated.as_ref(),
            self.cfg.safety_factor,
        );
        // Applied when every node has calculated (`JobTimeouts`): the job's value is the maximum.
        out.push(Action::Job(JobRequest::ShareTimeouts {
            cycle: self.cycle,
            round: 0,
            timeouts: fresh,
        }));
    }
}

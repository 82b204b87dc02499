//! In-process restarts, the supervisor's side (docs/inprocess.md): a failed or hung rank is
//! replaced alone while the others keep their processes. The rules and the generations' state
//! are `generation/`'s; here they meet the attempt: replacing a rank, a rank back in its
//! wrapper, survivors overdue.

use std::time::Instant;

use vigil_ipc::AgentMsg;

use super::events::{Action, Record, SIGKILL, SIGTERM};
use super::generation::{Declined, Heard};
use super::state::{Phase, RankState};
use super::JobRequest;
use super::{StopReason, Supervisor};

impl Supervisor {
    /// Whether this node's ranks are the whole job.
    fn single_node(&self) -> bool {
        self.job.placement.world_size == self.cfg.nproc
    }

    /// Whether the failure of `local_rank` may be recovered in process; a refusal worth telling
    /// (in-process restarts were asked for) is recorded once per attempt.
    pub(super) fn may_replace(&mut self, local_rank: u32, out: &mut Vec<Action>) -> bool {
        if self.phase != Phase::Running {
            return false;
        }
        match self.gens.decide() {
            Ok(()) => true,
            Err(Declined::Off) => false,
            Err(why) => {
                let rank = self.job.placement.rank_offset + local_rank;
                out.push(Action::Record(Record::InProcessDeclined {
                    attempt: self.attempt,
                    reason: format!("rank {rank} failed and the whole job restarts: {why}"),
                }));
                self.gens.abandon();
                false
            }
        }
    }

    /// A hung rank whose failure is recovered in process: it is killed at once, and its exit
    /// replaces it ([`Self::replace`]).
    pub(super) fn kill_for_replacement(&mut self, pid: i32, out: &mut Vec<Action>) {
        out.push(Action::SignalGroups {
            pgids: vec![pid],
            signal: SIGKILL,
        });
    }

    /// Local rank `local_rank` failed (its process `pid` is gone): generation G+1 begins, every
    /// other rank is told, and a new process takes its place with the same rank numbers.
    pub(super) fn replace(
        &mut self,
        now: Instant,
        local_rank: u32,
        pid: i32,
        out: &mut Vec<Action>,
    ) {
        let rank = self.job.placement.rank_offset + local_rank;
        // The failure is recovered: it is the generation's record, not the attempt's failure.
        self.current.failures.retain(|f| f.pid != pid);
        let generation = self.begin_generation(now, Some(local_rank), vec![rank], out);
        if !self.single_node() {
            // Every other node's ranks are told through the job's coordination.
            out.push(Action::Job(JobRequest::BeginGeneration {
                attempt: self.attempt,
                generation,
                replaced: vec![rank],
            }));
        }
        let r = &mut self.current.ranks[local_rank as usize];
        r.state = RankState::NotStarted;
        r.pid = None;
        r.monitor = None;
        r.pace = None;
        r.listens = false;
        r.told_to_stop = false;
        r.holds = 0;
        // What was left of its process group (data-loader workers) goes with it.
        out.push(Action::SignalGroups {
            pgids: vec![pid],
            signal: SIGKILL,
        });
        out.push(Action::SpawnRank {
            attempt: self.attempt,
            local_rank,
            generation,
            replaced: vec![rank],
        });
    }

    /// Generation G+1 begins on this node, replacing the global ranks `replaced` (`local`:
    /// the one of them on this node, if any): every running rank of this node is a survivor
    /// and is told. Returns the new generation.
    fn begin_generation(
        &mut self,
        now: Instant,
        local: Option<u32>,
        replaced: Vec<u32>,
        out: &mut Vec<Action>,
    ) -> u64 {
        let survivors: Vec<u32> = (0..self.cfg.nproc)
            .filter(|lr| Some(*lr) != local && self.current.ranks[*lr as usize].running())
            .collect();
        let generation = self
            .gens
            .begin(now, local.into_iter().collect(), survivors.clone());
        self.gens.ranks = replaced.clone();
        // A survivor waits for the replacement in its next rendezvous: its heartbeats stop for
        // that long, as at a start, so the initial timeout covers it again.
        for lr in &survivors {
            if let Some(m) = self.current.ranks[*lr as usize].monitor.as_mut() {
                m.new_generation(now);
            }
        }
        self.current.hangs.cancel();
        out.push(Action::Record(Record::Generation {
            attempt: self.attempt,
            generation,
            ranks: replaced.clone(),
            step: self.current.highest_step(),
        }));
        out.push(Action::SendToAll(AgentMsg::Generation {
            generation,
            replaced,
        }));
        generation
    }

    /// The job says generation `generation` of `attempt` began (maybe here), replacing the global
    /// ranks `replaced`: this node's ranks join it, or the whole job restarts.
    pub(super) fn on_generation_begun(
        &mut self,
        now: Instant,
        attempt: u32,
        generation: u64,
        replaced: Option<Vec<u32>>,
        out: &mut Vec<Action>,
    ) {
        if attempt != self.attempt || self.phase != Phase::Running {
            return;
        }
        let why = match self.gens.heard(generation, replaced.as_deref()) {
            Heard::Echo => return,
            Heard::Begins => match self.gens.decide() {
                Ok(()) => {
                    let replaced = replaced.unwrap_or_default();
                    self.begin_generation(now, None, replaced, out);
                    return;
                }
                Err(why) => why.to_string(),
            },
            Heard::Conflict => match replaced {
                Some(r) => format!(
                    "generation {generation} replacing ranks {r:?} began on another node while this node was at generation {}",
                    self.gens.generation
                ),
                None => format!("the record of generation {generation} cannot be read"),
            },
        };
        self.gens.abandon();
        let reason = format!("in-process generation {generation} cannot be followed here: {why}");
        out.push(Action::Record(Record::InProcessDeclined {
            attempt: self.attempt,
            reason: format!("{reason}; the whole job restarts"),
        }));
        self.begin_stop(now, StopReason::RankFailed, SIGTERM, out);
        self.report_failure(reason, out);
    }

    /// `local_rank` reported a step: a rank outside `vigil.restartable` is told of once, as the
    /// job then restarts whole; the last rank of the node to step in a new generation ends its
    /// recovery as `vigil goodput` counts it.
    pub(super) fn on_step_reported(
        &mut self,
        now: Instant,
        local_rank: u32,
        out: &mut Vec<Action>,
    ) {
        if let Some((generation, took)) = self.gens.on_step(now, local_rank) {
            out.push(Action::Record(Record::GenerationStepping {
                attempt: self.attempt,
                generation,
                seconds: took.as_secs_f64(),
            }));
        }
        if self.gens.note_undeclared(local_rank) {
            let rank = self.job.placement.rank_offset + local_rank;
            out.push(Action::Record(Record::InProcessDeclined {
                attempt: self.attempt,
                reason: format!(
                    "rank {rank} does not run its training function under vigil.restartable: a failure restarts the whole job"
                ),
            }));
        }
    }

    /// `local_rank` said it runs under `vigil.restartable` at `generation`.
    pub(super) fn on_restartable(
        &mut self,
        now: Instant,
        local_rank: u32,
        generation: u64,
        out: &mut Vec<Action>,
    ) {
        if let Some((generation, took)) = self.gens.on_restartable(now, local_rank, generation) {
            out.push(Action::Record(Record::GenerationRecovered {
                attempt: self.attempt,
                generation,
                seconds: took.as_secs_f64(),
            }));
        }
    }

    /// A tick while ranks run: survivors that did not come back to their wrapper within the
    /// abort timeout make the whole job restart.
    pub(super) fn generation_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        let overdue = self.gens.overdue(now);
        let Some(&lr) = overdue.first() else {
            return;
        };
        let generation = self.gens.generation;
        self.gens.abandon();
        let rank = self.job.placement.rank_offset + lr;
        let secs = self.gens.cfg.abort_timeout.as_secs_f64();
        let reason = format!(
            "rank {rank} did not come back to vigil.restartable within the abort timeout ({secs} s) of generation {generation}"
        );
        out.push(Action::Record(Record::InProcessDeclined {
            attempt: self.attempt,
            reason: format!("{reason}; the whole job restarts"),
        }));
        self.begin_stop(now, StopReason::RankFailed, SIGTERM, out);
        self.report_failure(reason, out);
    }
}

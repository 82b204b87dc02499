//! In-process restarts, the supervisor's side (docs/inprocess.md): a failed or hung rank is
//! replaced alone while the others keep their processes. The rules and the generations' state
//! are `generation/`'s; here they meet the attempt: replacing a rank, a rank back in its
//! wrapper, survivors overdue.
//!
//! Each of those works on [`GenParts`] only: the attempt (its number, placement and ranks) and
//! the generations. What is left on `Supervisor` picks the parts and routes; where a generation
//! cannot be followed (a conflict, survivors overdue) the parts return why, and the supervisor
//! restarts the whole job (`whole_restart`: the stop and the failure report are other concerns).

use std::time::Instant;

use vigil_ipc::AgentMsg;

use super::events::{Action, Placement, Record, SIGKILL, SIGTERM};
use super::generation::{Declined, Generations, Heard};
use super::state::{Attempt, Phase, RankState};
use super::JobRequest;
use super::{StopReason, Supervisor};

/// The parts of the supervisor in-process restarts read and change: the attempt under way (its
/// number, where its ranks stand in the job, its state) and the generations.
pub(super) struct GenParts<'a> {
    pub attempt: u32,
    pub placement: Placement,
    pub nproc: u32,
    pub current: &'a mut Attempt,
    pub gens: &'a mut Generations,
}

/// A hung rank whose failure is recovered in process: it is killed at once, and its exit
/// replaces it ([`GenParts::replace`]).
pub(super) fn kill_for_replacement(pid: i32, out: &mut Vec<Action>) {
    out.push(Action::SignalGroups {
        pgids: vec![pid],
        signal: SIGKILL,
    });
}

impl Supervisor {
    /// The parts in-process restarts work on.
    pub(super) fn gen_parts(&mut self) -> GenParts<'_> {
        GenParts {
            attempt: self.attempt,
            placement: self.job.placement,
            nproc: self.cfg.nproc,
            current: &mut self.current,
            gens: &mut self.gens,
        }
    }

    /// Whether the failure of `local_rank` may be recovered in process (only while the ranks
    /// run).
    pub(super) fn may_replace(&mut self, local_rank: u32, out: &mut Vec<Action>) -> bool {
        self.phase == Phase::Running && self.gen_parts().may_replace(local_rank, out)
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
        if let Some(reason) = self.gen_parts().follow(now, generation, replaced, out) {
            self.whole_restart(now, reason, out);
        }
    }

    /// A tick while ranks run: survivors that did not come back to their wrapper within the
    /// abort timeout make the whole job restart.
    pub(super) fn generation_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        if let Some(reason) = self.gen_parts().overdue(now, out) {
            self.whole_restart(now, reason, out);
        }
    }

    /// A generation cannot go on (`reason`): the attempt's ranks stop and the whole job restarts.
    fn whole_restart(&mut self, now: Instant, reason: String, out: &mut Vec<Action>) {
        self.begin_stop(now, StopReason::RankFailed, SIGTERM, out);
        self.report_failure(reason, out);
    }
}

impl GenParts<'_> {
    /// Whether this node's ranks are the whole job.
    fn single_node(&self) -> bool {
        self.placement.world_size == self.nproc
    }

    /// Whether the failure of `local_rank` may be recovered in process; a refusal worth telling
    /// (in-process restarts were asked for) is recorded once per attempt.
    pub(super) fn may_replace(&mut self, local_rank: u32, out: &mut Vec<Action>) -> bool {
        match self.gens.decide() {
            Ok(()) => true,
            Err(Declined::Off) => false,
            Err(why) => {
                let rank = self.placement.rank_offset + local_rank;
                out.push(Action::Record(Record::InProcessDeclined {
                    attempt: self.attempt,
                    reason: format!("rank {rank} failed and the whole job restarts: {why}"),
                }));
                self.gens.abandon();
                false
            }
        }
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
        let rank = self.placement.rank_offset + local_rank;
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
        let survivors: Vec<u32> = (0..self.nproc)
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

    /// The job says generation `generation` began (maybe here), replacing the global ranks
    /// `replaced`: this node's ranks join it; or why the whole job restarts.
    pub(super) fn follow(
        &mut self,
        now: Instant,
        generation: u64,
        replaced: Option<Vec<u32>>,
        out: &mut Vec<Action>,
    ) -> Option<String> {
        let why = match self.gens.heard(generation, replaced.as_deref()) {
            Heard::Echo => return None,
            Heard::Begins => match self.gens.decide() {
                Ok(()) => {
                    let replaced = replaced.unwrap_or_default();
                    self.begin_generation(now, None, replaced, out);
                    return None;
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
        Some(reason)
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
            let rank = self.placement.rank_offset + local_rank;
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

    /// Survivors that did not come back to their wrapper within the abort timeout by `now`:
    /// why the whole job restarts.
    pub(super) fn overdue(&mut self, now: Instant, out: &mut Vec<Action>) -> Option<String> {
        let overdue = self.gens.overdue(now);
        let &lr = overdue.first()?;
        let generation = self.gens.generation;
        self.gens.abandon();
        let rank = self.placement.rank_offset + lr;
        let secs = self.gens.cfg.abort_timeout.as_secs_f64();
        let reason = format!(
            "rank {rank} did not come back to vigil.restartable within the abort timeout ({secs} s) of generation {generation}"
        );
        out.push(Action::Record(Record::InProcessDeclined {
            attempt: self.attempt,
            reason: format!("{reason}; the whole job restarts"),
        }));
        Some(reason)
    }
}

/// In-process restarts on their parts alone: an attempt and its generations, no supervisor.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::generation::InProcessConfig;
    use super::super::monitor::RankMonitor;
    use super::*;

    const ABORT: Duration = Duration::from_secs(10);

    /// Three running ranks (pids 100-102) of attempt 2 on a node whose local rank 0 is global
    /// rank 6, every one restartable at generation 0.
    fn node(t0: Instant) -> (Attempt, Generations) {
        let mut current = Attempt::start(t0, 3);
        for (i, r) in current.ranks.iter_mut().enumerate() {
            r.state = RankState::Running;
            r.pid = Some(100 + i as i32);
            r.monitor = Some(RankMonitor::new(t0));
        }
        let mut gens = Generations::new(InProcessConfig {
            restarts: 2,
            abort_timeout: ABORT,
        });
        gens.new_attempt(3);
        for lr in 0..3 {
            gens.on_restartable(t0, lr, 0);
        }
        (current, gens)
    }

    fn parts<'a>(
        current: &'a mut Attempt,
        gens: &'a mut Generations,
        world_size: u32,
    ) -> GenParts<'a> {
        GenParts {
            attempt: 2,
            placement: Placement {
                group_rank: 1,
                rank_offset: 6,
                world_size,
            },
            nproc: 3,
            current,
            gens,
        }
    }

    #[test]
    fn a_replaced_rank_starts_afresh_and_the_other_nodes_are_told() {
        let t0 = Instant::now();
        let (mut current, mut gens) = node(t0);
        let mut p = parts(&mut current, &mut gens, 12);
        let mut out = Vec::new();
        assert!(p.may_replace(1, &mut out) && out.is_empty());
        p.replace(t0, 1, 101, &mut out);
        let told = Action::Job(JobRequest::BeginGeneration {
            attempt: 2,
            generation: 1,
            replaced: vec![7],
        });
        let spawn = Action::SpawnRank {
            attempt: 2,
            local_rank: 1,
            generation: 1,
            replaced: vec![7],
        };
        assert!(out.contains(&told), "{out:?}");
        assert_eq!(out.last(), Some(&spawn));
        let r = &p.current.ranks[1];
        assert_eq!((r.state, r.pid), (RankState::NotStarted, None));
        assert!(r.monitor.is_none());
        let waiting = p.gens.recovery.as_ref().map(|r| r.waiting.clone());
        assert_eq!(waiting, Some(vec![0, 2]), "the survivors come back");
        // Alone in the job: nobody else to tell.
        let (mut current, mut gens) = node(t0);
        let mut out = Vec::new();
        parts(&mut current, &mut gens, 3).replace(t0, 1, 101, &mut out);
        assert!(!out.iter().any(|a| matches!(a, Action::Job(_))), "{out:?}");
    }

    #[test]
    fn a_generation_that_does_not_follow_this_node_s_restarts_the_whole_job() {
        let t0 = Instant::now();
        let (mut current, mut gens) = node(t0);
        let mut p = parts(&mut current, &mut gens, 12);
        let mut out = Vec::new();
        assert_eq!(p.follow(t0, 1, Some(vec![0]), &mut out), None, "joined");
        assert_eq!(p.gens.generation, 1);
        assert_eq!(p.follow(t0, 1, Some(vec![0]), &mut out), None, "an echo");
        out.clear();
        let why = p
            .follow(t0, 3, Some(vec![4]), &mut out)
            .expect("skipped one");
        assert!(why.contains("generation 3 replacing ranks [4]"), "{why}");
        assert!(matches!(
            &out[..],
            [Action::Record(Record::InProcessDeclined { attempt: 2, .. })]
        ));
        assert!(!p.gens.recovering(), "the recovery is abandoned");
    }

    #[test]
    fn survivors_overdue_after_the_abort_timeout_restart_the_whole_job() {
        let t0 = Instant::now();
        let (mut current, mut gens) = node(t0);
        let mut p = parts(&mut current, &mut gens, 3);
        let mut out = Vec::new();
        p.replace(t0, 0, 100, &mut out);
        out.clear();
        assert_eq!(p.overdue(t0 + ABORT / 2, &mut out), None);
        let why = p.overdue(t0 + ABORT, &mut out).expect("overdue");
        assert!(why.starts_with("rank 7 did not come back"), "{why}");
        assert_eq!(out.len(), 1);
        assert_eq!(p.overdue(t0 + ABORT * 2, &mut out), None, "once");
    }
}

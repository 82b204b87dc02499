//! In-process restarts (`--in-process-restarts N`, docs/inprocess.md): the generations of an
//! attempt and the rules that say whether a failure is recovered by replacing the failed rank
//! alone.
//!
//! It owns the job's in-process budget, the attempt's generation number, which ranks said they
//! run under `vigil.restartable` (and at which generation), and the recovery under way: when it
//! began, which ranks were replaced, which survivors have not come back to their wrapper yet and
//! when they are overdue (`--abort-timeout`). It decides nothing about the attempt's ranks
//! themselves: the supervisor asks [`Generations::decide`] when a rank failed, and carries out a
//! replacement or falls back to a whole restart (`ranks.rs`, `hangs.rs`).
//!
//! Rules (pure, unit-tested below): a failure is recovered in process only when in-process
//! restarts are on and left, no recovery is under way (a second failure during one restarts
//! the whole job), and every rank of the attempt on this node said it is restartable at the
//! current generation. Across nodes ([`Generations::heard`]): a generation another node began is
//! joined under the same rules; one that does not follow this node's (two nodes began one at
//! once, or the record cannot be read) restarts the whole job.

use std::fmt;
use std::time::{Duration, Instant};

/// `--in-process-restarts`, `--abort-timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InProcessConfig {
    /// In-process restarts the job may use in its allocation (0: off).
    pub restarts: u32,
    /// How long a survivor has to come back to its wrapper once a generation began.
    pub abort_timeout: Duration,
}

impl InProcessConfig {
    pub const OFF: InProcessConfig = InProcessConfig {
        restarts: 0,
        abort_timeout: Duration::from_secs(60),
    };
}

/// Why a failure restarts the whole job rather than one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Declined {
    /// `--in-process-restarts` is 0: nothing to say.
    Off,
    /// The budget is spent.
    NoneLeft(u32),
    /// This local rank never said it runs under `vigil.restartable` (at this generation).
    NotRestartable(u32),
    /// A recovery is under way: a second failure.
    Recovering(u64),
}

impl fmt::Display for Declined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Declined::Off => write!(f, "in-process restarts are off"),
            Declined::NoneLeft(n) => write!(f, "the {n} in-process restarts are used up"),
            Declined::NotRestartable(lr) => write!(
                f,
                "local rank {lr} does not run its training function under vigil.restartable"
            ),
            Declined::Recovering(g) => {
                write!(f, "a rank failed while generation {g} was being recovered")
            }
        }
    }
}

/// What a generation the job announced is to this node ([`Generations::heard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// The one this node is at (it began it, or joined it) or an older one: nothing to do.
    Echo,
    /// The next one, begun on another node: join it (if [`Generations::decide`] allows).
    Begins,
    /// Another than the one this node began at the same time, one it skipped, or unreadable:
    /// the whole job restarts.
    Conflict,
}

/// A recovery under way: generation `generation` began at `began`.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    pub generation: u64,
    pub began: Instant,
    /// Local ranks replaced by new processes; each is waited for until it registers as
    /// restartable at this generation.
    pub replaced: Vec<u32>,
    /// Survivors that have not come back to their wrapper yet.
    pub waiting: Vec<u32>,
}

/// The job's in-process budget and the attempt's generations.
#[derive(Debug, Clone)]
pub struct Generations {
    pub cfg: InProcessConfig,
    /// In-process restarts used in the allocation.
    pub used: u32,
    /// The attempt's generation (0 at every attempt's start: its ranks are new processes).
    pub generation: u64,
    /// Per local rank: the generation it last said it is restartable at.
    at: Vec<Option<u64>>,
    pub recovery: Option<Recovery>,
    /// The generation whose ranks have not all stepped yet: when it began, and the local ranks
    /// still to report a step of it (the job trains again once none is left).
    stepping: Option<(u64, Instant, Vec<u32>)>,
    /// The global ranks the current generation replaced (empty at generation 0).
    pub ranks: Vec<u32>,
    /// A rank that steps without having said it is restartable was told of (once per
    /// allocation).
    noted: bool,
}

impl Generations {
    pub fn new(cfg: InProcessConfig) -> Self {
        Generations {
            cfg,
            used: 0,
            generation: 0,
            at: Vec::new(),
            recovery: None,
            stepping: None,
            ranks: Vec::new(),
            noted: false,
        }
    }

    pub fn on(&self) -> bool {
        self.cfg.restarts > 0
    }

    /// An attempt of `nproc` ranks starts: generation 0, nobody restartable yet.
    pub fn new_attempt(&mut self, nproc: u32) {
        self.generation = 0;
        self.ranks.clear();
        self.at = vec![None; nproc as usize];
        self.recovery = None;
        self.stepping = None;
    }

    /// `local_rank` reported a step: whether to say, once, that it never entered
    /// `vigil.restartable` (in-process restarts are on, so the job will restart whole instead).
    pub fn note_undeclared(&mut self, local_rank: u32) -> bool {
        let undeclared = self
            .at
            .get(local_rank as usize)
            .is_some_and(Option::is_none);
        let note = self.on() && !self.noted && undeclared && self.recovery.is_none();
        self.noted |= note;
        note
    }

    /// Whether the failure of a rank can be recovered by replacing it alone (here, or on
    /// another node of the job).
    pub fn decide(&self) -> Result<(), Declined> {
        if !self.on() {
            return Err(Declined::Off);
        }
        if let Some(r) = &self.recovery {
            return Err(Declined::Recovering(r.generation));
        }
        if self.used >= self.cfg.restarts {
            return Err(Declined::NoneLeft(self.cfg.restarts));
        }
        match self.at.iter().position(|g| *g != Some(self.generation)) {
            Some(lr) => Err(Declined::NotRestartable(lr as u32)),
            None => Ok(()),
        }
    }

    /// Generation G+1 begins at `now`: `replaced` are replaced, `survivors` must come back.
    /// Returns the new generation.
    pub fn begin(&mut self, now: Instant, replaced: Vec<u32>, survivors: Vec<u32>) -> u64 {
        self.used += 1;
        self.generation += 1;
        for lr in &replaced {
            if let Some(g) = self.at.get_mut(*lr as usize) {
                *g = None;
            }
        }
        let mut all: Vec<u32> = replaced.iter().chain(&survivors).copied().collect();
        all.sort_unstable();
        self.stepping = Some((self.generation, now, all));
        self.recovery = Some(Recovery {
            generation: self.generation,
            began: now,
            replaced,
            waiting: survivors,
        });
        self.generation
    }

    /// `local_rank` said it is restartable at `generation` (at its start, or back in its
    /// wrapper). When that completes the recovery under way: how long it took.
    pub fn on_restartable(
        &mut self,
        now: Instant,
        local_rank: u32,
        generation: u64,
    ) -> Option<(u64, Duration)> {
        if let Some(g) = self.at.get_mut(local_rank as usize) {
            *g = Some(generation);
        }
        let r = self.recovery.as_mut()?;
        if generation != r.generation {
            return None;
        }
        r.waiting.retain(|lr| *lr != local_rank);
        r.replaced.retain(|lr| *lr != local_rank);
        if !r.waiting.is_empty() || !r.replaced.is_empty() {
            return None;
        }
        let r = self.recovery.take()?;
        Some((r.generation, now.saturating_duration_since(r.began)))
    }

    /// `local_rank` reported a step. A step it reports after saying it is restartable at the
    /// generation under way is a step of that generation (the rank's messages keep their
    /// order); once every rank of the node took one: the generation and how long after the
    /// failure the node's ranks were all stepping again.
    pub fn on_step(&mut self, now: Instant, local_rank: u32) -> Option<(u64, Duration)> {
        let (generation, began, waiting) = self.stepping.as_mut()?;
        if self.at.get(local_rank as usize).copied().flatten() != Some(*generation) {
            return None;
        }
        waiting.retain(|lr| *lr != local_rank);
        if !waiting.is_empty() {
            return None;
        }
        let (generation, began) = (*generation, *began);
        self.stepping = None;
        Some((generation, now.saturating_duration_since(began)))
    }

    /// Whether a generation's recovery is under way: some survivor is not back in its wrapper or
    /// the replacement did not register, so no rank of the node can reach a stop step.
    pub fn recovering(&self) -> bool {
        self.recovery.is_some()
    }

    /// When the survivors still waited for are overdue.
    pub fn deadline(&self) -> Option<Instant> {
        let r = self.recovery.as_ref()?;
        (!r.waiting.is_empty()).then(|| r.began + self.cfg.abort_timeout)
    }

    /// The survivors that did not come back within the abort timeout, at `now`.
    pub fn overdue(&self, now: Instant) -> Vec<u32> {
        match (self.recovery.as_ref(), self.deadline()) {
            (Some(r), Some(at)) if now >= at => r.waiting.clone(),
            _ => Vec::new(),
        }
    }

    /// The job says generation `generation` began, replacing the global ranks `replaced`
    /// (`None`: unreadable): what it is to this node.
    pub fn heard(&self, generation: u64, replaced: Option<&[u32]>) -> Heard {
        let Some(replaced) = replaced else {
            return Heard::Conflict;
        };
        if generation == self.generation + 1 {
            Heard::Begins
        } else if generation < self.generation
            || (generation == self.generation && replaced == self.ranks.as_slice())
        {
            Heard::Echo
        } else {
            Heard::Conflict
        }
    }

    /// The recovery is abandoned (the whole job restarts).
    pub fn abandon(&mut self) {
        self.recovery = None;
        self.stepping = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(restarts: u32) -> InProcessConfig {
        InProcessConfig {
            restarts,
            abort_timeout: Duration::from_secs(10),
        }
    }

    fn all_restartable(g: &mut Generations, nproc: u32, now: Instant) {
        for lr in 0..nproc {
            g.on_restartable(now, lr, g.generation);
        }
    }

    #[test]
    fn off_budget_nodes_and_undeclared_ranks_decline() {
        let now = Instant::now();
        let mut g = Generations::new(cfg(0));
        g.new_attempt(2);
        assert_eq!(g.decide(), Err(Declined::Off));
        let mut g = Generations::new(cfg(1));
        g.new_attempt(3);
        g.on_restartable(now, 0, 0);
        g.on_restartable(now, 2, 0);
        assert_eq!(g.decide(), Err(Declined::NotRestartable(1)));
        g.on_restartable(now, 1, 0);
        assert_eq!(g.decide(), Ok(()));
        g.begin(now, vec![1], vec![0, 2]);
        all_restartable(&mut g, 3, now);
        assert!(g.recovery.is_none());
        assert_eq!(g.decide(), Err(Declined::NoneLeft(1)));
    }

    #[test]
    fn a_recovery_ends_when_every_survivor_and_replacement_is_back() {
        let t0 = Instant::now();
        let mut g = Generations::new(cfg(5));
        g.new_attempt(4);
        all_restartable(&mut g, 4, t0);
        assert_eq!(g.begin(t0, vec![2], vec![0, 1, 3]), 1);
        // A second failure during the recovery restarts the whole job.
        assert_eq!(g.decide(), Err(Declined::Recovering(1)));
        // A message of the last generation does not count.
        assert_eq!(g.on_restartable(t0, 0, 0), None);
        let t1 = t0 + Duration::from_secs(1);
        for lr in [0, 1, 3] {
            assert_eq!(g.on_restartable(t1, lr, 1), None);
        }
        assert_eq!(
            g.deadline(),
            None,
            "the replacement is not under the abort timeout"
        );
        let t2 = t0 + Duration::from_secs(3);
        assert_eq!(
            g.on_restartable(t2, 2, 1),
            Some((1, Duration::from_secs(3)))
        );
        assert_eq!(g.decide(), Ok(()));
    }

    #[test]
    fn a_generation_trains_again_once_every_rank_stepped_in_it() {
        let t0 = Instant::now();
        let mut g = Generations::new(cfg(5));
        g.new_attempt(3);
        all_restartable(&mut g, 3, t0);
        assert_eq!(g.on_step(t0, 0), None, "no generation under way");
        g.begin(t0, vec![1], vec![0, 2]);
        // A survivor's step before it came back to its wrapper is of the last generation.
        assert_eq!(g.on_step(t0, 0), None);
        let t1 = t0 + Duration::from_secs(1);
        for lr in 0..3 {
            g.on_restartable(t1, lr, 1);
        }
        assert_eq!(g.on_step(t1, 0), None);
        assert_eq!(g.on_step(t1, 0), None);
        assert_eq!(g.on_step(t1, 2), None);
        let t2 = t0 + Duration::from_millis(1500);
        assert_eq!(g.on_step(t2, 1), Some((1, Duration::from_millis(1500))));
        assert_eq!(g.on_step(t2, 1), None, "once");
        // An abandoned generation never trains again.
        all_restartable(&mut g, 3, t2);
        g.begin(t2, vec![0], vec![1, 2]);
        g.abandon();
        for lr in 0..3 {
            g.on_restartable(t2, lr, 2);
            assert_eq!(g.on_step(t2, lr), None);
        }
    }

    #[test]
    fn survivors_that_do_not_come_back_are_overdue_after_the_abort_timeout() {
        let t0 = Instant::now();
        let mut g = Generations::new(cfg(5));
        g.new_attempt(3);
        all_restartable(&mut g, 3, t0);
        g.begin(t0, vec![0], vec![1, 2]);
        g.on_restartable(t0, 1, 1);
        assert_eq!(g.deadline(), Some(t0 + Duration::from_secs(10)));
        assert!(g.overdue(t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(g.overdue(t0 + Duration::from_secs(10)), vec![2]);
        g.abandon();
        assert_eq!(g.deadline(), None);
    }

    #[test]
    fn a_generation_from_another_node_is_joined_echoed_or_a_conflict() {
        let t0 = Instant::now();
        let mut g = Generations::new(cfg(5));
        g.new_attempt(2);
        all_restartable(&mut g, 2, t0);
        assert_eq!(g.heard(1, Some(&[3])), Heard::Begins);
        assert_eq!(g.heard(2, Some(&[3])), Heard::Conflict, "one skipped");
        assert_eq!(g.heard(1, None), Heard::Conflict, "unreadable");
        // This node began generation 1 replacing rank 1: its own record is an echo, another
        // node's of the same generation a conflict.
        g.begin(t0, vec![1], vec![0]);
        g.ranks = vec![1];
        assert_eq!(g.heard(1, Some(&[1])), Heard::Echo);
        assert_eq!(g.heard(1, Some(&[3])), Heard::Conflict);
        assert_eq!(g.heard(0, Some(&[])), Heard::Echo);
        assert_eq!(g.heard(2, Some(&[2])), Heard::Begins);
    }

    #[test]
    fn a_rank_stepping_outside_the_wrapper_is_noted_once() {
        let t0 = Instant::now();
        let mut g = Generations::new(cfg(1));
        g.new_attempt(2);
        g.on_restartable(t0, 0, 0);
        assert!(!g.note_undeclared(0));
        assert!(g.note_undeclared(1));
        assert!(!g.note_undeclared(1), "once");
        let mut off = Generations::new(cfg(0));
        off.new_attempt(1);
        assert!(!off.note_undeclared(0));
    }

    #[test]
    fn a_new_attempt_starts_at_generation_zero_and_keeps_the_budget() {
        let t0 = Instant::now();
        let mut g = Generations::new(cfg(2));
        g.new_attempt(1);
        all_restartable(&mut g, 1, t0);
        g.begin(t0, vec![0], vec![]);
        g.new_attempt(1);
        assert_eq!((g.generation, g.used), (0, 1));
        assert_eq!(g.decide(), Err(Declined::NotRestartable(0)));
    }
}

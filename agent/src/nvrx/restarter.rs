//! NVRx's `[NestedRestarter] name=[InJob] state=...` lines: the state machine of NVRx's rank
//! monitor (`rank_monitor_state_machine.py`), fed with vigil's event-log records instead of the
//! monitor's IPC events. NVRx 0.4 logged it from the monitor of local rank 0 on the store host;
//! NVRx's functional scripts (`run_local_ddp_test_{heartbeats,sections}.sh`) grep the sequence.
//! Pure: a record in, the state's text out.

use vigil_events::log::Record;

/// NVRx's `RankMonitorState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Uninitialized,
    Initialize,
    HandlingStart,
    HandlingProcessing,
    HandlingCompleted,
    Finalized,
    Aborted,
}

impl State {
    /// The text NVRx logs on entering this state.
    pub fn text(self) -> &'static str {
        match self {
            State::Uninitialized => "",
            State::Initialize => "[NestedRestarter] name=[InJob] state=initialize",
            State::HandlingStart => "[NestedRestarter] name=[InJob] state=handling stage=starting",
            State::HandlingProcessing => {
                "[NestedRestarter] name=[InJob] state=handling stage=processing"
            }
            State::HandlingCompleted => {
                "[NestedRestarter] name=[InJob] state=handling stage=completed"
            }
            State::Finalized => "[NestedRestarter] name=[InJob] state=finalized",
            State::Aborted => "[NestedRestarter] name=[InJob] state=aborted",
        }
    }

    fn restarting(self) -> bool {
        matches!(self, State::HandlingStart | State::HandlingProcessing)
    }

    /// NVRx's `can_transition_to`.
    fn allows(self, next: State) -> bool {
        use State::*;
        match self {
            Uninitialized => matches!(next, Initialize | Finalized),
            Initialize => matches!(next, HandlingStart | Finalized),
            HandlingStart | HandlingProcessing => {
                matches!(next, HandlingCompleted | HandlingProcessing | Aborted)
            }
            HandlingCompleted => matches!(next, HandlingStart | Finalized),
            Aborted | Finalized => next == Finalized,
        }
    }
}

/// The monitor of local rank 0, as NVRx's state machine sees it.
#[derive(Debug, Clone)]
pub struct Restarter {
    state: State,
}

impl Default for Restarter {
    fn default() -> Self {
        Restarter {
            state: State::Uninitialized,
        }
    }
}

impl Restarter {
    pub fn state(&self) -> State {
        self.state
    }

    /// The state entered because of `rec`, if any. Mapping (NVRx event <- vigil record):
    /// the rank's first message <- local rank 0 `registered`; the rank's connection lost <- local
    /// rank 0 `rank_exited`; the periodic restart check (every `restart_check_interval` while a
    /// restart is under way) <- `restart`, once per restart; the monitor's shutdown signal <-
    /// `result` (the agent ends).
    pub fn observe(&mut self, rec: &Record) -> Option<State> {
        let next = match rec {
            Record::Registered { local_rank: 0, .. } => match self.state {
                State::Uninitialized => State::Initialize,
                s if s.restarting() => State::HandlingCompleted,
                _ => return None,
            },
            Record::RankExited { local_rank: 0, .. } => match self.state {
                State::Initialize | State::HandlingCompleted => State::HandlingStart,
                s if s.restarting() => State::Aborted,
                _ => return None,
            },
            Record::Restart { .. } if self.state.restarting() => State::HandlingProcessing,
            Record::Result { .. } => match self.state {
                State::Uninitialized => return None,
                s if s.restarting() => State::Aborted,
                _ => State::Finalized,
            },
            _ => return None,
        };
        // NVRx raises on a transition it does not allow; here it is only not logged.
        if !self.state.allows(next) {
            return None;
        }
        self.state = next;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_events::log::Outcome;

    fn reg(lr: u32) -> Record {
        Record::Registered {
            attempt: 0,
            local_rank: lr,
            rank: lr,
        }
    }
    fn exited(lr: u32) -> Record {
        Record::RankExited {
            attempt: 0,
            local_rank: lr,
            rank: lr,
            pid: 1,
            exit_code: Some(0),
            signal: None,
            expected: true,
        }
    }
    fn restart() -> Record {
        Record::Restart {
            from_attempt: 0,
            to_attempt: 1,
            restarts_left: 1,
            ran_ms: 0,
            backoff_ms: 0,
        }
    }
    fn result() -> Record {
        Record::Result {
            outcome: Outcome::Succeeded,
            exit_code: 0,
        }
    }

    fn run(recs: &[Record]) -> Vec<&'static str> {
        let mut r = Restarter::default();
        recs.iter()
            .filter_map(|x| r.observe(x))
            .map(|s| s.text().rsplit("state=").next().unwrap())
            .collect()
    }

    #[test]
    fn a_run_without_a_fault_initializes_then_ends_aborted_as_nvrx_logs_it() {
        let got = run(&[reg(0), reg(1), exited(1), exited(0), result()]);
        assert_eq!(got, ["initialize", "handling stage=starting", "aborted"]);
    }

    #[test]
    fn a_restart_goes_through_starting_processing_completed() {
        let got = run(&[reg(0), exited(0), restart(), reg(0), exited(0), result()]);
        assert_eq!(
            got,
            [
                "initialize",
                "handling stage=starting",
                "handling stage=processing",
                "handling stage=completed",
                "handling stage=starting",
                "aborted"
            ]
        );
    }

    #[test]
    fn other_local_ranks_and_a_job_without_a_client_print_nothing() {
        assert!(run(&[reg(1), exited(1), exited(0), result()]).is_empty());
    }

    #[test]
    fn an_agent_stopped_while_the_rank_runs_finalizes() {
        assert_eq!(run(&[reg(0), result()]), ["initialize", "finalized"]);
    }

    #[test]
    fn a_rank_lost_again_before_it_reconnects_aborts_and_nothing_follows_but_finalized() {
        let got = run(&[reg(0), exited(0), exited(0), reg(0), result()]);
        assert_eq!(
            got,
            [
                "initialize",
                "handling stage=starting",
                "aborted",
                "finalized"
            ]
        );
    }
}

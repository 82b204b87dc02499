//! The agent's counters, kept by counting the event log's records as the supervisor emits them:
//! attempts started, restarts, failed ranks, hangs by the timeout they ran past, ranks stopped by
//! why, and stops at an agreed step by their trigger. Records are not written on the heartbeat
//! path, so counting them costs the heartbeat nothing.

use std::collections::BTreeMap;

use vigil_events::log::{HangKind, Record, StopReason};

/// The `kind` label of a hang, every one there is (so each series exists from the start).
pub const HANG_KINDS: [&str; 4] = ["initial", "heartbeat", "section", "out_of_section"];

/// The `reason` label of stopped ranks, every one there is.
pub const STOP_REASONS: [&str; 5] = ["rank_failed", "rank_hung", "signal", "spawn_failed", "peer"];

fn hang_kind(k: &HangKind) -> &'static str {
    match k {
        HangKind::Initial => HANG_KINDS[0],
        HangKind::Heartbeat => HANG_KINDS[1],
        HangKind::Section(_) => HANG_KINDS[2],
        HangKind::OutOfSection => HANG_KINDS[3],
    }
}

fn stop_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::RankFailed => STOP_REASONS[0],
        StopReason::RankHung => STOP_REASONS[1],
        StopReason::Signal => STOP_REASONS[2],
        StopReason::SpawnFailed => STOP_REASONS[3],
        StopReason::Peer => STOP_REASONS[4],
    }
}

/// Stop triggers kept apart at most; later ones count under `other` (a label per trigger).
const MAX_TRIGGERS: usize = 32;

/// Counts since the agent started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// `attempt_start` records: attempts this node's ranks started.
    pub attempts: u64,
    /// `restart` records.
    pub restarts: u64,
    /// `generation` records: in-process restarts (a rank replaced alone, docs/inprocess.md).
    pub in_process_restarts: u64,
    /// `generation_recovered` records: their recovery times, summed, in seconds.
    pub in_process_recovery_s: f64,
    /// `generation_stepping` records: the time from a failure to every rank stepping again,
    /// summed, in seconds.
    pub in_process_stepping_s: f64,
    /// The generation this node's ranks are at in the current attempt (`generation` records;
    /// 0 at each attempt's start).
    pub generation: u64,
    /// `rank_exited` records of a rank that failed (not expected, not 0).
    pub rank_failures: u64,
    /// `hang` records, by [`HANG_KINDS`].
    pub hangs: [u64; 4],
    /// `stop` records, by [`STOP_REASONS`].
    pub rank_stops: [u64; 5],
    /// `stop_agreed` records, by trigger (`time-limit`, `SIGTERM`, `straggler`, ...).
    pub stop_decisions: BTreeMap<String, u64>,
    /// The coordinator with standbys: how many are ready to take a lost node's place, as the
    /// last `spares` or `standby_gone` record said (`None`: no standbys, or not the coordinator).
    pub spares_ready: Option<u32>,
}

impl Tally {
    /// Counts one record the agent wrote.
    pub fn on_record(&mut self, r: &Record) {
        match r {
            Record::AttemptStart { .. } => {
                self.attempts += 1;
                self.generation = 0;
            }
            Record::Restart { .. } => self.restarts += 1,
            Record::Generation { generation, .. } => {
                self.in_process_restarts += 1;
                self.generation = *generation;
            }
            Record::GenerationRecovered { seconds, .. } => self.in_process_recovery_s += seconds,
            Record::GenerationStepping { seconds, .. } => self.in_process_stepping_s += seconds,
            Record::RankExited {
                expected: false, ..
            } => self.rank_failures += 1,
            Record::Hang { hang, .. } => {
                let i = HANG_KINDS
                    .iter()
                    .position(|k| *k == hang_kind(&hang.timeout))
                    .unwrap_or(0);
                self.hangs[i] += 1;
            }
            Record::Stop { reason, .. } => {
                let i = STOP_REASONS
                    .iter()
                    .position(|k| *k == stop_reason(*reason))
                    .unwrap_or(0);
                self.rank_stops[i] += 1;
            }
            Record::Spares { ready, .. } | Record::StandbyGone { ready, .. } => {
                self.spares_ready = Some(*ready)
            }
            Record::StopAgreed { trigger, .. } => {
                let key = if self.stop_decisions.contains_key(trigger)
                    || self.stop_decisions.len() < MAX_TRIGGERS
                {
                    trigger.clone()
                } else {
                    "other".to_string()
                };
                *self.stop_decisions.entry(key).or_default() += 1;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_events::log::Hang;

    fn hang(timeout: HangKind) -> Record {
        Record::Hang {
            attempt: 0,
            local_rank: 0,
            rank: 0,
            pid: 1,
            hang: Hang {
                timeout,
                limit_ms: 1,
                silent_ms: 1,
                stopped: false,
                raised: None,
            },
        }
    }

    #[test]
    fn records_count_under_their_kind() {
        let mut t = Tally::default();
        for r in [
            Record::AttemptStart {
                attempt: 0,
                restart_count: 0,
                nproc: 2,
                rank_offset: 0,
                world_size: 2,
                restarts_left: 1,
            },
            Record::RankExited {
                attempt: 0,
                local_rank: 1,
                rank: 1,
                pid: 9,
                exit_code: Some(1),
                signal: None,
                expected: false,
            },
            Record::RankExited {
                attempt: 0,
                local_rank: 0,
                rank: 0,
                pid: 8,
                exit_code: None,
                signal: Some(15),
                expected: true,
            },
            hang(HangKind::Section("save".into())),
            hang(HangKind::Heartbeat),
            hang(HangKind::Section("step".into())),
            Record::Stop {
                attempt: 0,
                reason: StopReason::RankFailed,
                signal: 15,
                grace_ms: 1,
                pids: vec![8],
                killed: vec![],
                trigger: None,
            },
            Record::Restart {
                from_attempt: 0,
                to_attempt: 1,
                restarts_left: 0,
                ran_ms: 5,
                backoff_ms: 0,
            },
            Record::StopAgreed {
                attempt: 1,
                step: Some(9),
                trigger: "time-limit".into(),
            },
            Record::Suspended { seconds: 1.0 },
        ] {
            t.on_record(&r);
        }
        assert_eq!((t.attempts, t.restarts, t.rank_failures), (1, 1, 1));
        assert_eq!(t.hangs, [0, 1, 2, 0]);
        assert_eq!(t.rank_stops, [1, 0, 0, 0, 0]);
        assert_eq!(t.stop_decisions.get("time-limit"), Some(&1));
    }

    #[test]
    fn stop_triggers_are_bounded() {
        let mut t = Tally::default();
        for i in 0..(MAX_TRIGGERS + 5) {
            t.on_record(&Record::StopAgreed {
                attempt: 0,
                step: None,
                trigger: format!("t{i}"),
            });
        }
        t.on_record(&Record::StopAgreed {
            attempt: 0,
            step: None,
            trigger: "t0".into(),
        });
        assert_eq!(t.stop_decisions.len(), MAX_TRIGGERS + 1);
        assert_eq!(t.stop_decisions["other"], 5);
        assert_eq!(t.stop_decisions["t0"], 2);
    }
}

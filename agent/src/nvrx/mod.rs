//! What NVRx's `ft_launcher` writes that tools around it read, and vigil writes the same way:
//! the `[NestedRestarter] name=[InJob] state=...` console lines (`restarter.rs`, with
//! `--nvrx-restarter-log`, on when vigil runs as `ft_launcher`) and the per-cycle info files
//! (`cycle_info.rs`, `--cycle-info-dir`, ft_launcher's `--ft-cycle-info-dir`).
//!
//! It decides nothing: it only observes the supervisor's event-log records as the runtime
//! carries them out ([`Nvrx::observe`]) and returns the console text; writing the cycle files
//! is its only I/O.

pub mod cycle_info;
pub mod restarter;

use std::time::SystemTime;

use vigil_events::log::Record;

use cycle_info::{CycleInfoPlan, CycleInfoWriter};
use restarter::Restarter;

/// The launch plan's NVRx outputs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NvrxPlan {
    /// Print the `[NestedRestarter]` lines.
    pub restarter_log: bool,
    pub cycle_info: Option<CycleInfoPlan>,
    /// `--checkpoint-iteration-file` (absolute): read here, judged by the supervisor.
    pub progress_file: Option<std::path::PathBuf>,
}

/// What one record produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// A line for stdout (newline-terminated), where NVRx's monitor printed it.
    pub stdout: Option<String>,
    /// A problem to note (a cycle file that could not be written); the job goes on.
    pub note: Option<String>,
    /// The checkpoint iteration file's value, read as the job starts (`true`) or after a rank
    /// exited, for the supervisor (`Event::CheckpointIteration`).
    pub checkpoint: Option<(bool, Option<u64>)>,
}

/// NVRx's outputs of one node.
#[derive(Debug)]
pub struct Nvrx {
    /// Node rank 0 only, as NVRx logs it from the store host.
    restarter: Option<Restarter>,
    /// Node rank 0 only, NVRx's rendezvous host.
    cycles: Option<CycleInfoWriter>,
    env: Option<(String, String)>,
    progress_file: Option<std::path::PathBuf>,
}

impl Nvrx {
    /// `hosts`: the active nodes' host names as far as this node knows them.
    pub fn new(plan: &NvrxPlan, node_rank: u32, hosts: &[String], active_nodes: u32) -> Self {
        let host0 = node_rank == 0;
        Nvrx {
            restarter: (host0 && plan.restarter_log).then(Restarter::default),
            cycles: plan.cycle_info.clone().filter(|_| host0).map(|p| {
                let ranks: Vec<u32> = (0..active_nodes).collect();
                CycleInfoWriter::new(p, cycle_info::nodelist(hosts), cycle_info::ranks(&ranks))
            }),
            progress_file: plan.progress_file.clone(),
            env: plan.cycle_info.as_ref().map(|p| {
                (
                    "NVRX_CURRENT_CYCLE_INFO".to_string(),
                    p.current_link().to_string_lossy().into_owned(),
                )
            }),
        }
    }

    /// Node rank 0: the hosts of the cycle about to start, as the rendezvous joined them.
    pub fn set_hosts(&mut self, active: &[String], standby: &[String]) {
        if let Some(w) = self.cycles.as_mut() {
            w.set_nodes(active, standby);
        }
    }

    /// What a rank's environment gets: `NVRX_CURRENT_CYCLE_INFO` with `--cycle-info-dir`.
    pub fn rank_env(&self) -> Option<(String, String)> {
        self.env.clone()
    }

    /// A record the runtime carries out, at `now`.
    pub fn observe(&mut self, rec: &Record, now: SystemTime) -> Observed {
        let mut out = Observed::default();
        if let Some(state) = self.restarter.as_mut().and_then(|r| r.observe(rec)) {
            out.stdout = Some(format!(
                "[{}] [ALWAYS] [RankMonServer.Restarter] {}\n",
                asctime(now),
                state.text()
            ));
        }
        if let Some(path) = &self.progress_file {
            out.checkpoint = match rec {
                Record::AttemptStart { attempt: 0, .. } => Some((true, read_iteration(path))),
                Record::RankExited { .. } => Some((false, read_iteration(path))),
                _ => None,
            };
        }
        if let Some(w) = self.cycles.as_mut() {
            let at = cycle_info::utc_iso(now);
            let done = match rec {
                Record::AttemptStart { attempt, .. } => w.start(*attempt, &at),
                Record::AttemptEnded { .. } | Record::Result { .. } => w.end(&at),
                _ => Ok(()),
            };
            if let Err(e) = done {
                out.note = Some(format!("cannot write NVRx's cycle info file: {e}"));
            }
        }
        out
    }
}

/// The checkpoint iteration file's integer, as NVRx reads it (whitespace trimmed); `None` when
/// it is missing, empty or no number. Only its first 64 bytes are read: a FIFO or a huge file
/// costs nothing.
fn read_iteration(path: &std::path::Path) -> Option<u64> {
    use std::io::Read;
    // Asked before opening: opening a FIFO would wait for a writer.
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(64).read_to_end(&mut buf).ok()?;
    std::str::from_utf8(&buf).ok()?.trim().parse().ok()
}

/// Python logging's `asctime`: local time, `2024-11-26 14:30:00,123`.
fn asctime(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`, which lives for the call.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return humantime::format_rfc3339_millis(t).to_string();
        }
        tm
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02},{:03}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_events::log::Outcome;

    #[test]
    fn restarter_lines_come_from_node_rank_0_only_and_look_like_nvrx() {
        let plan = NvrxPlan {
            restarter_log: true,
            ..NvrxPlan::default()
        };
        let reg = Record::Registered {
            attempt: 0,
            local_rank: 0,
            rank: 0,
        };
        let mut other = Nvrx::new(&plan, 1, &[], 2);
        assert_eq!(other.observe(&reg, SystemTime::now()), Observed::default());
        let mut n0 = Nvrx::new(&plan, 0, &[], 2);
        let line = n0.observe(&reg, SystemTime::now()).stdout.unwrap();
        let (stamp, rest) = line.split_once("] ").unwrap();
        assert_eq!(stamp.len(), "[2024-11-26 14:30:00,123".len(), "{line}");
        assert_eq!(
            rest,
            "[ALWAYS] [RankMonServer.Restarter] [NestedRestarter] name=[InJob] state=initialize\n"
        );
        assert_eq!(n0.rank_env(), None);
        let end = Record::Result {
            outcome: Outcome::Succeeded,
            exit_code: 0,
        };
        assert!(n0
            .observe(&end, SystemTime::now())
            .stdout
            .unwrap()
            .ends_with("state=finalized\n"));
    }

    #[test]
    fn off_by_default() {
        let mut n = Nvrx::new(&NvrxPlan::default(), 0, &[], 1);
        let reg = Record::Registered {
            attempt: 0,
            local_rank: 0,
            rank: 0,
        };
        assert_eq!(n.observe(&reg, SystemTime::now()), Observed::default());
    }
}

//! The agent's end, once the supervisor gave its outcome: the ranks' last output and steps,
//! leaving the job, nothing left running, the last text, and on node rank 0 the ledger and the
//! requeue. Returns the agent's exit status.

use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;

use super::agent::Agent;
use super::allocation;
use super::dispatch::{Dispatcher, Sources};
use super::ending;
use super::ipc_server::FromRanks;
use super::output::{self, ConsoleStream};
use super::report::{self, note_refused};
use super::startup::Closing;
use super::summary::{self, FailedRank};
use super::DRAIN_TIMEOUT;
use crate::supervise::{JobEnd, JobRequest, Outcome, Supervisor};

/// The most of a rank's error file (torch's `error.json`) read.
const ERROR_FILE_LIMIT: u64 = 4 << 20;

pub(super) async fn finish(mut d: Dispatcher, mut src: Sources, closing: Closing) -> i32 {
    if let Some(n) = d.refused.due(Instant::now(), true) {
        note_refused(n);
    }
    let outcome = d.agent.outcome.clone().unwrap_or(Outcome::Succeeded);
    // Slurm SIGKILLs the whole job `KillWait` (30 s by default, 5 s on some clusters) after a
    // SIGTERM: the record is written before the wait for output and peers, not after.
    let mut status = None;
    if allocation::record_before_leaving(&outcome) {
        count_late_steps(&mut src.ipc, &mut d.sup);
        status = conclude_here(&d, (closing.head_keys.as_ref(), closing.started), &outcome);
    }
    let readers = std::mem::take(&mut d.agent.ranks.readers);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        for r in readers {
            let _ = r.await;
        }
    })
    .await;
    count_late_steps(&mut src.ipc, &mut d.sup);
    // The last steps, late ones included, under the attempt they were reached in.
    let (now, _) = d.clock.wake();
    d.log_steps(now);
    leave(&mut d, closing.coordinator).await;
    // Nothing the ranks started outlives the agent, whichever way the job ended.
    d.agent.sweep(d.sup.attempt());
    d.agent.ranks.containment.remove();
    let (job_now, _) = d.clock.wake();
    if matches!(outcome, Outcome::Failed { .. } | Outcome::NoProgress { .. }) {
        let text = failure_summary(&d.agent, &d.sup, job_now);
        output::console_text(ConsoleStream::Stderr, &text);
    }
    if let Some(text) = report::ending(&outcome, &d.agent.cfg) {
        output::console_text(ConsoleStream::Stderr, &text);
    }
    let status = match status {
        Some(s) => s,
        None => conclude_here(&d, (closing.head_keys.as_ref(), closing.started), &outcome)
            .unwrap_or_else(|| outcome.exit_code()),
    };
    // After the ledger: node rank 0's last page counts this allocation's decision.
    if let Some(m) = &mut d.metrics {
        m.at_exit(&d.sup, &d.agent.links.gpus, job_now).await;
    }
    drop(closing.server);
    status
}

/// Node rank 0 (or the coordinating node, or a survivor of node rank 0's loss) records the
/// allocation and requeues it: its exit status. Other nodes: `None`.
fn conclude_here(
    d: &Dispatcher,
    (keys, started): (Option<&vigil_store::KeySpace>, SystemTime),
    outcome: &Outcome,
) -> Option<i32> {
    ending::of(&d.agent, &d.sup, &d.endw, (keys, started), outcome).map(allocation::conclude)
}

/// A rank's last steps may still sit in its socket when its exit was reaped first: count them,
/// so the ledger's highest step is the one the ranks reached.
fn count_late_steps(ipc: &mut mpsc::Receiver<FromRanks>, sup: &mut Supervisor) {
    while let Ok(m) = ipc.try_recv() {
        if let FromRanks::Message {
            attempt,
            local_rank,
            msg,
            at,
        } = m
        {
            if attempt == sup.attempt() {
                sup.note_late_step(at, local_rank, &msg);
            }
        }
    }
}

/// Leaves the job when the supervisor decided to, with this node's highest step.
async fn leave(d: &mut Dispatcher, coordinator: tokio::task::JoinHandle<()>) {
    let Some(mut leave) = d.agent.leave.take() else {
        return;
    };
    if let JobRequest::Leave { highest_step, .. } = &mut leave {
        *highest_step = d.sup.highest_step();
    }
    // The coordinator returns once this node has left the job (node rank 0: once the others
    // have, or one node timeout).
    if d.agent.links.coord.send(leave).is_ok() {
        let bound = d.agent.cfg.node_timeout + Duration::from_secs(1);
        let _ = tokio::time::timeout(bound, coordinator).await;
    }
}

/// The failure summary: every rank that failed on its own in the last attempt, with its error
/// file, stacks and last output; or the node where the job failed, when it was not here.
fn failure_summary(agent: &Agent, sup: &Supervisor, now_i: Instant) -> String {
    let now_s = SystemTime::now();
    let failed: Vec<FailedRank> = sup
        .failures()
        .iter()
        .map(|f| {
            let dir = agent.attempt_dir(f.attempt, f.local_rank);
            let error_path = dir.join("error.json");
            // The rank writes it: a regular file, bounded, or nothing.
            let error = vigil_bounded::read_string(&error_path, ERROR_FILE_LIMIT)
                .ok()
                .and_then(|t| summary::parse_error_file(&t));
            let when = now_s - now_i.saturating_duration_since(f.at);
            let stacks = agent
                .ranks
                .stack_reports
                .iter()
                .find(|(c, lr, _)| *c == f.attempt && *lr == f.local_rank)
                .map(|(_, _, r)| r.clone());
            FailedRank {
                time: humantime::format_rfc3339_seconds(when).to_string(),
                host: agent.host.clone(),
                rank: f.rank,
                local_rank: f.local_rank,
                how: f.how,
                hang: f.hang.clone(),
                stacks,
                pid: f.pid,
                logs: Some(dir.to_string_lossy().into_owned()),
                error_file: error
                    .as_ref()
                    .map(|_| error_path.to_string_lossy().into_owned()),
                error,
                stderr_tail: agent
                    .ranks
                    .tails
                    .get(f.local_rank as usize)
                    .map(|t| t.borrow().iter().cloned().collect())
                    .unwrap_or_default(),
            }
        })
        .collect();
    let elsewhere = match &agent.trail.peer_end {
        Some(JobEnd::Failed { node, reason }) if failed.is_empty() => Some(format!(
            "on node {node}: {reason} (its agent's log has the details)"
        )),
        _ => None,
    };
    summary::render(
        &agent.cfg.entrypoint_name,
        sup.attempt(),
        &failed,
        elsewhere.as_deref(),
    )
}

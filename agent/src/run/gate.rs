//! Before each rendezvous: wait (bounded) for the ranks' GPUs to release their memory (from the
//! second attempt on) and run the node's health checks (`--health-check`). The work is blocking
//! (NVML, a storage probe that may hang on a dead file system), so it runs on a thread of its
//! own while the event loop goes on; what it found comes back to the loop as `FromGate`s, in order.

use std::time::Instant;

use tokio::sync::mpsc;

use super::effect::Effect;
use crate::perf::gpu::{reclaim, GpuProcess, GpuSource};
use crate::perf::{health, numa, GpuConfig};
use crate::supervise::{Event, JobRequest, Record};

pub(super) enum FromGate {
    /// An event for the event log, with its console line if any.
    Record(Record, Option<String>),
    /// The node passed: join the rendezvous.
    Join(JobRequest),
    /// The node failed its health check: the supervisor ends asking to requeue without it.
    Unfit(String),
    /// Hot spares: the health check's verdict, for the join record (an unfit node stays a
    /// member, never given ranks, instead of ending the job).
    Health(bool),
}

/// Whether joining attempt `attempt` waits for the gate at all.
pub(super) fn wanted(g: &GpuConfig, attempt: u32) -> bool {
    g.health_check || (attempt > 0 && !g.reclaim_timeout.is_zero())
}

pub(super) fn start(
    g: GpuConfig,
    nproc: u32,
    node_rank: u32,
    spares: bool,
    req: JobRequest,
    tx: mpsc::UnboundedSender<FromGate>,
) {
    let JobRequest::Join { attempt, .. } = &req else {
        let _ = tx.send(FromGate::Join(req));
        return;
    };
    let attempt = *attempt;
    tokio::task::spawn_local(async move {
        if attempt > 0 && !g.reclaim_timeout.is_zero() {
            let (g2, tx2) = (g.clone(), tx.clone());
            let held = move |gpus: &[u32], holders: &[GpuProcess]| {
                let v = Record::GpuMemoryHeld {
                    attempt,
                    gpus: gpus.to_vec(),
                    holders: holders.iter().map(holder).collect(),
                };
                let line = format!(
                    "waiting up to {}s for GPU(s) {gpus:?} to release their memory before attempt {attempt}",
                    g2.reclaim_timeout.as_secs_f64()
                );
                let _ = tx2.send(FromGate::Record(v, Some(line)));
            };
            let g3 = g.clone();
            let waited = off_loop(move || wait_released(&g3, nproc, held)).await;
            if let Some(Some(o)) = waited {
                let v = Record::GpuMemoryWait {
                    attempt,
                    gpus: o.gpus.clone(),
                    waited_ms: o.waited_ms,
                    released: o.released,
                    holders: o.holders.iter().map(holder).collect(),
                };
                let _ = tx.send(FromGate::Record(v, o.console_line(g.reclaim_timeout)));
            }
        }
        if g.health_check {
            let opts = g.health_options();
            let report = off_loop(move || health::run_checks(&opts))
                .await
                .unwrap_or_else(|| health::HealthReport {
                    // Fails closed: checks that could not run vouch for nothing.
                    checks: vec![health::Check {
                        name: "health",
                        status: health::Status::Fail,
                        detail: "the checks could not run (no thread)".into(),
                    }],
                });
            let v = health_record(attempt, &report);
            if spares {
                let line = (!report.healthy()).then(|| format!(
                    "node {node_rank} failed its health check before attempt {attempt} ({}); with standbys in the job it runs no ranks until it passes",
                    report.failures()
                ));
                let _ = tx.send(FromGate::Record(v, line));
                let _ = tx.send(FromGate::Health(report.healthy()));
                let _ = tx.send(FromGate::Join(req));
                return;
            }
            if !report.healthy() {
                let reason = format!(
                    "node {node_rank} failed its health check before attempt {attempt} ({}); requeue without this node",
                    report.failures()
                );
                let _ = tx.send(FromGate::Record(v, Some(reason.clone())));
                let _ = tx.send(FromGate::Unfit(reason));
                return;
            }
            let _ = tx.send(FromGate::Record(v, None));
        }
        let _ = tx.send(FromGate::Join(req));
    });
}

/// Runs `work` on a thread of its own. Not tokio's blocking pool: the runtime waits for that
/// when it shuts down, and an agent stopped by a signal must not wait out a 50 s reclaim wait or
/// a storage probe stuck on a dead file system.
async fn off_loop<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("vigil-gate".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .ok()?;
    rx.await.ok()
}

/// The reclaim wait (blocking): `None` when there is nothing to wait for (no NVML, no GPU).
fn wait_released(
    g: &GpuConfig,
    nproc: u32,
    on_held: impl FnOnce(&[u32], &[GpuProcess]),
) -> Option<reclaim::ReclaimOutcome> {
    let src = GpuSource::open(g.nvml_lib.as_deref()).ok()?;
    let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let mut gpus: Vec<u32> = numa::rank_gpus(&src, nproc, cvd.as_deref())
        .into_iter()
        .flatten()
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    if gpus.is_empty() {
        return None;
    }
    let started = Instant::now();
    let mut on_held = Some(on_held);
    loop {
        let (held, holders) = reclaim::look(&src, &gpus, g.reclaim_tolerance_mib);
        if !held.is_empty() {
            if let Some(f) = on_held.take() {
                f(&held, &holders);
            }
        }
        if held.is_empty() || started.elapsed() >= g.reclaim_timeout {
            return Some(reclaim::outcome(&gpus, started, &held, holders));
        }
        let left = g.reclaim_timeout.saturating_sub(started.elapsed());
        std::thread::sleep(g.reclaim_poll.min(left));
    }
}

/// A process holding GPU memory, as the event log names it.
fn holder(p: &GpuProcess) -> vigil_events::log::GpuHolder {
    vigil_events::log::GpuHolder {
        gpu: p.gpu,
        pid: p.pid,
        name: p.name.clone(),
        mib: p.mib,
    }
}

/// The `health_check` record of the checks before attempt `attempt`.
fn health_record(attempt: u32, report: &health::HealthReport) -> Record {
    let status = |s: health::Status| match s {
        health::Status::Pass => "pass",
        health::Status::Fail => "fail",
        health::Status::Skip => "skip",
    };
    Record::HealthCheck {
        attempt,
        healthy: report.healthy(),
        failed: report.failed().iter().map(|n| n.to_string()).collect(),
        checks: report
            .checks
            .iter()
            .map(|c| vigil_events::log::HealthCheck {
                name: c.name.to_string(),
                status: status(c.status).into(),
                detail: c.detail.clone(),
            })
            .collect(),
    }
}

/// What the loop does with what the gate found.
pub(super) fn effects(out: FromGate) -> Vec<Effect> {
    match out {
        FromGate::Record(v, line) => line
            .map(Effect::Note)
            .into_iter()
            .chain([Effect::Write(v)])
            .collect(),
        FromGate::Join(req) => vec![Effect::Send(req)],
        FromGate::Health(healthy) => vec![Effect::Send(JobRequest::Health { healthy })],
        FromGate::Unfit(reason) => vec![Effect::Event(Event::NodeFault {
            reason,
            at_gate: true,
        })],
    }
}

//! The node's GPUs, watched from the agent (the edge of `perf::gpu`): NVML samples every few
//! seconds, which explain a straggler's step times, and XID events. A critical XID or a fault in a
//! sample (an uncorrectable ECC error, a row-remapping failure) on a GPU a rank uses becomes
//! `Event::NodeFault`; the supervisor decides what that means. No NVML: nothing runs and the event
//! log says why once.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::effect::Effect;
use crate::perf::gpu::{self, GpuEvent, GpuSample, GpuSource, XidWatcher};
use crate::supervise::{Event, Record};

/// How often the node's GPUs are sampled.
pub(super) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// What the GPU threads tell the event loop.
pub(super) enum FromGpu {
    /// Telemetry is on, for these GPUs (uuids by index).
    On {
        count: usize,
    },
    /// No telemetry on this node, and why.
    Off(String),
    /// A sample shows the GPU cannot be used any more.
    Fault {
        gpu: u32,
        why: String,
    },
    Xid(GpuEvent),
}

pub(super) struct GpuWatch {
    latest: Arc<Mutex<Vec<GpuSample>>>,
    uuids: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    /// The agent's CUDA_VISIBLE_DEVICES, which its ranks inherit.
    visible: Option<String>,
}

impl GpuWatch {
    pub(super) fn start(lib: Option<PathBuf>, tx: mpsc::UnboundedSender<FromGpu>) -> GpuWatch {
        let latest = Arc::new(Mutex::new(Vec::new()));
        let uuids = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, u, s, t) = (latest.clone(), uuids.clone(), stop.clone(), tx.clone());
        let sampler_lib = lib.clone();
        let started = std::thread::Builder::new()
            .name("vigil-gpu".into())
            .spawn(move || sample_loop(sampler_lib, l, u, s, t));
        if let Err(e) = started {
            let _ = tx.send(FromGpu::Off(format!(
                "cannot start the GPU sampler thread: {e}"
            )));
        }
        GpuWatch {
            latest,
            uuids,
            stop,
            visible: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        }
    }

    /// The GPU a local rank uses, when known.
    pub(super) fn gpu_of(&self, local_rank: u32) -> Option<u32> {
        let uuids = self.uuids.lock().ok()?;
        gpu::rank_gpu(local_rank, self.visible.as_deref(), &uuids)
    }

    /// The GPU a local rank uses and its UUID, when known (the metrics page's labels).
    pub(super) fn gpu_and_uuid(&self, local_rank: u32) -> Option<(u32, String)> {
        let uuids = self.uuids.lock().ok()?;
        let g = gpu::rank_gpu(local_rank, self.visible.as_deref(), &uuids)?;
        Some((g, uuids.get(g as usize)?.clone()))
    }

    /// What a local rank's GPU was doing at the last sample (`GPU 1: SM clock ...`).
    pub(super) fn explain(&self, local_rank: u32) -> Option<String> {
        let latest = self.latest.lock().ok()?;
        gpu::rank_text(local_rank, self.visible.as_deref(), &latest)
    }

    /// Whether GPU `g` is one of the ranks' (or which GPU a rank uses is unknown).
    pub(super) fn used_by_ranks(&self, g: u32, nproc: u32) -> bool {
        let used: Vec<Option<u32>> = (0..nproc).map(|lr| self.gpu_of(lr)).collect();
        used.iter().any(|u| u.is_none() || *u == Some(g))
    }
}

impl Drop for GpuWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn sample_loop(
    lib: Option<PathBuf>,
    latest: Arc<Mutex<Vec<GpuSample>>>,
    uuids: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    tx: mpsc::UnboundedSender<FromGpu>,
) {
    let src = match GpuSource::open(lib.as_deref()) {
        Ok(s) => s,
        Err(off) => {
            let _ = tx.send(FromGpu::Off(off.to_string()));
            return;
        }
    };
    let ids = src.uuids();
    if ids.is_empty() {
        let _ = tx.send(FromGpu::Off("NVML sees no GPU on this node".into()));
        return;
    }
    let _ = tx.send(FromGpu::On { count: ids.len() });
    // Started here, off the event loop: NVML's start can take a while on a real node. Stopped
    // when this thread ends.
    let xid_tx = tx.clone();
    let _xids: Option<XidWatcher> = gpu::watch_xids(lib.as_deref(), move |ev| {
        let _ = xid_tx.send(FromGpu::Xid(ev));
    })
    .ok();
    if let Ok(mut u) = uuids.lock() {
        *u = ids;
    }
    let mut faulted = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let samples = src.sample_all();
        for s in &samples {
            if let Some(why) = gpu::fault(s) {
                if !faulted.contains(&s.index) {
                    faulted.push(s.index);
                    let _ = tx.send(FromGpu::Fault { gpu: s.index, why });
                }
            }
        }
        if let Ok(mut l) = latest.lock() {
            *l = samples;
        }
        // Short naps, so the agent's end is not held up by a sleeping sampler.
        let until = Instant::now() + SAMPLE_EVERY;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        if tx.is_closed() {
            return;
        }
    }
}

impl GpuWatch {
    /// What the GPU threads found: records, and a node fault for the supervisor when a GPU one
    /// of the `nproc` ranks uses cannot be used any more.
    pub(super) fn effects(&self, m: FromGpu, nproc: u32) -> Vec<Effect> {
        match m {
            FromGpu::On { count } => vec![Effect::Write(Record::GpuTelemetry {
                on: true,
                gpus: Some(count),
                why: None,
            })],
            FromGpu::Off(why) => vec![Effect::Write(Record::GpuTelemetry {
                on: false,
                gpus: None,
                why: Some(why),
            })],
            FromGpu::Fault { gpu, why } => {
                if !self.used_by_ranks(gpu, nproc) {
                    return vec![Effect::Note(format!(
                        "GPU {gpu}, which no rank uses, is faulty: {why}"
                    ))];
                }
                vec![Effect::Event(Event::NodeFault {
                    reason: format!("GPU {gpu}: {why}"),
                    at_gate: false,
                })]
            }
            FromGpu::Xid(ev) => {
                let record = Effect::Write(Record::GpuXid {
                    gpu: ev.gpu,
                    xid: ev.xid,
                    critical: ev.critical,
                    text: ev.text.clone(),
                });
                let then = if !ev.critical {
                    Effect::Note(format!("GPU {}: XID {} ({})", ev.gpu, ev.xid, ev.text))
                } else if !self.used_by_ranks(ev.gpu, nproc) {
                    Effect::Note(format!(
                        "GPU {}, which no rank uses: critical XID {} ({})",
                        ev.gpu, ev.xid, ev.text
                    ))
                } else {
                    Effect::Event(Event::NodeFault {
                        reason: format!("GPU {}: critical XID {} ({})", ev.gpu, ev.xid, ev.text),
                        at_gate: false,
                    })
                };
                vec![record, then]
            }
        }
    }
}

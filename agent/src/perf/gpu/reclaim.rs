//! Between attempts: wait (bounded) until the GPUs of this node's ranks have released their
//! memory, as ft_launcher's `gpu_memory_reclaim_timeout` / `gpu_memory_tolerance_mb` do, so that
//! the next attempt does not start on GPUs a dying rank (or a leftover child) still fills.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{GpuProcess, GpuSample, GpuSource};

/// How a wait ended: the `gpu_memory_wait` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReclaimOutcome {
    pub gpus: Vec<u32>,
    pub waited_ms: u64,
    pub released: bool,
    /// Who still held memory on a GPU over the tolerance when the wait ended.
    pub holders: Vec<GpuProcess>,
}

impl ReclaimOutcome {
    pub fn record(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["event"] = "gpu_memory_wait".into();
        v
    }

    /// The console line for a wait that did not end in release.
    pub fn console_line(&self, timeout: Duration) -> Option<String> {
        if self.released {
            return None;
        }
        let who = if self.holders.is_empty() {
            "no process NVML can name".to_string()
        } else {
            self.holders
                .iter()
                .map(|p| {
                    let name = if p.name.is_empty() { "?" } else { &p.name };
                    format!("pid {} ({name}) {} MiB on GPU {}", p.pid, p.mib, p.gpu)
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        Some(format!(
            "GPU memory not released after {}s (--gpu-memory-reclaim-timeout): held by {who}; starting the next attempt anyway",
            timeout.as_secs_f64()
        ))
    }
}

/// Of `gpus`, those whose used memory is over `tolerance_mib` (pure). A GPU without a sample or
/// without memory figures counts as released: nothing can be waited for there.
pub fn still_held(samples: &[GpuSample], gpus: &[u32], tolerance_mib: u64) -> Vec<u32> {
    gpus.iter()
        .copied()
        .filter(|g| {
            samples
                .iter()
                .find(|s| s.index == *g)
                .and_then(|s| s.mem_used_mib)
                .is_some_and(|used| used > tolerance_mib)
        })
        .collect()
}

/// One look: the GPUs still held and who holds them.
pub fn look(src: &GpuSource, gpus: &[u32], tolerance_mib: u64) -> (Vec<u32>, Vec<GpuProcess>) {
    let samples: Vec<GpuSample> = gpus.iter().filter_map(|g| src.sample(*g).ok()).collect();
    let held = still_held(&samples, gpus, tolerance_mib);
    let holders = held.iter().flat_map(|g| src.processes(*g)).collect();
    (held, holders)
}

/// The outcome after `started`, from the last look.
pub fn outcome(
    gpus: &[u32],
    started: Instant,
    held: &[u32],
    holders: Vec<GpuProcess>,
) -> ReclaimOutcome {
    ReclaimOutcome {
        gpus: gpus.to_vec(),
        waited_ms: started.elapsed().as_millis() as u64,
        released: held.is_empty(),
        holders: if held.is_empty() { vec![] } else { holders },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(index: u32, used: Option<u64>) -> GpuSample {
        GpuSample {
            index,
            mem_used_mib: used,
            ..Default::default()
        }
    }

    #[test]
    fn held_over_tolerance_only() {
        let samples = [s(0, Some(600)), s(1, Some(100)), s(2, None)];
        assert_eq!(still_held(&samples, &[0, 1, 2, 3], 512), vec![0]);
        assert_eq!(still_held(&samples, &[1], 512), Vec::<u32>::new());
        assert_eq!(still_held(&samples, &[0], 1024), Vec::<u32>::new());
    }

    #[test]
    fn outcome_names_holders() {
        let o = ReclaimOutcome {
            gpus: vec![0],
            waited_ms: 5000,
            released: false,
            holders: vec![GpuProcess {
                gpu: 0,
                pid: 7,
                name: "sleep".into(),
                mib: 2048,
            }],
        };
        let line = o.console_line(Duration::from_secs(5)).unwrap();
        assert!(
            line.contains("held by pid 7 (sleep) 2048 MiB on GPU 0"),
            "{line}"
        );
        assert_eq!(o.record()["event"], "gpu_memory_wait");
        assert_eq!(o.record()["holders"][0]["name"], "sleep");
    }
}

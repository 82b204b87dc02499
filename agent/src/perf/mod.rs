//! Facts about the node's accelerators: NVML telemetry (`gpu`), node health checks (`health`),
//! NUMA binding (`numa`). Straggler scores live here too (ARCHITECTURE.md, "Where the next
//! capabilities go").

pub mod gpu;
pub mod health;
pub mod numa;
pub mod straggler;

use std::path::PathBuf;
use std::time::Duration;

/// The GPU side of `vigil run` (its flags, resolved).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuConfig {
    /// `--nvml-lib`, else `$VIGIL_NVML_LIB` (`None`: the driver's).
    pub nvml_lib: Option<PathBuf>,
    /// `--health-check`: `vigil health`'s checks before each rendezvous.
    pub health_check: bool,
    pub health_storage: Vec<PathBuf>,
    /// Between attempts, the longest wait for the ranks' GPUs to release their memory (zero: none).
    pub reclaim_timeout: Duration,
    pub reclaim_tolerance_mib: u64,
    pub reclaim_poll: Duration,
    pub numa: Option<numa::Mode>,
    /// With `numa`: memory only from the GPU's node (else preferably from it).
    pub numa_strict: bool,
}

impl GpuConfig {
    /// The health checks `--health-check` runs.
    pub fn health_options(&self) -> health::HealthOptions {
        health::HealthOptions {
            nvml_lib: self.nvml_lib.clone(),
            storage_paths: self.health_storage.clone(),
            ..Default::default()
        }
    }
}

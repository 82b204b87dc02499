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
    pub fn from_args(a: &crate::cli::RunArgs) -> Result<GpuConfig, String> {
        Ok(GpuConfig {
            nvml_lib: gpu::nvml_lib(a.nvml_lib.as_deref()),
            health_check: a.health_check,
            health_storage: a.health_storage_path.clone(),
            reclaim_timeout: Duration::from_secs_f64(a.gpu_memory_reclaim_timeout),
            reclaim_tolerance_mib: a.gpu_memory_tolerance_mb as u64,
            reclaim_poll: Duration::from_secs_f64(a.gpu_memory_poll_interval.max(0.05)),
            numa: a
                .numa_binding
                .as_deref()
                .map(numa::Mode::parse)
                .transpose()?,
            numa_strict: a.numa_bind_strict,
        })
    }

    /// The health checks `--health-check` runs.
    pub fn health_options(&self) -> health::HealthOptions {
        health::HealthOptions {
            nvml_lib: self.nvml_lib.clone(),
            storage_paths: self.health_storage.clone(),
            ..Default::default()
        }
    }
}

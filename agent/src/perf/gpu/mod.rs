//! GPU facts from NVML, loaded at run time: a machine without an NVIDIA driver simply has none,
//! and every GPU feature then says plainly that it is off.
//!
//! How to use it (the agent's event loop, `vigil health`):
//!
//! ```ignore
//! use vigil::perf::gpu::{self, GpuSource};
//! // --nvml-lib PATH, else $VIGIL_NVML_LIB, else the system's libnvidia-ml.so.1.
//! let src = match GpuSource::open(gpu::nvml_lib(cli_flag).as_deref()) {
//!     Ok(s) => s,
//!     Err(off) => { eprintln!("[vigil] {off}"); return } // "GPU telemetry off: ..."
//! };
//! let samples: Vec<GpuSample> = src.sample_all();       // one NVML pass over every GPU
//! let gpu = gpu::rank_gpu(local_rank, cuda_visible.as_deref(), &uuids); // rank -> GPU index
//! let why: String = gpu::explain(&samples[i]);           // "SM clock 1,110 of 1,980 MHz, ..."
//! let dead: Option<String> = gpu::fault(&samples[i]);    // the node is unusable: requeue without it
//! let watcher = gpu::watch_xids(lib, |ev: GpuEvent| ...); // a thread; ev.critical -> node fault
//! let holders = src.processes(i);                         // who holds memory (pid, name, MiB)
//! let text = gpu::rank_text(local_rank, cvd.as_deref(), &samples); // "GPU 1: SM clock ..."
//! ```
//!
//! `GpuSource` is cheap to keep open for the agent's life and is `Send`; sampling 8 GPUs is a few
//! dozen NVML calls (docs/benchmarks.md). Everything here but `nvml.rs` is pure.

mod explain;
mod nvml;
pub mod reclaim;

pub use explain::{
    bus_id_sysfs, explain, fault, parse_cpu_list, rank_gpu, rank_text, throttle_names,
    xid_critical, xid_text, CRITICAL_XIDS,
};
pub use nvml::{
    node_cpus, numa_node_of, nvml_lib, watch_xids, GpuError, GpuSource, NvmlOff, XidWatcher,
};

use serde::{Deserialize, Serialize};

/// One GPU at one moment. Every value is optional: not every GPU (or driver) exposes all.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub pci_bus_id: Option<String>,
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    /// NVML's clock throttle (clock event) reasons bit mask.
    pub throttle_mask: Option<u64>,
    /// `throttle_mask`'s bits by name (`HW slowdown`, `power brake`...).
    pub throttle: Vec<String>,
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub temperature_c: Option<u32>,
    pub util_pct: Option<u32>,
    pub mem_used_mib: Option<u64>,
    pub mem_total_mib: Option<u64>,
    pub ecc_uncorrected_volatile: Option<u64>,
    pub ecc_uncorrected_aggregate: Option<u64>,
    pub retired_pages_pending: Option<bool>,
    pub remapped_rows: Option<RemappedRows>,
    pub pcie_replay: Option<u32>,
    /// Sum of the NVLink error counters (replay, recovery, CRC) over the active links.
    pub nvlink_errors: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

/// An XID event from NVML on one of this node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuEvent {
    pub gpu: u32,
    pub xid: u64,
    /// The GPU needs a reset or replacing (`CRITICAL_XIDS`): the node is unusable.
    pub critical: bool,
    pub text: String,
}

/// A process holding memory on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub gpu: u32,
    pub pid: u32,
    /// From /proc/<pid>/comm; empty when the process is gone or in another pid namespace.
    pub name: String,
    pub mib: u64,
}

/// Number of NVIDIA GPUs on this node, or why it cannot be known.
pub fn gpu_count() -> Result<u32, GpuError> {
    gpu_count_with(None)
}

/// As `gpu_count`, through `--nvml-lib` (`lib`) when given.
pub fn gpu_count_with(lib: Option<&std::path::Path>) -> Result<u32, GpuError> {
    GpuSource::open(nvml_lib(lib).as_deref())?.count()
}

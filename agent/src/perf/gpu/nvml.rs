//! The NVML edge: every call into the driver's library goes through here (nvml-wrapper).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{
    parse_cpu_list, throttle_names, xid_critical, xid_text, GpuEvent, GpuProcess, GpuSample,
    RemappedRows,
};

/// The library loaded when no path is given: the driver's, as installed on every GPU node.
const SYSTEM_LIB: &str = "libnvidia-ml.so.1";
/// NVML's NVLink count upper bound (`NVML_NVLINK_MAX_LINKS`).
const MAX_LINKS: u32 = 18;
const MIB: u64 = 1024 * 1024;

/// The NVML library to load: `--nvml-lib` (`flag`), else `$VIGIL_NVML_LIB`, else `None` (the
/// system's `libnvidia-ml.so.1`).
pub fn nvml_lib(flag: Option<&Path>) -> Option<PathBuf> {
    flag.map(Path::to_path_buf).or_else(|| {
        std::env::var_os("VIGIL_NVML_LIB")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

/// Why NVML cannot be used on this node (every GPU feature is then off).
#[derive(Debug, thiserror::Error)]
pub enum NvmlOff {
    #[error("cannot use the NVML library {} ({source}); fix --nvml-lib / VIGIL_NVML_LIB", path.display())]
    Library { path: PathBuf, source: NvmlError },
    #[error("no NVIDIA driver here ({SYSTEM_LIB}: {0})")]
    NoDriver(NvmlError),
}

/// What went wrong reaching the GPUs. Callers print it; `vigil health` tells [`GpuError::Off`]
/// (no NVML at all) from a GPU NVML cannot read.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// NVML cannot be loaded: GPU telemetry is off.
    #[error("GPU telemetry off: {0}")]
    Off(NvmlOff),
    #[error("NVML cannot count devices: {0}")]
    Count(NvmlError),
    #[error("NVML cannot open GPU {index}: {source}")]
    Open { index: u32, source: NvmlError },
    /// NVML works but cannot deliver XID events here.
    #[error("XID events off: {0}")]
    XidsOff(NvmlError),
    #[error("cannot start the XID watcher thread: {0}")]
    Thread(std::io::Error),
    #[error("the XID watcher thread ended before it started")]
    ThreadEnded,
}

fn init(lib: Option<&Path>) -> Result<Nvml, GpuError> {
    let path: &OsStr = lib.map(Path::as_os_str).unwrap_or(OsStr::new(SYSTEM_LIB));
    Nvml::builder().lib_path(path).init().map_err(|source| {
        GpuError::Off(match lib {
            Some(p) => NvmlOff::Library {
                path: p.to_path_buf(),
                source,
            },
            None => NvmlOff::NoDriver(source),
        })
    })
}

/// This node's GPUs, through NVML. Keep one open for the agent's life.
pub struct GpuSource {
    nvml: Nvml,
    /// The same library, raw, for the calls nvml-wrapper does not wrap (remapped rows).
    raw: Option<nvml_wrapper_sys::bindings::NvmlLib>,
    lib: Option<PathBuf>,
}

impl GpuSource {
    /// Loads NVML from `lib` (see `nvml_lib`). The error says that GPU telemetry is off and why.
    pub fn open(lib: Option<&Path>) -> Result<GpuSource, GpuError> {
        let nvml = init(lib)?;
        let path: &OsStr = lib.map(Path::as_os_str).unwrap_or(OsStr::new(SYSTEM_LIB));
        // SAFETY: loading the library nvml-wrapper already loaded: dlopen hands back the same
        // handle, so device handles from `nvml` are valid for it.
        let raw = unsafe { nvml_wrapper_sys::bindings::NvmlLib::new(path) }.ok();
        Ok(GpuSource {
            nvml,
            raw,
            lib: lib.map(Path::to_path_buf),
        })
    }

    /// The library this source loaded (`None`: the system's).
    pub fn lib(&self) -> Option<&Path> {
        self.lib.as_deref()
    }

    pub fn count(&self) -> Result<u32, GpuError> {
        self.nvml.device_count().map_err(GpuError::Count)
    }

    fn device(&self, index: u32) -> Result<Device<'_>, GpuError> {
        self.nvml
            .device_by_index(index)
            .map_err(|source| GpuError::Open { index, source })
    }

    /// Every GPU's sample, in index order; a GPU NVML cannot open is left out.
    pub fn sample_all(&self) -> Vec<GpuSample> {
        (0..self.count().unwrap_or(0))
            .filter_map(|i| self.sample(i).ok())
            .collect()
    }

    /// The UUIDs of every GPU in index order (for `rank_gpu`).
    pub fn uuids(&self) -> Vec<String> {
        (0..self.count().unwrap_or(0))
            .map(|i| {
                self.device(i)
                    .ok()
                    .and_then(|d| d.uuid().ok())
                    .unwrap_or_default()
            })
            .collect()
    }

    pub fn sample(&self, index: u32) -> Result<GpuSample, GpuError> {
        let d = self.device(index)?;
        let throttle_mask = d.current_throttle_reasons().ok().map(|r| r.bits());
        let mem = d.memory_info().ok();
        Ok(GpuSample {
            index,
            uuid: d.uuid().ok(),
            name: d.name().ok(),
            pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            sm_clock_max_mhz: d.max_clock_info(Clock::SM).ok(),
            throttle_mask,
            throttle: throttle_mask.map(throttle_names).unwrap_or_default(),
            power_w: d.power_usage().ok().map(|mw| mw as f64 / 1000.0),
            power_limit_w: d.enforced_power_limit().ok().map(|mw| mw as f64 / 1000.0),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
            util_pct: d.utilization_rates().ok().map(|u| u.gpu),
            mem_used_mib: mem.as_ref().map(|m| m.used / MIB),
            mem_total_mib: mem.as_ref().map(|m| m.total / MIB),
            ecc_uncorrected_volatile: d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok(),
            ecc_uncorrected_aggregate: d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
                .ok(),
            retired_pages_pending: d.are_pages_pending_retired().ok(),
            remapped_rows: self.remapped_rows(&d),
            pcie_replay: d.pcie_replay_counter().ok(),
            nvlink_errors: nvlink_errors(&d),
        })
    }

    fn remapped_rows(&self, d: &Device<'_>) -> Option<RemappedRows> {
        let f = self.raw.as_ref()?.nvmlDeviceGetRemappedRows.as_ref().ok()?;
        let (mut c, mut u, mut p, mut fl) = (0, 0, 0, 0);
        // SAFETY: a valid device handle of the same library, four out-parameters.
        let rc = unsafe { f(d.handle(), &mut c, &mut u, &mut p, &mut fl) };
        (rc == 0).then_some(RemappedRows {
            correctable: c,
            uncorrectable: u,
            pending: p != 0,
            failure: fl != 0,
        })
    }

    /// The processes holding memory on GPU `index` (compute contexts), with their names.
    pub fn processes(&self, index: u32) -> Vec<GpuProcess> {
        let Ok(d) = self.device(index) else {
            return vec![];
        };
        d.running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .map(|p| GpuProcess {
                gpu: index,
                pid: p.pid,
                name: std::fs::read_to_string(format!("/proc/{}/comm", p.pid))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
                mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b / MIB,
                    UsedGpuMemory::Unavailable => 0,
                },
            })
            .collect()
    }

    /// The CPUs NVML says are close to GPU `index` (its NUMA node's), if it says.
    pub fn cpu_affinity(&self, index: u32) -> Option<Vec<usize>> {
        let d = self.device(index).ok()?;
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.clamp(1, 1 << 14) as usize;
        let bits = std::ffi::c_ulong::BITS as usize;
        let words = d.cpu_affinity(cpus.div_ceil(bits)).ok()?;
        let set: Vec<usize> = words
            .iter()
            .enumerate()
            .flat_map(|(w, word)| {
                (0..bits)
                    .filter(move |b| word & (1 << b) != 0)
                    .map(move |b| w * bits + b)
            })
            .collect();
        (!set.is_empty()).then_some(set)
    }

    /// GPU `index`'s NUMA node from `<sys_root>/bus/pci/devices/<bus id>/numa_node` (`sys_root`
    /// is `/sys` but for tests); `None` when unknown (-1, no file, no bus id).
    pub fn numa_node(&self, index: u32, sys_root: &Path) -> Option<u32> {
        let bus = self.device(index).ok()?.pci_info().ok()?.bus_id;
        numa_node_of(&bus, sys_root)
    }
}

/// A PCI device's NUMA node from sysfs; `None` when unknown.
pub fn numa_node_of(nvml_bus_id: &str, sys_root: &Path) -> Option<u32> {
    let path = sys_root
        .join("bus/pci/devices")
        .join(super::bus_id_sysfs(nvml_bus_id))
        .join("numa_node");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The CPUs of NUMA node `node` from `<sys_root>/devices/system/node/node<N>/cpulist`.
pub fn node_cpus(node: u32, sys_root: &Path) -> Option<Vec<usize>> {
    let path = sys_root.join(format!("devices/system/node/node{node}/cpulist"));
    parse_cpu_list(&std::fs::read_to_string(path).ok()?)
}

fn nvlink_errors(d: &Device<'_>) -> Option<u64> {
    let mut sum = None;
    for link in 0..MAX_LINKS {
        let l = d.link_wrapper_for(link);
        if !matches!(l.is_active(), Ok(true)) {
            continue;
        }
        for c in [
            ErrorCounter::DlReplay,
            ErrorCounter::DlRecovery,
            ErrorCounter::DlCrcFlit,
            ErrorCounter::DlCrcData,
        ] {
            if let Ok(n) = l.error_counter(c) {
                sum = Some(sum.unwrap_or(0) + n);
            }
        }
    }
    sum
}

/// The XID watcher thread; dropping it stops the thread (within half a second).
pub struct XidWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Watches every GPU of this node for XID events and hands each to `on_event` (on the watcher's
/// thread). Errs, saying why, when NVML or its events are not available here.
pub fn watch_xids(
    lib: Option<&Path>,
    mut on_event: impl FnMut(GpuEvent) + Send + 'static,
) -> Result<XidWatcher, GpuError> {
    let lib = lib.map(Path::to_path_buf);
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let stopping = stop.clone();
    let thread = std::thread::Builder::new()
        .name("vigil-xid".into())
        .spawn(move || {
            let nvml = match init(lib.as_deref()) {
                Ok(n) => n,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let set = match register(&nvml) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            while !stopping.load(Ordering::Relaxed) {
                let Ok(ev) = set.wait(500) else { continue };
                if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    continue;
                }
                let xid = match ev.event_data {
                    Some(XidError::Value(x)) => x,
                    _ => 999,
                };
                on_event(GpuEvent {
                    gpu: ev.device.index().unwrap_or(u32::MAX),
                    xid,
                    critical: xid_critical(xid),
                    text: xid_text(xid),
                });
            }
        })
        .map_err(GpuError::Thread)?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(XidWatcher {
            stop,
            thread: Some(thread),
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(GpuError::ThreadEnded),
    }
}

fn register(nvml: &Nvml) -> Result<nvml_wrapper::EventSet<'_>, GpuError> {
    let mut set = nvml.create_event_set().map_err(GpuError::XidsOff)?;
    let count = nvml.device_count().map_err(GpuError::XidsOff)?;
    for i in 0..count {
        let d = nvml.device_by_index(i).map_err(GpuError::XidsOff)?;
        let supported = d.supported_event_types().unwrap_or(EventTypes::empty());
        if !supported.contains(EventTypes::CRITICAL_XID_ERROR) {
            continue;
        }
        set = d
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| GpuError::XidsOff(e.error))?;
    }
    Ok(set)
}

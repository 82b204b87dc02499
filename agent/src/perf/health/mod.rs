//! `vigil health`: is this node fit to train on? GPUs present and sound, InfiniBand ports up and
//! clean, a storage path writable with room. Usable as a Slurm prolog, epilog or
//! `HealthCheckProgram` (docs/health.md) and by the agent before each rendezvous
//! (`vigil run --health-check`). The verdicts are pure functions of what was read; reading is at
//! the edges (`read_*`, `run_checks`).

mod ib;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::perf::gpu::{self, GpuError, GpuProcess, GpuSample, GpuSource};
pub use ib::{ib_check, read_ib, IbPort};

/// The default InfiniBand sysfs tree.
pub const IB_ROOT: &str = "/sys/class/infiniband";

/// Where the NVIDIA device files (`nvidia0`, `nvidiactl`...) are looked for: `$VIGIL_DEV_DIR`
/// (for tests: a machine without GPUs "has" them when the directory holds `nvidia*` files), else
/// `/dev`.
pub fn dev_dir() -> PathBuf {
    std::env::var_os("VIGIL_DEV_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev"))
}

/// The `nvidia*` entries of `dir`, sorted: a node with them has an NVIDIA driver and GPUs, so NVML
/// not loading there is a fault, not "no GPU here".
pub fn nvidia_devices(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("nvidia"))
        .collect();
    out.sort();
    out
}

/// What to check. `Default` checks what is there and requires nothing more.
#[derive(Debug, Clone)]
pub struct HealthOptions {
    /// The NVML library (`--nvml-lib`); `None`: $VIGIL_NVML_LIB, else the system's.
    pub nvml_lib: Option<PathBuf>,
    /// GPUs that must be present; `None`: as many as NVML sees (no NVML is then a failure only
    /// where `dev_dir` holds NVIDIA device files).
    pub gpus: Option<u32>,
    /// Where NVIDIA device files are looked for ([`dev_dir`]).
    pub dev_dir: PathBuf,
    /// Free memory every GPU must have, in MiB.
    pub min_free_mib: Option<u64>,
    pub ib_root: PathBuf,
    /// No InfiniBand device is a failure.
    pub require_ib: bool,
    /// `link_downed` / `symbol_error` counts a port may have (each) and still pass.
    pub ib_max_errors: u64,
    /// Paths that must be writable with `min_free_gib` free.
    pub storage_paths: Vec<PathBuf>,
    pub min_free_gib: f64,
}

impl Default for HealthOptions {
    fn default() -> Self {
        HealthOptions {
            nvml_lib: None,
            gpus: None,
            dev_dir: dev_dir(),
            min_free_mib: None,
            ib_root: PathBuf::from(IB_ROOT),
            require_ib: false,
            ib_max_errors: 0,
            storage_paths: Vec::new(),
            min_free_gib: 1.0,
        }
    }
}

/// `--min-free-gib`'s value parser.
pub fn parse_gib(s: &str) -> Result<f64, &'static str> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err("give a number of GiB, 0 or more, such as 50 or 0.5"),
    }
}

/// `--gpu-memory-tolerance-mb`'s value parser.
pub fn parse_mib(s: &str) -> Result<f64, &'static str> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err("give a number of MiB, 0 or more, such as 512"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthReport {
    pub checks: Vec<Check>,
}

impl HealthReport {
    pub fn healthy(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The names of the failing checks, each once (three storage paths failing are `storage`).
    pub fn failed(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        for c in self.checks.iter().filter(|c| c.status == Status::Fail) {
            if !names.contains(&c.name) {
                names.push(c.name);
            }
        }
        names
    }

    /// One line per failing check, `name: detail`, joined by `; ` (for events and console lines).
    pub fn failures(&self) -> String {
        self.checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// One line per check (`PASS gpu_count  8 GPUs`), then `healthy` or `unhealthy: <names>`.
    pub fn render(&self) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for c in &self.checks {
            let s = match c.status {
                Status::Pass => "PASS",
                Status::Fail => "FAIL",
                Status::Skip => "SKIP",
            };
            out.push_str(&format!("{s} {:width$}  {}\n", c.name, c.detail));
        }
        if self.healthy() {
            out.push_str("healthy\n");
        } else {
            out.push_str(&format!("unhealthy: {}\n", self.failed().join(", ")));
        }
        out
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "healthy": self.healthy(),
            "failed": self.failed(),
            "checks": self.checks,
        })
    }
}

/// What NVML told about this node's GPUs: `Err` says why there is no NVML.
pub struct GpuFacts {
    pub count: Result<u32, GpuError>,
    /// The NVIDIA device files found ([`nvidia_devices`]).
    pub devices: Vec<String>,
    pub samples: Vec<GpuSample>,
    pub holders: Vec<GpuProcess>,
}

/// HW slowdown, HW thermal slowdown, power brake: the GPU's own protection slowing it.
const HW_THROTTLE: u64 = 0x8 | 0x40 | 0x80;

/// The GPU checks from what NVML told (pure).
pub fn gpu_checks(f: &GpuFacts, o: &HealthOptions) -> Vec<Check> {
    let count = match &f.count {
        Ok(n) => *n,
        Err(e) => return vec![no_nvml_check(e, &f.devices, o.gpus)],
    };
    let mut out = vec![count_check(count, o.gpus)];
    out.extend(access_check(count, &f.samples));
    if f.samples.is_empty() {
        return out;
    }
    out.push(ecc_check(&f.samples));
    out.push(throttle_check(&f.samples));
    out.push(memory_check(f, o.min_free_mib));
    out
}

/// `gpu_count` when NVML cannot be used: a failure where GPUs are expected (`--gpus`) or a
/// driver's device files are here, else a skip.
fn no_nvml_check(e: &GpuError, devices: &[String], expected: Option<u32>) -> Check {
    // "GPU telemetry off: ..." says what the agent does without NVML; a failed check says only
    // why NVML is unusable.
    let why = match e {
        GpuError::Off(off) => off.to_string(),
        other => other.to_string(),
    };
    match expected {
        Some(n) if n > 0 => check(
            "gpu_count",
            Status::Fail,
            format!("{n} GPU(s) expected, none usable: {why}"),
        ),
        // Fails closed: a driver is here, so a broken or wrong NVML hides real GPUs.
        _ if !devices.is_empty() => check(
            "gpu_count",
            Status::Fail,
            format!(
                "NVIDIA devices present ({}) but NVML is unusable: {why}",
                devices.join(", ")
            ),
        ),
        _ => check("gpu_count", Status::Skip, e.to_string()),
    }
}

fn count_check(count: u32, expected: Option<u32>) -> Check {
    match expected {
        Some(n) if count < n => check(
            "gpu_count",
            Status::Fail,
            format!("{count} of {n} expected GPUs present"),
        ),
        Some(n) => check(
            "gpu_count",
            Status::Pass,
            format!("{count} GPUs ({n} expected)"),
        ),
        None => check("gpu_count", Status::Pass, format!("{count} GPUs")),
    }
}

/// `gpu_access` fails for the GPUs NVML counts but cannot read; `None` when it reads them all.
fn access_check(count: u32, samples: &[GpuSample]) -> Option<Check> {
    if samples.len() as u32 >= count {
        return None;
    }
    let missing: Vec<String> = (0..count)
        .filter(|i| !samples.iter().any(|s| s.index == *i))
        .map(|i| i.to_string())
        .collect();
    Some(check(
        "gpu_access",
        Status::Fail,
        format!("NVML cannot read GPU(s) {}", missing.join(", ")),
    ))
}

fn ecc_check(samples: &[GpuSample]) -> Check {
    let faults: Vec<String> = samples
        .iter()
        .filter_map(|s| gpu::fault(s).map(|why| format!("GPU {}: {why}", s.index)))
        .collect();
    if faults.is_empty() {
        check(
            "gpu_ecc",
            Status::Pass,
            format!(
                "no uncorrectable ECC errors or row-remapping failures on {} GPUs",
                samples.len()
            ),
        )
    } else {
        check("gpu_ecc", Status::Fail, faults.join("; "))
    }
}

fn throttle_check(samples: &[GpuSample]) -> Check {
    let slow: Vec<String> = samples
        .iter()
        .filter(|s| s.throttle_mask.is_some_and(|m| m & HW_THROTTLE != 0))
        .map(|s| format!("GPU {}: {}", s.index, gpu::explain(s)))
        .collect();
    if slow.is_empty() {
        check(
            "gpu_throttle",
            Status::Pass,
            "no HW slowdown or power brake",
        )
    } else {
        check("gpu_throttle", Status::Fail, slow.join("; "))
    }
}

/// `gpu_memory`: the least free memory of any GPU, and each GPU below `--min-free-mib` with the
/// processes holding it.
fn memory_check(f: &GpuFacts, min_free_mib: Option<u64>) -> Check {
    let mut low = Vec::new();
    let mut least: Option<u64> = None;
    for s in &f.samples {
        let (Some(total), Some(used)) = (s.mem_total_mib, s.mem_used_mib) else {
            continue;
        };
        let free = total.saturating_sub(used);
        least = Some(least.map_or(free, |l| l.min(free)));
        if min_free_mib.is_some_and(|m| free < m) {
            let held = holders_text(&f.holders, s.index);
            low.push(format!("GPU {}: {free} MiB free of {total}{held}", s.index));
        }
    }
    match (least, min_free_mib) {
        (None, _) => check("gpu_memory", Status::Skip, "NVML reports no memory figures"),
        (Some(l), Some(m)) if low.is_empty() => check(
            "gpu_memory",
            Status::Pass,
            format!("at least {l} MiB free on every GPU (--min-free-mib {m})"),
        ),
        (Some(_), Some(m)) => check(
            "gpu_memory",
            Status::Fail,
            format!("{} (--min-free-mib {m})", low.join("; ")),
        ),
        (Some(l), None) => check(
            "gpu_memory",
            Status::Pass,
            format!("at least {l} MiB free on every GPU"),
        ),
    }
}

/// `, held by pid 42 (python) 4096 MiB, ...` for GPU `gpu`; empty when nothing holds it.
fn holders_text(holders: &[GpuProcess], gpu: u32) -> String {
    let who: Vec<String> = holders
        .iter()
        .filter(|p| p.gpu == gpu)
        .map(|p| format!("pid {} ({}) {} MiB", p.pid, or_unknown(&p.name), p.mib))
        .collect();
    if who.is_empty() {
        String::new()
    } else {
        format!(", held by {}", who.join(", "))
    }
}

fn or_unknown(name: &str) -> &str {
    if name.is_empty() {
        "name unknown"
    } else {
        name
    }
}

/// What the storage probe found in a directory: the write-and-remove probe's result and the
/// file system's free space.
#[derive(Debug)]
pub struct StorageFacts {
    pub write: std::io::Result<()>,
    pub free_bytes: nix::Result<u64>,
}

/// Why the storage probe found nothing: it did not run, or it did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot start the probe: {0}")]
    Spawn(std::io::Error),
    #[error("no answer within {}s (a hung file system?)", .0.as_secs())]
    Timeout(std::time::Duration),
}

/// The storage check from what was found (pure).
pub fn storage_verdict(
    path: &Path,
    found: Result<StorageFacts, ProbeError>,
    min_free_gib: f64,
) -> Check {
    let p = path.display();
    let found = match found {
        Ok(f) => f,
        Err(e) => return check("storage", Status::Fail, format!("{p} is not writable: {e}")),
    };
    if let Err(e) = found.write {
        return check("storage", Status::Fail, format!("{p} is not writable: {e}"));
    }
    match found.free_bytes {
        Err(e) => check(
            "storage",
            Status::Fail,
            format!("{p}: cannot read free space: {e}"),
        ),
        Ok(b) => {
            let gib = b as f64 / (1u64 << 30) as f64;
            let status = if gib < min_free_gib {
                Status::Fail
            } else {
                Status::Pass
            };
            check(
                "storage",
                status,
                format!("{p} writable, {gib:.1} GiB free (--min-free-gib {min_free_gib})"),
            )
        }
    }
}

fn probe_write(dir: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let probe = dir.join(format!(".vigil-health-{}", std::process::id()));
    let result = std::fs::File::create(&probe).and_then(|mut f| {
        f.write_all(b"vigil health\n")?;
        f.sync_all()
    });
    let _ = std::fs::remove_file(&probe);
    result
}

/// How long a storage probe may take: a hard-mounted dead NFS or Lustre blocks forever.
pub const STORAGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The write probe and the free space, bounded by `STORAGE_TIMEOUT` (a probe stuck in the kernel
/// is left behind on its thread).
fn probe_storage(dir: &Path) -> Result<StorageFacts, ProbeError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dir.to_path_buf();
    std::thread::Builder::new()
        .name("vigil-storage-probe".into())
        .spawn(move || {
            let _ = tx.send(StorageFacts {
                write: probe_write(&d),
                free_bytes: free_bytes(&d),
            });
        })
        .map_err(ProbeError::Spawn)?;
    rx.recv_timeout(STORAGE_TIMEOUT)
        .map_err(|_| ProbeError::Timeout(STORAGE_TIMEOUT))
}

fn free_bytes(dir: &Path) -> nix::Result<u64> {
    let s = nix::sys::statvfs::statvfs(dir)?;
    Ok(s.blocks_available() as u64 * s.fragment_size() as u64)
}

/// What NVML tells about this node's GPUs (the edge); `dev` is where device files are looked for.
pub fn read_gpus(lib: Option<&Path>, dev: &Path) -> GpuFacts {
    let devices = nvidia_devices(dev);
    match GpuSource::open(gpu::nvml_lib(lib).as_deref()) {
        Err(e) => GpuFacts {
            count: Err(e),
            devices,
            samples: vec![],
            holders: vec![],
        },
        Ok(src) => {
            let count = src.count();
            let samples = src.sample_all();
            let holders = samples
                .iter()
                .flat_map(|s| src.processes(s.index))
                .collect();
            GpuFacts {
                count,
                devices,
                samples,
                holders,
            }
        }
    }
}

/// Every check, reading this node.
pub fn run_checks(o: &HealthOptions) -> HealthReport {
    let mut checks = gpu_checks(&read_gpus(o.nvml_lib.as_deref(), &o.dev_dir), o);
    checks.push(ib_check(
        &o.ib_root,
        read_ib(&o.ib_root),
        o.require_ib,
        o.ib_max_errors,
    ));
    if o.storage_paths.is_empty() {
        checks.push(check("storage", Status::Skip, "no --storage-path given"));
    }
    for p in &o.storage_paths {
        checks.push(storage_verdict(p, probe_storage(p), o.min_free_gib));
    }
    HealthReport { checks }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::gpu::{NvmlOff, RemappedRows};
    use nvml_wrapper::error::NvmlError;

    fn gpu(i: u32) -> GpuSample {
        GpuSample {
            index: i,
            mem_total_mib: Some(81920),
            mem_used_mib: Some(0),
            throttle_mask: Some(0),
            ..Default::default()
        }
    }

    fn facts(samples: Vec<GpuSample>) -> GpuFacts {
        GpuFacts {
            count: Ok(samples.len() as u32),
            devices: vec![],
            samples,
            holders: vec![],
        }
    }

    fn status(checks: &[Check], name: &str) -> Status {
        checks.iter().find(|c| c.name == name).unwrap().status
    }

    #[test]
    fn clean_gpus_pass() {
        let c = gpu_checks(&facts(vec![gpu(0), gpu(1)]), &HealthOptions::default());
        assert!(c.iter().all(|c| c.status == Status::Pass), "{c:?}");
    }

    #[test]
    fn no_nvml_skips_unless_gpus_are_expected() {
        let mut f = GpuFacts {
            count: Err(GpuError::Off(NvmlOff::NoDriver(NvmlError::LibraryNotFound))),
            devices: vec![],
            samples: vec![],
            holders: vec![],
        };
        let c = gpu_checks(&f, &HealthOptions::default());
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].status, Status::Skip);
        assert!(c[0]
            .detail
            .starts_with("GPU telemetry off: no NVIDIA driver here"));
        let o = HealthOptions {
            gpus: Some(8),
            ..Default::default()
        };
        let c = gpu_checks(&f, &o);
        assert_eq!(c[0].status, Status::Fail);
        assert!(c[0]
            .detail
            .contains("8 GPU(s) expected, none usable: no NVIDIA driver"));
        // Device files say a driver is here: no NVML is then a failure without --gpus too.
        f.devices = vec!["nvidia0".into(), "nvidiactl".into()];
        let c = gpu_checks(&f, &HealthOptions::default());
        assert_eq!(c[0].status, Status::Fail);
        assert!(
            c[0].detail
                .contains("(nvidia0, nvidiactl) but NVML is unusable"),
            "{}",
            c[0].detail
        );
    }

    #[test]
    fn nvidia_device_files_are_found() {
        let dir = std::env::temp_dir().join(format!("vigil-dev-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(nvidia_devices(&dir).is_empty());
        for n in ["nvidia1", "null", "nvidiactl", "nvidia0"] {
            std::fs::write(dir.join(n), "").unwrap();
        }
        let found = nvidia_devices(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, ["nvidia0", "nvidia1", "nvidiactl"]);
        assert!(nvidia_devices(Path::new("/no/such/dir")).is_empty());
    }

    #[test]
    fn missing_gpus_ecc_rows_throttle_and_memory_fail() {
        let o = HealthOptions {
            gpus: Some(3),
            min_free_mib: Some(80000),
            ..Default::default()
        };
        let mut bad = gpu(1);
        bad.ecc_uncorrected_volatile = Some(1);
        bad.throttle_mask = Some(0x8);
        bad.throttle = vec!["HW slowdown".into()];
        bad.mem_used_mib = Some(4096);
        let mut rows = gpu(0);
        rows.remapped_rows = Some(RemappedRows {
            failure: true,
            ..Default::default()
        });
        let mut f = facts(vec![rows, bad]);
        f.holders = vec![GpuProcess {
            gpu: 1,
            pid: 42,
            name: "python".into(),
            mib: 4096,
        }];
        let c = gpu_checks(&f, &o);
        assert_eq!(status(&c, "gpu_count"), Status::Fail);
        assert_eq!(status(&c, "gpu_ecc"), Status::Fail);
        assert_eq!(status(&c, "gpu_throttle"), Status::Fail);
        assert_eq!(status(&c, "gpu_memory"), Status::Fail);
        let mem = c.iter().find(|c| c.name == "gpu_memory").unwrap();
        assert!(
            mem.detail.contains("pid 42 (python) 4096 MiB"),
            "{}",
            mem.detail
        );
        let ecc = c.iter().find(|c| c.name == "gpu_ecc").unwrap();
        assert!(ecc.detail.contains("GPU 0: row remapping failed"));
        assert!(ecc.detail.contains("GPU 1: 1 uncorrectable ECC"));
    }

    #[test]
    fn power_cap_is_not_a_hw_fault() {
        let mut g = gpu(0);
        g.throttle_mask = Some(0x4 | 0x1);
        let c = gpu_checks(&facts(vec![g]), &HealthOptions::default());
        assert_eq!(status(&c, "gpu_throttle"), Status::Pass);
    }

    #[test]
    fn storage() {
        let p = Path::new("/x");
        let found = |write: std::io::Result<()>, free: u64| {
            Ok(StorageFacts {
                write,
                free_bytes: Ok(free),
            })
        };
        assert_eq!(
            storage_verdict(p, found(Ok(()), 2 << 30), 1.0).status,
            Status::Pass
        );
        assert_eq!(
            storage_verdict(p, found(Ok(()), 1 << 29), 1.0).status,
            Status::Fail
        );
        let ro = std::io::Error::other("Read-only file system");
        let c = storage_verdict(p, found(Err(ro), 0), 1.0);
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("not writable: Read-only"));
        let c = storage_verdict(p, Err(ProbeError::Timeout(STORAGE_TIMEOUT)), 1.0);
        assert_eq!(
            c.detail,
            "/x is not writable: no answer within 30s (a hung file system?)"
        );
        let no_statvfs = StorageFacts {
            write: Ok(()),
            free_bytes: Err(nix::errno::Errno::ENOSYS),
        };
        let c = storage_verdict(p, Ok(no_statvfs), 1.0);
        assert!(
            c.detail.starts_with("/x: cannot read free space: ENOSYS"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn report_renders_and_names_failures() {
        let r = HealthReport {
            checks: vec![
                check("gpu_count", Status::Pass, "8 GPUs"),
                check("ib_ports", Status::Fail, "mlx5_0 port 1: link_downed 3"),
                check("storage", Status::Skip, "no --storage-path given"),
            ],
        };
        assert!(!r.healthy());
        assert_eq!(r.failed(), vec!["ib_ports"]);
        let text = r.render();
        assert!(text.contains("PASS gpu_count  8 GPUs\n"));
        assert!(text.contains("FAIL ib_ports   mlx5_0 port 1: link_downed 3\n"));
        assert!(text.ends_with("unhealthy: ib_ports\n"));
        let j = r.to_json();
        assert_eq!(j["healthy"], false);
        assert_eq!(j["checks"][1]["status"], "fail");
    }
}

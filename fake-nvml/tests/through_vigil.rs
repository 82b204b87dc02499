//! vigil's real NVML code (nvml-wrapper) against this fake library, loaded from its path as the
//! agent loads the driver's: what a test file says is what vigil reads, XID events included.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use vigil::perf::gpu::{self, GpuSource};

/// The cdylib built with this package (tests/ link the rlib; the .so sits beside it).
fn lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let p = dir.join("libfake_nvml.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libfake_nvml.so not found beside {}", exe.display());
}

fn file(name: &str, json: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fake-nvml-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("nvml.json");
    std::fs::write(&p, json).unwrap();
    p
}

const TWO: &str = r#"{"gpus": [
  {"uuid": "GPU-a", "name": "FAKE", "pci_bus_id": "00000000:3B:00.0", "sm_clock_mhz": 1110,
   "sm_clock_max_mhz": 1980, "throttle_reasons": 136, "power_w": 690, "power_limit_w": 700,
   "temperature_c": 88, "util_pct": 97, "mem_total_mib": 81920, "mem_used_mib": 2048,
   "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 5, "retired_pages_pending": false,
   "remapped_rows": {"correctable": 1, "uncorrectable": 2, "pending": true, "failure": false},
   "pcie_replay": 3, "processes": [{"pid": 1, "used_mib": 2048}], "cpu_affinity": [0, 2, 65]},
  {"uuid": "GPU-b"}
], "events": []}"#;

// One test: FAKE_NVML_FILE is process-wide.
#[test]
fn vigil_reads_what_the_file_says() {
    let path = file("main", TWO);
    std::env::set_var("FAKE_NVML_FILE", &path);
    let src = GpuSource::open(Some(&lib())).unwrap();
    assert_eq!(src.count().unwrap(), 2);
    assert_eq!(src.uuids(), vec!["GPU-a".to_string(), "GPU-b".to_string()]);
    let s = src.sample(0).unwrap();
    assert_eq!(s.pci_bus_id.as_deref(), Some("00000000:3B:00.0"));
    assert_eq!(
        (s.sm_clock_mhz, s.sm_clock_max_mhz),
        (Some(1110), Some(1980))
    );
    assert_eq!(s.throttle, vec!["HW slowdown", "power brake"]);
    assert_eq!((s.power_w, s.power_limit_w), (Some(690.0), Some(700.0)));
    assert_eq!((s.mem_used_mib, s.mem_total_mib), (Some(2048), Some(81920)));
    assert_eq!(
        (s.ecc_uncorrected_volatile, s.ecc_uncorrected_aggregate),
        (Some(0), Some(5))
    );
    let rows = s.remapped_rows.unwrap();
    assert_eq!(
        (rows.correctable, rows.uncorrectable, rows.pending),
        (1, 2, true)
    );
    assert_eq!(s.pcie_replay, Some(3));
    assert_eq!(
        gpu::explain(&s),
        "SM clock 1,110 of 1,980 MHz, throttled by HW slowdown and power brake, 88 C, power 690 of 700 W, a row remapping is pending (the GPU needs a reset)"
    );
    // A GPU that exposes nothing has nothing but its index and UUID.
    let bare = src.sample(1).unwrap();
    assert_eq!(bare.uuid.as_deref(), Some("GPU-b"));
    assert_eq!(
        (bare.sm_clock_mhz, bare.mem_used_mib, bare.remapped_rows),
        (None, None, None)
    );
    assert_eq!(gpu::explain(&bare), "no GPU telemetry");
    // Per local rank, through CUDA_VISIBLE_DEVICES.
    let all = src.sample_all();
    assert_eq!(
        (0..3)
            .map(|lr| gpu::rank_text(lr, Some("1,0"), &all))
            .collect::<Vec<_>>(),
        vec![
            Some("GPU 1: no GPU telemetry".to_string()),
            Some(format!("GPU 0: {}", gpu::explain(&s))),
            None
        ]
    );
    assert_eq!(
        gpu::fault(&all[0]).as_deref(),
        Some("a row remapping is pending (the GPU needs a reset)")
    );
    let procs = src.processes(0);
    assert_eq!(procs.len(), 1);
    assert_eq!((procs[0].pid, procs[0].mib), (1, 2048));
    // CPU 65 is beyond what NVML is asked about on a machine with fewer CPUs.
    let want = if ncpus() > 65 {
        vec![0, 2, 65]
    } else {
        vec![0, 2]
    };
    assert_eq!(src.cpu_affinity(0), Some(want));
    assert_eq!(src.cpu_affinity(1), None);
    // The NUMA node from a sysfs tree.
    let sys = path.parent().unwrap().join("sys");
    let dev = sys.join("bus/pci/devices/0000:3b:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("numa_node"), "1\n").unwrap();
    assert_eq!(src.numa_node(0, &sys), Some(1));
    assert_eq!(src.numa_node(1, &sys), None);

    // XID events, appended while the watcher runs, arrive once each with their GPU.
    let (tx, rx) = mpsc::channel();
    let watcher = gpu::watch_xids(Some(&lib()), move |e| {
        let _ = tx.send(e);
    })
    .unwrap();
    std::fs::write(
        &path,
        TWO.replace(r#""events": []"#, r#""events": [{"gpu": 1, "xid": 79}]"#),
    )
    .unwrap();
    let e = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!((e.gpu, e.xid, e.critical), (1, 79, true));
    assert_eq!(e.text, "XID 79 (GPU has fallen off the bus)");
    std::fs::write(
        &path,
        TWO.replace(
            r#""events": []"#,
            r#""events": [{"gpu": 1, "xid": 79}, {"gpu": 0, "xid": 13}]"#,
        ),
    )
    .unwrap();
    let e = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!((e.gpu, e.xid, e.critical), (0, 13, false));
    drop(watcher);
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());

    // A file that cannot be read is a driver that is not there: telemetry off, said plainly.
    std::env::set_var("FAKE_NVML_FILE", path.with_file_name("missing.json"));
    let err = GpuSource::open(Some(&lib())).err().unwrap();
    assert!(
        matches!(err, gpu::GpuError::Off(gpu::NvmlOff::Library { .. })),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.starts_with("GPU telemetry off: cannot use the NVML library"),
        "{err}"
    );
    assert!(gpu::watch_xids(Some(&lib()), |_| {}).is_err());
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

fn ncpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

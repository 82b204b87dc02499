//! The agent's CPU cost of sampling GPUs through NVML: `GpuSource::sample_all` (every value of
//! `GpuSample`, as the agent takes it every few seconds for straggler explanations), on the
//! process CPU clock, against a 5 s sampling interval. Prints a table.
//!
//!     cargo bench -p vigil --bench nvml [-- --lib PATH] [--gpus 8] [--passes 200] [--interval 5] [--show]
//!
//! `--lib` (default: `$VIGIL_NVML_LIB`, else the FAKE library built beside this bench,
//! target/{release,debug}/libfake_nvml.so) is the NVML to load. With the fake, the bench writes
//! `--gpus` GPUs to a file of its own (`FAKE_NVML_FILE`); the fake re-reads and parses that file
//! on every NVML call, so its figure is an upper bound on what the driver's library costs. Give
//! the driver's library (`--lib libnvidia-ml.so.1`) on a GPU machine for the real figure.
//! `--show` also prints what vigil reads of GPU 0 (sample, explanation, fault, memory holders, CPU
//! affinity, NUMA node) and whether XID events can be watched: a check of the real NVML path.

use std::path::PathBuf;
use std::time::Instant;

use vigil::perf::gpu::{self, GpuSource};

fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn fake_lib() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let target = exe.parent()?.parent()?.parent()?;
    ["release", "debug"]
        .iter()
        .map(|p| target.join(p).join("libfake_nvml.so"))
        .find(|p| p.exists())
}

fn fake_gpus(n: usize) -> String {
    let gpus: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"uuid": "GPU-fake-{i:04}", "name": "FAKE H100", "pci_bus_id": "00000000:{:02X}:00.0",
   "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "throttle_reasons": 0, "power_w": 500,
   "power_limit_w": 700, "temperature_c": 60, "util_pct": 95, "mem_total_mib": 81559,
   "mem_used_mib": 70000, "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0,
   "retired_pages_pending": false,
   "remapped_rows": {{"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false}},
   "pcie_replay": 0, "processes": [{{"pid": 1, "used_mib": 70000}}], "cpu_affinity": [0]}}"#,
                0x18 + i
            )
        })
        .collect();
    format!(r#"{{"gpus": [{}], "events": []}}"#, gpus.join(","))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let gpus: usize = arg(&args, "--gpus")
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let passes: usize = arg(&args, "--passes")
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let interval: f64 = arg(&args, "--interval")
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let lib = arg(&args, "--lib")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("VIGIL_NVML_LIB").map(PathBuf::from))
        .or_else(fake_lib)
        .expect("no NVML library: give --lib PATH, or build the fake (cargo build -p fake-nvml)");
    let fake = lib
        .file_name()
        .is_some_and(|n| n.to_string_lossy().contains("fake"));
    if fake {
        let f = std::env::temp_dir().join(format!("nvml-bench-{}.json", std::process::id()));
        std::fs::write(&f, fake_gpus(gpus)).expect("cannot write the fake's file");
        std::env::set_var("FAKE_NVML_FILE", &f);
    }
    let src = GpuSource::open(Some(&lib)).unwrap_or_else(|e| panic!("{e}"));
    let n = src.count().unwrap_or(0);
    // Warm up: first calls resolve symbols and fill caches.
    for _ in 0..5 {
        let _ = src.sample_all();
    }
    let (wall0, cpu0) = (Instant::now(), cpu_seconds());
    let mut values = 0usize;
    for _ in 0..passes {
        values += src.sample_all().len();
    }
    let cpu = (cpu_seconds() - cpu0) / passes as f64;
    let wall = wall0.elapsed().as_secs_f64() / passes as f64;
    assert_eq!(values, passes * n as usize, "a GPU could not be sampled");
    println!("| library | GPUs | CPU per pass | wall per pass | CPU share at one pass per {interval} s |");
    println!("|---|---|---|---|---|");
    println!(
        "| {} | {n} | {:.3} ms | {:.3} ms | {:.4}% of a core |",
        if fake {
            "fake (re-reads its JSON on every call)"
        } else {
            "driver"
        },
        cpu * 1e3,
        wall * 1e3,
        cpu / interval * 100.0
    );
    if args.iter().any(|a| a == "--show") && n > 0 {
        let s0 = src.sample(0).expect("GPU 0");
        println!(
            "\nGPU 0: {}",
            serde_json::to_string(&s0).unwrap_or_default()
        );
        println!("explain: {}", gpu::explain(&s0));
        println!("fault: {:?}", gpu::fault(&s0));
        println!("memory holders: {:?}", src.processes(0));
        println!("CPU affinity: {:?}", src.cpu_affinity(0));
        println!(
            "NUMA node: {:?}",
            src.numa_node(0, std::path::Path::new("/sys"))
        );
        match gpu::watch_xids(Some(&lib), |e| println!("XID event: {e:?}")) {
            Ok(w) => {
                std::thread::sleep(std::time::Duration::from_secs(1));
                drop(w);
                println!("XID watcher: registered, ran 1 s, stopped");
            }
            Err(e) => println!("XID watcher: {e}"),
        }
    }
}

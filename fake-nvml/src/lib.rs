//! A FAKE `libnvidia-ml.so` for tests on machines without GPUs. It exports the NVML C functions
//! vigil calls (through nvml-wrapper) and answers them from the JSON file named by
//! `FAKE_NVML_FILE`, re-read on every call so that a test can change a GPU while vigil runs.
//! vigil loads it with `--nvml-lib target/debug/libfake_nvml.so`.
//!
//! The file (every GPU key is optional; a missing one answers `NVML_ERROR_NOT_SUPPORTED`, as a
//! GPU that does not expose the value would):
//!
//! ```json
//! {"gpus": [{"uuid": "GPU-fake-0", "name": "FAKE H100", "pci_bus_id": "00000000:01:00.0",
//!            "sm_clock_mhz": 1110, "sm_clock_max_mhz": 1980, "throttle_reasons": 136,
//!            "power_w": 690, "power_limit_w": 700, "temperature_c": 88,
//!            "util_pct": 97, "mem_util_pct": 40, "mem_total_mib": 81920, "mem_used_mib": 2048,
//!            "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0,
//!            "retired_pages_pending": false,
//!            "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
//!            "pcie_replay": 0, "processes": [{"pid": 1234, "used_mib": 2048}],
//!            "cpu_affinity": [0, 1]}],
//!  "events": [{"gpu": 0, "xid": 79}]}
//! ```
//!
//! `events` are XID events; each event set delivers each listed event once, in order. Without
//! `FAKE_NVML_FILE` (or with an unreadable file) `nvmlInit_v2` fails as with no driver.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_ulong, c_ulonglong, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

type Ret = c_uint;
const SUCCESS: Ret = 0;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const TIMEOUT: Ret = 10;
const UNKNOWN: Ret = 999;

const EVENT_XID: c_ulonglong = 0x8;
const CLOCK_SM: c_uint = 1;

type Device = *mut c_void;

fn load() -> Result<Value, Ret> {
    let path = std::env::var_os("FAKE_NVML_FILE").ok_or(DRIVER_NOT_LOADED)?;
    let text = std::fs::read_to_string(path).map_err(|_| DRIVER_NOT_LOADED)?;
    serde_json::from_str(&text).map_err(|_| UNKNOWN)
}

fn gpus(v: &Value) -> &[Value] {
    v.get("gpus")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// A device handle is its index + 1 (never null).
fn handle(index: usize) -> Device {
    (index + 1) as Device
}

fn index_of(d: Device) -> usize {
    (d as usize).wrapping_sub(1)
}

/// The GPU behind a handle, or the NVML error to return.
fn with_gpu(d: Device, f: impl FnOnce(&Value) -> Result<(), Ret>) -> Ret {
    let v = match load() {
        Ok(v) => v,
        Err(e) => return e,
    };
    match gpus(&v).get(index_of(d)) {
        Some(g) => match f(g) {
            Ok(()) => SUCCESS,
            Err(e) => e,
        },
        None => INVALID_ARGUMENT,
    }
}

fn num(g: &Value, key: &str) -> Result<f64, Ret> {
    g.get(key).and_then(Value::as_f64).ok_or(NOT_SUPPORTED)
}

fn flag(g: &Value, key: &str) -> Result<bool, Ret> {
    g.get(key).and_then(Value::as_bool).ok_or(NOT_SUPPORTED)
}

unsafe fn put<T>(out: *mut T, v: T) -> Result<(), Ret> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    out.write(v);
    Ok(())
}

unsafe fn put_str(out: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, out, s.len());
    out.add(s.len()).write(0);
    Ok(())
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    match load() {
        Ok(_) => SUCCESS,
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(out: *mut c_char, len: c_uint) -> Ret {
    match put_str(out, len, "fake-nvml") {
        Ok(()) => SUCCESS,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    match load() {
        Ok(v) => match put(count, gpus(&v).len() as c_uint) {
            Ok(()) => SUCCESS,
            Err(e) => e,
        },
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, out: *mut Device) -> Ret {
    match load() {
        Ok(v) if (index as usize) < gpus(&v).len() => match put(out, handle(index as usize)) {
            Ok(()) => SUCCESS,
            Err(e) => e,
        },
        Ok(_) => INVALID_ARGUMENT,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(d: Device, out: *mut c_uint) -> Ret {
    with_gpu(d, |_| put(out, index_of(d) as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(d: Device, out: *mut c_char, len: c_uint) -> Ret {
    with_gpu(d, |g| {
        let s = g.get("uuid").and_then(Value::as_str).ok_or(NOT_SUPPORTED)?;
        put_str(out, len, s)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(d: Device, out: *mut c_char, len: c_uint) -> Ret {
    with_gpu(d, |g| {
        let s = g.get("name").and_then(Value::as_str).ok_or(NOT_SUPPORTED)?;
        put_str(out, len, s)
    })
}

/// `nvmlPciInfo_t` (v3).
#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(d: Device, out: *mut PciInfo) -> Ret {
    with_gpu(d, |g| {
        let id = g
            .get("pci_bus_id")
            .and_then(Value::as_str)
            .ok_or(NOT_SUPPORTED)?;
        if out.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let mut info = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0x2330_10de,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        };
        put_str(info.bus_id.as_mut_ptr(), 32, id)?;
        // The legacy field holds the 4-digit-domain form, `0000:3B:00.0`.
        let legacy: String = id.chars().skip(id.len().saturating_sub(12)).collect();
        put_str(info.bus_id_legacy.as_mut_ptr(), 16, &legacy)?;
        out.write(info);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(d: Device, kind: c_uint, out: *mut c_uint) -> Ret {
    with_gpu(d, |g| {
        if kind != CLOCK_SM {
            return Err(NOT_SUPPORTED);
        }
        put(out, num(g, "sm_clock_mhz")? as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    d: Device,
    kind: c_uint,
    out: *mut c_uint,
) -> Ret {
    with_gpu(d, |g| {
        if kind != CLOCK_SM {
            return Err(NOT_SUPPORTED);
        }
        put(out, num(g, "sm_clock_max_mhz")? as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    d: Device,
    out: *mut c_ulonglong,
) -> Ret {
    with_gpu(d, |g| put(out, num(g, "throttle_reasons")? as c_ulonglong))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(d: Device, out: *mut c_uint) -> Ret {
    with_gpu(d, |g| put(out, (num(g, "power_w")? * 1000.0) as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(d: Device, out: *mut c_uint) -> Ret {
    with_gpu(d, |g| {
        put(out, (num(g, "power_limit_w")? * 1000.0) as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    d: Device,
    _sensor: c_uint,
    out: *mut c_uint,
) -> Ret {
    with_gpu(d, |g| put(out, num(g, "temperature_c")? as c_uint))
}

#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(d: Device, out: *mut Utilization) -> Ret {
    with_gpu(d, |g| {
        let gpu = num(g, "util_pct")? as c_uint;
        let memory = num(g, "mem_util_pct").unwrap_or(0.0) as c_uint;
        put(out, Utilization { gpu, memory })
    })
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

const MIB: f64 = 1024.0 * 1024.0;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(d: Device, out: *mut MemoryV2) -> Ret {
    with_gpu(d, |g| {
        let total = (num(g, "mem_total_mib")? * MIB) as c_ulonglong;
        let used = (num(g, "mem_used_mib")? * MIB) as c_ulonglong;
        if out.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let version = (*out).version;
        put(
            out,
            MemoryV2 {
                version,
                total,
                reserved: 0,
                free: total.saturating_sub(used),
                used,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    d: Device,
    error_type: c_uint,
    counter_type: c_uint,
    out: *mut c_ulonglong,
) -> Ret {
    with_gpu(d, |g| {
        // Only uncorrected (1) counts are faked; volatile (0) or aggregate (1).
        if error_type != 1 {
            return Err(NOT_SUPPORTED);
        }
        let key = if counter_type == 0 {
            "ecc_uncorrected_volatile"
        } else {
            "ecc_uncorrected_aggregate"
        };
        put(out, num(g, key)? as c_ulonglong)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    d: Device,
    out: *mut c_uint,
) -> Ret {
    with_gpu(d, |g| put(out, flag(g, "retired_pages_pending")? as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    d: Device,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> Ret {
    with_gpu(d, |g| {
        let r = g.get("remapped_rows").ok_or(NOT_SUPPORTED)?;
        put(corr, num(r, "correctable").unwrap_or(0.0) as c_uint)?;
        put(unc, num(r, "uncorrectable").unwrap_or(0.0) as c_uint)?;
        put(pending, flag(r, "pending").unwrap_or(false) as c_uint)?;
        put(failure, flag(r, "failure").unwrap_or(false) as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(d: Device, out: *mut c_uint) -> Ret {
    with_gpu(d, |g| put(out, num(g, "pcie_replay")? as c_uint))
}

/// `nvmlProcessInfo_t` (v2, as `_v3` functions take).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    d: Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    with_gpu(d, |g| {
        let procs: Vec<ProcessInfo> = g
            .get("processes")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|p| ProcessInfo {
                        pid: num(p, "pid").unwrap_or(0.0) as c_uint,
                        used_gpu_memory: (num(p, "used_mib").unwrap_or(0.0) * MIB) as c_ulonglong,
                        gpu_instance_id: u32::MAX,
                        compute_instance_id: u32::MAX,
                    })
                    .collect()
            })
            .unwrap_or_default();
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let room = *count as usize;
        *count = procs.len() as c_uint;
        if room < procs.len() || (infos.is_null() && !procs.is_empty()) {
            return Err(INSUFFICIENT_SIZE);
        }
        for (i, p) in procs.iter().enumerate() {
            infos.add(i).write(*p);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    d: Device,
    size: c_uint,
    out: *mut c_ulong,
) -> Ret {
    with_gpu(d, |g| {
        let cpus = g
            .get("cpu_affinity")
            .and_then(Value::as_array)
            .ok_or(NOT_SUPPORTED)?;
        if out.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let bits = c_ulong::BITS as usize;
        for i in 0..size as usize {
            out.add(i).write(0);
        }
        for c in cpus.iter().filter_map(Value::as_u64) {
            let (word, bit) = (c as usize / bits, c as usize % bits);
            if word < size as usize {
                *out.add(word) |= 1 << bit;
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(d: Device, out: *mut c_ulonglong) -> Ret {
    with_gpu(d, |_| put(out, EVENT_XID))
}

struct EventSet {
    /// Registered (device index, event types).
    devices: Vec<(usize, c_ulonglong)>,
    /// How many of the file's events this set has looked at.
    seen: usize,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(out: *mut *mut c_void) -> Ret {
    let set = Box::new(Mutex::new(EventSet {
        devices: Vec::new(),
        seen: 0,
    }));
    match put(out, Box::into_raw(set) as *mut c_void) {
        Ok(()) => SUCCESS,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    d: Device,
    types: c_ulonglong,
    set: *mut c_void,
) -> Ret {
    if set.is_null() {
        return INVALID_ARGUMENT;
    }
    let set = &*(set as *const Mutex<EventSet>);
    with_gpu(d, |_| {
        if let Ok(mut s) = set.lock() {
            s.devices.push((index_of(d), types));
        }
        Ok(())
    })
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct EventData {
    device: Device,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut c_void,
    out: *mut EventData,
    timeout_ms: c_uint,
) -> Ret {
    if set.is_null() || out.is_null() {
        return INVALID_ARGUMENT;
    }
    let set = &*(set as *const Mutex<EventSet>);
    let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
    loop {
        if let Ok(v) = load() {
            let events = v
                .get("events")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let Ok(mut s) = set.lock() else {
                return UNKNOWN;
            };
            while s.seen < events.len() {
                let e = &events[s.seen];
                s.seen += 1;
                let gpu = num(e, "gpu").unwrap_or(0.0) as usize;
                let wanted = s
                    .devices
                    .iter()
                    .any(|&(i, types)| i == gpu && types & EVENT_XID != 0);
                if wanted {
                    out.write(EventData {
                        device: handle(gpu),
                        event_type: EVENT_XID,
                        event_data: num(e, "xid").unwrap_or(999.0) as c_ulonglong,
                        gpu_instance_id: u32::MAX,
                        compute_instance_id: u32::MAX,
                    });
                    return SUCCESS;
                }
            }
        }
        if Instant::now() >= deadline {
            return TIMEOUT;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: *mut c_void) -> Ret {
    if !set.is_null() {
        drop(Box::from_raw(set as *mut Mutex<EventSet>));
    }
    SUCCESS
}

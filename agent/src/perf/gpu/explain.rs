//! What a GPU sample says, in words: why a rank is slow, whether its node is unusable.

use super::GpuSample;

/// NVML's clock throttle reason bits (`nvmlClocksThrottleReason*`) and the words vigil uses.
const THROTTLE: &[(u64, &str)] = &[
    (0x1, "idle"),
    (0x2, "application clocks"),
    (0x4, "power cap"),
    (0x8, "HW slowdown"),
    (0x10, "sync boost"),
    (0x20, "SW thermal slowdown"),
    (0x40, "HW thermal slowdown"),
    (0x80, "power brake"),
    (0x100, "display clocks"),
];

/// XIDs after which the GPU needs a reset, a reboot or replacing, per NVIDIA's XID catalogue
/// (docs.nvidia.com/deploy/xid-errors, "Resolution Bucket" RESET_GPU/REBOOT/CONTACT_SUPPORT):
/// 48 double-bit ECC error, 61/62 internal micro-controller breakpoint/halt, 64 ECC page
/// retirement or row remapping failure, 74 NVLink error, 79 GPU fallen off the bus, 92 high
/// single-bit ECC rate, 95 uncontained ECC error, 119/120 GSP RPC timeout/error, 140 unrecovered
/// ECC error. Left out on purpose: 13, 31, 43 (the application's fault), 63 (a row remapping was
/// recorded: the GPU goes on) and 94 (a contained ECC error: restarting the application is enough).
pub const CRITICAL_XIDS: &[u64] = &[48, 61, 62, 64, 74, 79, 92, 95, 119, 120, 140];

pub fn xid_critical(xid: u64) -> bool {
    CRITICAL_XIDS.contains(&xid)
}

/// A short description of an XID for console lines and events.
pub fn xid_text(xid: u64) -> String {
    let what = match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        48 => "double-bit ECC error",
        61 => "internal micro-controller breakpoint",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failure",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        140 => "unrecovered ECC error",
        _ => "",
    };
    if what.is_empty() {
        format!("XID {xid}")
    } else {
        format!("XID {xid} ({what})")
    }
}

/// The names of the set throttle bits, in NVML's order.
pub fn throttle_names(mask: u64) -> Vec<String> {
    THROTTLE
        .iter()
        .filter(|(bit, _)| mask & bit != 0)
        .map(|(_, n)| n.to_string())
        .collect()
}

/// 1980 -> "1,980".
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "a", "a and b", "a, b and c".
fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// What the GPU was doing, for a straggler's report line:
/// `SM clock 1,110 of 1,980 MHz, throttled by HW slowdown and power brake, 88 C, power 690 of 700 W`.
/// Values the GPU does not expose are left out; a GPU that exposes none is "no GPU telemetry".
pub fn explain(s: &GpuSample) -> String {
    let mut parts = Vec::new();
    match (s.sm_clock_mhz, s.sm_clock_max_mhz) {
        (Some(c), Some(m)) => parts.push(format!(
            "SM clock {} of {} MHz",
            thousands(c.into()),
            thousands(m.into())
        )),
        (Some(c), None) => parts.push(format!("SM clock {} MHz", thousands(c.into()))),
        _ => {}
    }
    // Idle is not a cause of slowness; it is what a GPU waiting for its peers reports.
    let causes: Vec<&str> = s
        .throttle
        .iter()
        .map(String::as_str)
        .filter(|n| *n != "idle")
        .collect();
    if !causes.is_empty() {
        parts.push(format!("throttled by {}", and_list(&causes)));
    }
    if let Some(t) = s.temperature_c {
        parts.push(format!("{t} C"));
    }
    match (s.power_w, s.power_limit_w) {
        (Some(p), Some(l)) => parts.push(format!("power {:.0} of {:.0} W", p, l)),
        (Some(p), None) => parts.push(format!("power {p:.0} W")),
        _ => {}
    }
    if let Some(f) = fault(s) {
        parts.push(f);
    }
    if parts.is_empty() {
        "no GPU telemetry".into()
    } else {
        parts.join(", ")
    }
}

/// Why this GPU makes its node unusable until it is reset or replaced, if it does.
pub fn fault(s: &GpuSample) -> Option<String> {
    let mut why = Vec::new();
    if let Some(n) = s.ecc_uncorrected_volatile.filter(|n| *n > 0) {
        why.push(format!(
            "{n} uncorrectable ECC error(s) since the last reset"
        ));
    }
    if let Some(r) = s.remapped_rows {
        if r.failure {
            why.push("row remapping failed".to_string());
        } else if r.pending {
            why.push("a row remapping is pending (the GPU needs a reset)".to_string());
        }
    }
    if s.retired_pages_pending == Some(true) {
        why.push("pages are pending retirement (the GPU needs a reset)".to_string());
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// What local rank `local_rank`'s GPU was doing in `samples` (one pass over the node's GPUs),
/// for a straggler's report line: `GPU 1: SM clock 1,110 of 1,980 MHz, ...`; `None` when the rank
/// has no GPU among them. `cuda_visible` is the agent's `CUDA_VISIBLE_DEVICES`.
pub fn rank_text(
    local_rank: u32,
    cuda_visible: Option<&str>,
    samples: &[GpuSample],
) -> Option<String> {
    // By GPU index: a GPU NVML could not open is missing from `samples`.
    let n = samples
        .iter()
        .map(|s| s.index as usize + 1)
        .max()
        .unwrap_or(0);
    let mut uuids = vec![String::new(); n];
    for s in samples {
        uuids[s.index as usize] = s.uuid.clone().unwrap_or_default();
    }
    let g = rank_gpu(local_rank, cuda_visible, &uuids)?;
    let s = samples.iter().find(|s| s.index == g)?;
    Some(format!("GPU {g}: {}", explain(s)))
}

/// The GPU index a rank uses: entry `local_rank` of `CUDA_VISIBLE_DEVICES` (an index, or a
/// `GPU-`/`MIG-` UUID or unique prefix of one, matched against `uuids` in index order), else
/// `local_rank` itself. `None` when the rank sees no GPU of this node.
pub fn rank_gpu(local_rank: u32, cuda_visible: Option<&str>, uuids: &[String]) -> Option<u32> {
    let Some(list) = cuda_visible else {
        return ((local_rank as usize) < uuids.len()).then_some(local_rank);
    };
    // CUDA reads the list up to the first invalid entry; a rank uses its local_rank-th device.
    let entry = list.split(',').map(str::trim).nth(local_rank as usize)?;
    if entry.is_empty() {
        return None;
    }
    if let Ok(i) = entry.parse::<u32>() {
        return ((i as usize) < uuids.len()).then_some(i);
    }
    let mut hits = uuids
        .iter()
        .enumerate()
        .filter(|(_, u)| u.starts_with(entry));
    match (hits.next(), hits.next()) {
        (Some((i, _)), None) => Some(i as u32),
        _ => None,
    }
}

/// NVML's PCI bus id (`00000000:3B:00.0`) as sysfs names the device (`0000:3b:00.0`).
pub fn bus_id_sysfs(nvml_bus_id: &str) -> String {
    let lower = nvml_bus_id.trim().to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

/// A kernel CPU list (`0-3,8,10-11`) as CPU numbers; `None` if malformed.
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::gpu::RemappedRows;
    use proptest::prelude::*;

    fn slow() -> GpuSample {
        GpuSample {
            sm_clock_mhz: Some(1110),
            sm_clock_max_mhz: Some(1980),
            throttle_mask: Some(0x88),
            throttle: throttle_names(0x88),
            temperature_c: Some(88),
            power_w: Some(690.0),
            power_limit_w: Some(700.0),
            ..Default::default()
        }
    }

    #[test]
    fn explains_a_throttled_gpu() {
        assert_eq!(
            explain(&slow()),
            "SM clock 1,110 of 1,980 MHz, throttled by HW slowdown and power brake, 88 C, power 690 of 700 W"
        );
    }

    #[test]
    fn idle_is_no_cause_and_nothing_known_says_so() {
        let s = GpuSample {
            throttle: throttle_names(0x1),
            ..Default::default()
        };
        assert_eq!(explain(&s), "no GPU telemetry");
        let s = GpuSample {
            throttle: throttle_names(0x1 | 0x4 | 0x40 | 0x80),
            ..Default::default()
        };
        assert_eq!(
            explain(&s),
            "throttled by power cap, HW thermal slowdown and power brake"
        );
    }

    #[test]
    fn faults() {
        assert_eq!(fault(&slow()), None);
        let ecc = GpuSample {
            ecc_uncorrected_volatile: Some(2),
            ecc_uncorrected_aggregate: Some(9),
            ..Default::default()
        };
        assert!(fault(&ecc).unwrap().contains("2 uncorrectable ECC"));
        let rows = GpuSample {
            remapped_rows: Some(RemappedRows {
                failure: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(fault(&rows).unwrap(), "row remapping failed");
        // Aggregate counts survive resets and remapped rows: no fault by themselves.
        let old = GpuSample {
            ecc_uncorrected_volatile: Some(0),
            ecc_uncorrected_aggregate: Some(3),
            remapped_rows: Some(RemappedRows {
                uncorrectable: 3,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(fault(&old), None);
    }

    #[test]
    fn xids() {
        assert!(xid_critical(79) && xid_critical(48) && xid_critical(95));
        assert!(!xid_critical(13) && !xid_critical(31) && !xid_critical(94));
        assert_eq!(xid_text(79), "XID 79 (GPU has fallen off the bus)");
        assert_eq!(xid_text(7), "XID 7");
    }

    #[test]
    fn ranks_to_gpus() {
        let uuids: Vec<String> = ["GPU-aaa1", "GPU-bbb2", "GPU-aaa3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(rank_gpu(1, None, &uuids), Some(1));
        assert_eq!(rank_gpu(3, None, &uuids), None);
        assert_eq!(rank_gpu(0, Some("2,0"), &uuids), Some(2));
        assert_eq!(rank_gpu(1, Some("2, 0"), &uuids), Some(0));
        assert_eq!(rank_gpu(2, Some("2,0"), &uuids), None);
        assert_eq!(rank_gpu(0, Some(""), &uuids), None);
        assert_eq!(rank_gpu(0, Some("GPU-bbb"), &uuids), Some(1));
        // An ambiguous prefix names no GPU.
        assert_eq!(rank_gpu(0, Some("GPU-aaa"), &uuids), None);
        assert_eq!(rank_gpu(0, Some("7"), &uuids), None);
    }

    #[test]
    fn bus_ids_and_cpu_lists() {
        assert_eq!(bus_id_sysfs("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(bus_id_sysfs("0000:3b:00.0"), "0000:3b:00.0");
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    proptest! {
        #[test]
        fn thousands_round_trips(n in 0u64..10_000_000_000) {
            let s = thousands(n);
            prop_assert_eq!(s.replace(',', "").parse::<u64>().unwrap(), n);
            prop_assert!(s.split(',').skip(1).all(|g| g.len() == 3));
        }

        #[test]
        fn explain_never_panics(clock in proptest::option::of(0u32..5000),
                                mask in 0u64..0x200, t in proptest::option::of(0u32..120)) {
            let s = GpuSample { sm_clock_mhz: clock, throttle: throttle_names(mask),
                                temperature_c: t, ..Default::default() };
            prop_assert!(!explain(&s).is_empty());
        }

        #[test]
        fn cpu_lists_round_trip(cpus in proptest::collection::btree_set(0usize..256, 0..20)) {
            let text = cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
            prop_assert_eq!(parse_cpu_list(&text), Some(cpus.into_iter().collect::<Vec<_>>()));
        }
    }
}

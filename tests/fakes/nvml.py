"""Fakes of what vigil reads about GPUs and NICs: the JSON file the FAKE NVML library
(`fake-nvml/`, built as target/debug/libfake_nvml.so) answers from, and a fake
`/sys/class/infiniband` tree. vigil's real nvml-wrapper code runs against them."""
import json
import os
from pathlib import Path

from harness import vigil_bin


def fake_nvml_lib() -> str:
    """The fake NVML library built next to the vigil binary under test."""
    path = Path(vigil_bin()).parent / "libfake_nvml.so"
    if not path.exists():
        raise AssertionError(f"{path} not found: run `cargo build --workspace` first")
    return str(path)


def gpu(index=0, **values):
    """A healthy H100-like GPU; `values` override or add fields (None removes one: the GPU then
    does not expose it)."""
    g = {
        "uuid": f"GPU-fake-{index:04d}",
        "name": "FAKE NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "sm_clock_mhz": 1980,
        "sm_clock_max_mhz": 1980,
        "throttle_reasons": 0,
        "power_w": 500,
        "power_limit_w": 700,
        "temperature_c": 60,
        "util_pct": 95,
        "mem_util_pct": 40,
        "mem_total_mib": 81559,
        "mem_used_mib": 0,
        "ecc_uncorrected_volatile": 0,
        "ecc_uncorrected_aggregate": 0,
        "retired_pages_pending": False,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "pcie_replay": 0,
        "processes": [],
        "cpu_affinity": [0],
    }
    for k, v in values.items():
        if v is None:
            g.pop(k, None)
        else:
            g[k] = v
    return g


def write_nvml(path: Path, gpus, events=()):
    """Writes the fake's file atomically: the fake re-reads it on every NVML call."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"gpus": list(gpus), "events": list(events)}))
    os.replace(tmp, path)
    return path


def nvml_env(env: dict, path: Path) -> dict:
    """`env` with the fake NVML library and its file (`VIGIL_NVML_LIB`, `FAKE_NVML_FILE`)."""
    env = dict(env)
    env["VIGIL_NVML_LIB"] = fake_nvml_lib()
    env["FAKE_NVML_FILE"] = str(path)
    return env


def ib_tree(root: Path, ports):
    """A fake /sys/class/infiniband: `ports` is a list of dicts with device, port, and optional
    state (default ACTIVE), link_downed, symbol_error (default 0)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    codes = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}
    for p in ports:
        d = root / p["device"] / "ports" / str(p.get("port", 1))
        (d / "counters").mkdir(parents=True, exist_ok=True)
        state = p.get("state", "ACTIVE")
        (d / "state").write_text(f"{codes.get(state, 0)}: {state}\n")
        (d / "counters" / "link_downed").write_text(f"{p.get('link_downed', 0)}\n")
        (d / "counters" / "symbol_error").write_text(f"{p.get('symbol_error', 0)}\n")
    return root

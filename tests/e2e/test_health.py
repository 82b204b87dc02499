"""`vigil health` on the real binary, driving vigil's real NVML code through the fake NVML library
(fake-nvml/) and reading a fake /sys/class/infiniband tree."""
import json
import subprocess

from fakes.nvml import fake_nvml_lib, gpu, ib_tree, nvml_env, write_nvml
from harness import base_env, run_vigil


def health(job, gpus, *args, ports=({"device": "mlx5_0"}, {"device": "mlx5_1"})):
    nvml = write_nvml(job / "nvml.json", gpus)
    ib = ib_tree(job / "ib", ports)
    return run_vigil(
        ["health", "--ib-root", str(ib), "--storage-path", str(job), "--min-free-gib", "0", *args],
        cwd=job,
        env=nvml_env(base_env(), nvml),
    )


def lines(out):
    return {l.split()[1]: l for l in out.splitlines() if l.split()[:1] in (["PASS"], ["FAIL"], ["SKIP"])}


def test_clean_node_passes(job):
    r = health(job, [gpu(0), gpu(1)], "--gpus", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    checks = lines(r.stdout)
    assert set(checks) == {"gpu_count", "gpu_ecc", "gpu_throttle", "gpu_memory", "ib_ports", "storage"}
    assert all(l.startswith("PASS") for l in checks.values()), r.stdout
    assert "2 GPUs (2 expected)" in checks["gpu_count"]
    assert "2 port(s) ACTIVE" in checks["ib_ports"]
    assert r.stdout.splitlines()[-1] == "healthy"


def test_uncorrectable_ecc_fails_and_names_the_gpu(job):
    r = health(job, [gpu(0), gpu(1, ecc_uncorrected_volatile=3)])
    assert r.returncode == 1, r.stdout + r.stderr
    checks = lines(r.stdout)
    assert checks["gpu_ecc"].startswith("FAIL"), r.stdout
    assert "GPU 1: 3 uncorrectable ECC error(s)" in checks["gpu_ecc"]
    assert "GPU 0" not in checks["gpu_ecc"]
    assert r.stdout.splitlines()[-1] == "unhealthy: gpu_ecc"


def test_remapped_row_failure_fails(job):
    rows = {"correctable": 0, "uncorrectable": 1, "pending": False, "failure": True}
    r = health(job, [gpu(0, remapped_rows=rows)])
    assert r.returncode == 1
    assert "GPU 0: row remapping failed" in lines(r.stdout)["gpu_ecc"]


def test_downed_link_fails_and_names_the_port(job):
    r = health(job, [gpu(0)], ports=[{"device": "mlx5_0"},
                                     {"device": "mlx5_1", "state": "DOWN", "link_downed": 2}])
    assert r.returncode == 1, r.stdout + r.stderr
    ib = lines(r.stdout)["ib_ports"]
    assert ib.startswith("FAIL")
    assert "mlx5_1 port 1: state DOWN, link_downed 2" in ib
    assert "mlx5_0" not in ib
    assert r.stdout.splitlines()[-1] == "unhealthy: ib_ports"


def test_link_downed_counter_alone_fails_unless_allowed(job):
    ports = [{"device": "mlx5_0", "link_downed": 1, "symbol_error": 4}]
    r = health(job, [gpu(0)], ports=ports)
    assert r.returncode == 1
    assert "link_downed 1, symbol_error 4" in lines(r.stdout)["ib_ports"]
    r = health(job, [gpu(0)], "--ib-max-errors", "5", ports=ports)
    assert r.returncode == 0, r.stdout


def test_missing_gpu_and_hw_slowdown_fail(job):
    r = health(job, [gpu(0, throttle_reasons=0x8, sm_clock_mhz=1110)], "--gpus", "2")
    assert r.returncode == 1
    checks = lines(r.stdout)
    assert "1 of 2 expected GPUs present" in checks["gpu_count"]
    assert "GPU 0: SM clock 1,110 of 1,980 MHz, throttled by HW slowdown" in checks["gpu_throttle"]
    assert r.stdout.splitlines()[-1] == "unhealthy: gpu_count, gpu_throttle"


def test_gpu_memory_held_names_the_process(job):
    holder = subprocess.Popen(["sleep", "300"])
    try:
        g = gpu(0, mem_used_mib=4096, processes=[{"pid": holder.pid, "used_mib": 4096}])
        r = health(job, [g], "--min-free-mib", "80000")
        assert r.returncode == 1, r.stdout
        mem = lines(r.stdout)["gpu_memory"]
        assert f"held by pid {holder.pid} (sleep) 4096 MiB" in mem, mem
    finally:
        holder.kill()
        holder.wait()


def test_json_shape(job):
    r = health(job, [gpu(0, ecc_uncorrected_volatile=1)], "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["healthy"] is False
    assert doc["failed"] == ["gpu_ecc"]
    assert [c["name"] for c in doc["checks"]] == [
        "gpu_count", "gpu_ecc", "gpu_throttle", "gpu_memory", "ib_ports", "storage"]
    assert all(set(c) == {"name", "status", "detail"} for c in doc["checks"])
    assert {c["status"] for c in doc["checks"]} <= {"pass", "fail", "skip"}


def test_storage_not_writable_fails(job):
    ro = job / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        r = run_vigil(["health", "--storage-path", str(ro), "--ib-root", str(job / "none")],
                      cwd=job, env=base_env())
    finally:
        ro.chmod(0o700)
    import os
    if os.geteuid() == 0:
        # root writes anywhere; the free-space half of the check still runs.
        r = run_vigil(["health", "--storage-path", str(job), "--min-free-gib", "1e9",
                       "--ib-root", str(job / "none")], cwd=job, env=base_env())
        assert r.returncode == 1
        assert "GiB free (--min-free-gib 1000000000)" in lines(r.stdout)["storage"]
    else:
        assert r.returncode == 1
        assert "is not writable" in lines(r.stdout)["storage"]


def test_no_nvml_says_gpu_checks_are_off_and_passes(job):
    # No NVIDIA device files (VIGIL_DEV_DIR): only then is no NVML "no GPU here".
    (job / "dev").mkdir()
    env = base_env(VIGIL_NVML_LIB=str(job / "no-such-libnvidia-ml.so"), VIGIL_DEV_DIR=str(job / "dev"))
    r = run_vigil(["health", "--ib-root", str(job / "none")], cwd=job, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    checks = lines(r.stdout)
    assert checks["gpu_count"].startswith("SKIP")
    assert "GPU telemetry off: cannot use the NVML library" in checks["gpu_count"]
    assert "no InfiniBand devices" in checks["ib_ports"]
    r = run_vigil(["health", "--gpus", "8", "--ib-root", str(job / "none")], cwd=job, env=env)
    assert r.returncode == 1
    assert "8 GPU(s) expected, none usable" in lines(r.stdout)["gpu_count"]


def test_require_ib_and_usage_errors(job):
    r = run_vigil(["health", "--require-ib", "--ib-root", str(job / "none")], cwd=job, env=base_env())
    assert r.returncode == 1
    assert "(--require-ib)" in lines(r.stdout)["ib_ports"]
    r = run_vigil(["health", "--gpus", "eight"], cwd=job, env=base_env())
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "--gpus" in r.stderr
    assert fake_nvml_lib().endswith("libfake_nvml.so")


def test_a_counter_that_cannot_vouch_for_its_port_fails_named(job):
    """A counter that is missing, a directory, a FIFO (nothing writing to it: must not block) or
    longer than a sysfs page is not "at most 0": each port fails, named with its reason."""
    import os
    nvml = write_nvml(job / "nvml.json", [gpu(0)])
    ib = ib_tree(job / "ib", [{"device": f"mlx5_{i}"} for i in range(5)])
    c = lambda dev, name: ib / dev / "ports" / "1" / "counters" / name
    c("mlx5_0", "link_downed").unlink()
    c("mlx5_1", "symbol_error").unlink()
    c("mlx5_1", "symbol_error").mkdir()
    c("mlx5_2", "link_downed").unlink()
    os.mkfifo(c("mlx5_2", "link_downed"))
    c("mlx5_3", "symbol_error").write_text("0" * 5000)
    r = run_vigil(["health", "--ib-root", str(ib), "--storage-path", str(job), "--min-free-gib", "0"],
                  cwd=job, env=nvml_env(base_env(), nvml), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    line = lines(r.stdout)["ib_ports"]
    assert line.startswith("FAIL"), r.stdout
    assert "mlx5_0 port 1: link_downed missing" in line
    assert "mlx5_1 port 1: symbol_error unreadable (it is a directory" in line
    assert "mlx5_2 port 1: link_downed unreadable (it is a FIFO" in line
    assert "mlx5_3 port 1: symbol_error unreadable (it is larger than 4096 bytes)" in line
    assert "mlx5_4" not in line
    assert r.stdout.splitlines()[-1] == "unhealthy: ib_ports"

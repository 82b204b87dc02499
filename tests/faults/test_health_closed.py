"""Health fails closed where GPUs are expected (field finding 17), on the real binary: NVML that
does not load or initialise is a failed `gpu_count` on a node with NVIDIA device files or with
`--gpus`, and `vigil run --health-check` then starts no rank; an InfiniBand counter that does not
parse fails `ib_ports`, named. This machine has no GPU: `VIGIL_DEV_DIR` (documented as for tests)
points vigil at a directory holding FAKE `nvidia*` device files."""
from fakes.nvml import fake_nvml_lib, gpu, ib_tree, nvml_env, write_nvml
from harness import base_env, events, of, one, run_vigil, write


def fake_dev(job, present=True):
    d = job / ("dev-with-nvidia" if present else "dev-without")
    d.mkdir(exist_ok=True)
    if present:
        for n in ("nvidia0", "nvidiactl"):
            (d / n).write_text("FAKE device file\n")
    (d / "null").write_text("")
    return d


def lines(out):
    return {l.split()[1]: l for l in out.splitlines() if l.split()[:1] in (["PASS"], ["FAIL"], ["SKIP"])}


def health(job, *args, **env):
    return run_vigil(["health", "--ib-root", str(job / "no-ib"), *args], cwd=job, env=base_env(**env))


def test_nvml_that_is_not_nvml_fails_where_devices_are(job):
    dev = fake_dev(job)
    r = health(job, "--nvml-lib", "/etc/passwd", VIGIL_DEV_DIR=dev)
    assert r.returncode == 1, r.stdout + r.stderr
    c = lines(r.stdout)["gpu_count"]
    assert c.startswith("FAIL"), r.stdout
    assert "NVIDIA devices present (nvidia0, nvidiactl) but NVML is unusable" in c, c
    assert "/etc/passwd" in c, c
    assert r.stdout.splitlines()[-1] == "unhealthy: gpu_count"


def test_fake_nvml_failing_init_fails_where_devices_are(job):
    # The FAKE NVML's nvmlInit fails (as with no driver loaded) when FAKE_NVML_FILE is unset.
    dev = fake_dev(job)
    r = health(job, "--json", VIGIL_NVML_LIB=fake_nvml_lib(), VIGIL_DEV_DIR=dev)
    assert r.returncode == 1, r.stdout + r.stderr
    import json
    doc = json.loads(r.stdout)
    assert doc["healthy"] is False and doc["failed"] == ["gpu_count"], doc
    assert "libfake_nvml.so" in doc["checks"][0]["detail"], doc


def test_no_devices_and_no_gpus_flag_still_passes(job):
    dev = fake_dev(job, present=False)
    for lib in ("/etc/passwd", fake_nvml_lib()):
        r = health(job, "--nvml-lib", lib, VIGIL_DEV_DIR=dev)
        assert r.returncode == 0, r.stdout + r.stderr
        assert lines(r.stdout)["gpu_count"].startswith("SKIP"), r.stdout
        assert r.stdout.splitlines()[-1] == "healthy"
    # --gpus alone is enough to expect them.
    r = health(job, "--nvml-lib", "/etc/passwd", "--gpus", "1", VIGIL_DEV_DIR=dev)
    assert r.returncode == 1, r.stdout
    assert "1 GPU(s) expected, none usable" in lines(r.stdout)["gpu_count"]


def test_working_nvml_with_devices_passes(job):
    dev = fake_dev(job)
    nvml = write_nvml(job / "nvml.json", [gpu(0)])
    r = run_vigil(["health", "--ib-root", str(job / "no-ib")], cwd=job,
                  env=nvml_env(base_env(VIGIL_DEV_DIR=dev), nvml))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 GPUs" in lines(r.stdout)["gpu_count"]


def test_garbled_ib_counter_fails_named(job):
    ib = ib_tree(job / "ib", [{"device": "mlx5_0"}, {"device": "mlx5_1"}])
    (ib / "mlx5_1" / "ports" / "1" / "counters" / "symbol_error").write_text("\x1b[2Jgarbage\n")
    dev = fake_dev(job, present=False)
    r = run_vigil(["health", "--ib-root", str(ib)], cwd=job, env=base_env(VIGIL_DEV_DIR=dev))
    assert r.returncode == 1, r.stdout + r.stderr
    c = lines(r.stdout)["ib_ports"]
    assert c.startswith("FAIL"), r.stdout
    assert 'mlx5_1 port 1: symbol_error "\\u{1b}[2Jgarbage" is not a count' in c, c
    assert "mlx5_0" not in c
    assert "\x1b" not in r.stdout, "the counter's bytes are printed escaped"
    assert r.stdout.splitlines()[-1] == "unhealthy: ib_ports"


def test_run_health_check_starts_no_rank_when_nvml_is_broken_on_a_gpu_node(job):
    dev = fake_dev(job)
    marker = job / "rank-ran"
    script = write(job / "train.py", f"open({str(marker)!r}, 'w').close()\n")
    env = base_env(VIGIL_DEV_DIR=dev, VIGIL_NVML_LIB=fake_nvml_lib())  # init fails: no file
    r = run_vigil(["run", "--log-dir", str(job / "logs"), "--nproc-per-node", "1", "--health-check",
                   "--health-storage-path", str(job), str(script)], cwd=job, env=env)
    assert r.returncode == 75, r.stdout + r.stderr
    assert not marker.exists(), "a rank started on a node whose NVML is broken"
    assert "failed its health check before attempt 0 (gpu_count: NVIDIA devices present" in r.stderr
    ev = events(job / "logs")
    hc = one(ev, "health_check")
    assert hc["healthy"] is False and hc["failed"] == ["gpu_count"], hc
    assert not of(ev, "rank_started")

"""`vigil run`'s GPU side on the real binary with real ranks, through the fake NVML library
(fake-nvml/): the health check before each rendezvous, the wait for GPU memory between attempts,
NUMA binding."""
import json
import os
import signal
import subprocess

from fakes.nvml import fake_nvml_lib, gpu, nvml_env, write_nvml
from harness import base_env, events, of, one, run_vigil, start_vigil, wait_for, write


def run(job, script, *flags, nvml=None, timeout=120, **env_extra):
    env = base_env(**env_extra)
    env = nvml_env(env, nvml) if nvml else env
    return run_vigil(["run", "--log-dir", str(job / "logs"), *flags, str(script)],
                     cwd=job, env=env, timeout=timeout)


def test_failing_health_check_ends_the_allocation_asking_to_exclude_the_node(job):
    nvml = write_nvml(job / "nvml.json", [gpu(0, ecc_uncorrected_volatile=2)])
    marker = job / "rank-ran"
    script = write(job / "train.py", f"open({str(marker)!r}, 'w').close()\n")
    r = run(job, script, "--nproc-per-node", "1", "--health-check", "--state-dir",
            str(job / "state"), "--health-storage-path", str(job), nvml=nvml,
            SLURM_JOB_NODELIST="gpu-007")
    assert r.returncode == 75, r.stderr
    assert not marker.exists(), "a rank started on a node that failed its health check"
    assert "node 0 failed its health check before attempt 0 (gpu_ecc: GPU 0: 2 uncorrectable ECC" in r.stderr
    assert "requeue without this node" in r.stderr
    ev = events(job / "logs")
    hc = one(ev, "health_check")
    assert hc["healthy"] is False and hc["failed"] == ["gpu_ecc"] and hc["cycle"] == 0
    assert [c["name"] for c in hc["checks"] if c["status"] == "pass"] == [
        "gpu_count", "gpu_throttle", "gpu_memory", "storage"]
    res = one(ev, "result")
    assert res["exit_code"] == 75 and res["requeue"] is True, res
    assert "failed its health check" in res["reason"]
    assert not of(ev, "rank_started")
    names = [e["event"] for e in ev]
    assert names.index("health_check") < names.index("result")
    # The job's ledger names this node for exclusion.
    recs = [json.loads(l) for l in (job / "state" / "ledger.jsonl").read_text().splitlines()]
    assert len(recs) == 1 and recs[0]["decision"] == "requeue", recs
    assert recs[0]["excluded"] == ["gpu-007"], recs


def test_passing_health_check_runs_the_job_and_checks_again_at_each_attempt(job):
    nvml = write_nvml(job / "nvml.json", [gpu(0)])
    script = write(job / "train.py", "import os, sys\n"
                   "sys.exit(1 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 0)\n")
    r = run(job, script, "--nproc-per-node", "1", "--max-restarts", "1", "--health-check",
            "--gpu-memory-reclaim-timeout", "0", nvml=nvml)
    assert r.returncode == 0, r.stderr
    ev = events(job / "logs")
    checks = of(ev, "health_check")
    assert [c["cycle"] for c in checks] == [0, 1]
    assert all(c["healthy"] for c in checks)
    names = [e["event"] for e in ev]
    starts = [i for i, n in enumerate(names) if n == "cycle_start"]
    hcs = [i for i, n in enumerate(names) if n == "health_check"]
    assert hcs[0] < starts[0] < hcs[1] < starts[1], names


def test_ft_launcher_nic_healthcheck_turns_the_check_on(job):
    nvml = write_nvml(job / "nvml.json", [gpu(0, remapped_rows={"failure": True})])
    script = write(job / "train.py", "pass\n")
    r = run(job, script, "--nproc-per-node", "1", "--ft-enable-nic-healthcheck", nvml=nvml)
    assert r.returncode == 75, r.stderr
    assert "row remapping failed" in r.stderr


RECLAIM_SCRIPT = """
import json, os, sys
n = os.environ['TORCHELASTIC_RESTART_COUNT']
if n == '0':
    sys.exit(3)
# What the GPU looked like when this attempt started.
gpus = json.load(open(os.environ['FAKE_NVML_FILE']))['gpus']
open({marker!r}, 'w').write(str(gpus[0]['mem_used_mib']))
"""


def held_gpu(pid):
    return gpu(0, mem_used_mib=4096, processes=[{"pid": pid, "used_mib": 4096}])


def test_gpu_memory_still_held_delays_the_next_attempt_and_names_the_holder(job):
    holder = subprocess.Popen(["sleep", "300"])
    try:
        nvml = write_nvml(job / "nvml.json", [held_gpu(holder.pid)])
        marker = job / "attempt1"
        script = write(job / "train.py", RECLAIM_SCRIPT.format(marker=str(marker)))
        r = run(job, script, "--nproc-per-node", "1", "--max-restarts", "1",
                "--gpu-memory-reclaim-timeout", "1.5", "--gpu-memory-poll-interval", "0.1",
                nvml=nvml)
        assert r.returncode == 0, r.stderr
        assert (f"GPU memory not released after 1.5s (--gpu-memory-reclaim-timeout): held by "
                f"pid {holder.pid} (sleep) 4096 MiB on GPU 0; starting the next attempt anyway"
                ) in r.stderr, r.stderr
        ev = events(job / "logs")
        w = one(ev, "gpu_memory_wait")
        assert w["released"] is False and w["gpus"] == [0] and w["cycle"] == 1
        assert w["waited_ms"] >= 1500
        assert w["holders"] == [{"gpu": 0, "pid": holder.pid, "name": "sleep", "mib": 4096}]
        names = [e["event"] for e in ev]
        assert names.index("restart") < names.index("gpu_memory_wait") < \
            [i for i, n in enumerate(names) if n == "cycle_start"][1]
        assert marker.read_text() == "4096"
    finally:
        holder.kill()
        holder.wait()


def test_gpu_memory_released_mid_wait_lets_the_attempt_start(job):
    holder = subprocess.Popen(["sleep", "300"])
    try:
        nvml = write_nvml(job / "nvml.json", [held_gpu(holder.pid)])
        marker = job / "attempt1"
        script = write(job / "train.py", RECLAIM_SCRIPT.format(marker=str(marker)))
        p = start_vigil(["run", "--log-dir", str(job / "logs"), "--nproc-per-node", "1",
                         "--max-restarts", "1", "--gpu-memory-reclaim-timeout", "120",
                         "--gpu-memory-poll-interval", "0.1", str(script)],
                        cwd=job, env=nvml_env(base_env(), nvml))
        try:
            # The first attempt failed and the agent is between attempts, waiting for the GPU.
            held = wait_for(lambda: [e for e in _events(job / "logs")
                                     if e["event"] == "gpu_memory_held"], 60, "the wait")
            assert held[0]["holders"][0]["pid"] == holder.pid and held[0]["cycle"] == 1
            assert not marker.exists()
            holder.kill()
            holder.wait()
            write_nvml(nvml, [gpu(0, mem_used_mib=0)])
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0, err
        # The attempt started only once the memory was released.
        assert marker.read_text() == "0"
        w = one(events(job / "logs"), "gpu_memory_wait")
        assert w["released"] is True and w["holders"] == [] and w["waited_ms"] > 0
        assert "GPU memory not released" not in err
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def _events(log_dir):
    dirs = [d for d in log_dir.iterdir() if d.name.startswith("vigil_")]
    if not dirs:
        return []
    f = dirs[0] / "events.jsonl"
    if not f.exists():
        return []
    out = []
    for line in f.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def test_no_nvml_no_wait(job):
    script = write(job / "train.py", "import os, sys\n"
                   "sys.exit(1 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 0)\n")
    env = base_env(VIGIL_NVML_LIB=str(job / "none.so"))
    r = run_vigil(["run", "--log-dir", str(job / "logs"), "--max-restarts", "1", str(script)],
                  cwd=job, env=env)
    assert r.returncode == 0, r.stderr
    assert not of(events(job / "logs"), "gpu_memory_wait")


NUMA_SCRIPT = """
import os
line = [l for l in open('/proc/self/status') if l.startswith('Cpus_allowed_list')][0]
open(os.path.join({out!r}, os.environ['LOCAL_RANK']), 'w').write(line.split(':')[1].strip())
"""


def test_numa_binding_gives_each_rank_its_gpus_cpus(job):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        import pytest
        pytest.skip("needs two CPUs")
    a, b = allowed[0], allowed[1]
    nvml = write_nvml(job / "nvml.json", [gpu(0, cpu_affinity=[b]), gpu(1, cpu_affinity=[a])])
    out = job / "cpus"
    out.mkdir()
    script = write(job / "train.py", NUMA_SCRIPT.format(out=str(out)))
    r = run(job, script, "--nproc-per-node", "2", "--numa-binding", "node", nvml=nvml)
    assert r.returncode == 0, r.stderr
    assert (out / "0").read_text() == str(b)
    assert (out / "1").read_text() == str(a)
    # CUDA_VISIBLE_DEVICES reorders the ranks' GPUs, and the binding follows.
    env = nvml_env(base_env(CUDA_VISIBLE_DEVICES="1,0"), nvml)
    r = run_vigil(["run", "--log-dir", str(job / "logs2"), "--nproc-per-node", "2",
                   "--numa-binding", "node", str(script)], cwd=job, env=env)
    assert r.returncode == 0, r.stderr
    assert (out / "0").read_text() == str(a)
    assert (out / "1").read_text() == str(b)


def test_numa_binding_without_nvml_warns_and_starts_unbound(job):
    out = job / "cpus"
    out.mkdir()
    script = write(job / "train.py", NUMA_SCRIPT.format(out=str(out)))
    env = base_env(VIGIL_NVML_LIB=str(job / "none.so"))
    r = run_vigil(["run", "--log-dir", str(job / "logs"), "--numa-binding", "exclusive",
                   str(script)], cwd=job, env=env)
    assert r.returncode == 0, r.stderr
    assert "--numa-binding exclusive: GPU telemetry off: cannot use the NVML library" in r.stderr
    assert "ranks start unbound" in r.stderr
    mine = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    got = (out / "0").read_text()
    assert got == mine or "-" in got


def test_a_node_failing_its_health_check_ends_the_job_on_every_node(job):
    from test_multinode import Nodes
    nvml = write_nvml(job / "nvml.json", [gpu(0, ecc_uncorrected_volatile=1)])
    marker = job / "ran"
    write(job / "t.py", f"open({str(marker)!r} + __import__('os').environ['RANK'], 'w').close()\n")
    env = {"VIGIL_NVML_LIB": fake_nvml_lib(), "FAKE_NVML_FILE": str(nvml)}
    nodes = Nodes(job, 2, ["t.py"], nproc=1, env=env,
                  extra=["--max-restarts", "2", "--rdzv-id", "hc"],
                  per_node=lambda i: ["--health-check"] if i == 1 else [])
    res = nodes.wait(timeout=120)
    assert [r[0] for r in res] == [75, 75], [r[2][-1500:] for r in res]
    assert not list(job.glob("ran*")), "a rank started although node 1 is unfit"
    assert one(nodes.events(1), "health_check")["failed"] == ["gpu_ecc"]
    assert not of(nodes.events(0), "health_check")
    # Node rank 0 learned which node is to be left out.
    assert any(e.get("node") == 1 for e in of(nodes.events(0), "cycle_ended")), nodes.events(0)


def test_nproc_per_node_gpu_counts_the_gpus_of_nvml_lib(job):
    nvml = write_nvml(job / "nvml.json", [gpu(0), gpu(1), gpu(2)])
    script = write(job / "t.py", "import os\nprint('world', os.environ['LOCAL_WORLD_SIZE'])\n")
    env = base_env(FAKE_NVML_FILE=str(nvml))
    r = run_vigil(["run", "--log-dir", str(job / "logs"), "--nproc-per-node", "gpu",
                   "--nvml-lib", fake_nvml_lib(), str(script)], cwd=job, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("world 3") == 3, r.stdout


def test_a_signal_during_the_memory_wait_stops_the_agent_at_once(job):
    holder = subprocess.Popen(["sleep", "300"])
    try:
        nvml = write_nvml(job / "nvml.json", [held_gpu(holder.pid)])
        script = write(job / "train.py", RECLAIM_SCRIPT.format(marker=str(job / "attempt1")))
        p = start_vigil(["run", "--log-dir", str(job / "logs"), "--nproc-per-node", "1",
                         "--max-restarts", "1", "--gpu-memory-reclaim-timeout", "600",
                         str(script)], cwd=job, env=nvml_env(base_env(), nvml))
        try:
            wait_for(lambda: [e for e in _events(job / "logs") if e["event"] == "gpu_memory_held"],
                     60, "the wait")
            p.send_signal(signal.SIGTERM)
            # Far less than the 600 s wait: the agent does not wait it out.
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode != 0 and "SIGTERM" in err, err
        assert not (job / "attempt1").exists()
    finally:
        holder.kill()
        holder.wait()

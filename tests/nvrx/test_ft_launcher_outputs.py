"""What NVRx 0.7's ft_launcher writes that tools around it read, under vigil (docs/ft_launcher.md):
the `[NestedRestarter] name=[InJob] state=...` console lines NVRx's functional scripts
(tests/fault_tolerance/func/run_local_ddp_test_{heartbeats,sections}.sh) check, and the per-cycle
info files of `--ft-cycle-info-dir`. Each test runs the real agent, invoked as `ft_launcher`,
with real ranks that use NVRx's client through `vigil.compat`.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import base_env, run_vigil, vigil_bin, write  # noqa: E402
from restarter_check import restarter_sequence_ok  # noqa: E402

# NVRx's examples/fault_tolerance/fault_tol_cfg_heartbeats.yaml.
HEARTBEATS_YAML = """fault_tolerance:
    initial_rank_heartbeat_timeout: null
    rank_heartbeat_timeout: null
    log_level: "DEBUG"
"""

# A rank as NVRx's heartbeats example runs it: heartbeats, then "Leaving main". With FAIL set,
# rank 1 fails in the first attempt once rank 0 has connected, as `--simulated_fault` does.
RANK = """
import json, os, sys, time
import vigil.compat as ft
c = ft.RankMonitorClient()
c.init_workload_monitoring()
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
info = os.environ.get("NVRX_CURRENT_CYCLE_INFO")
if info:
    with open(os.path.join(os.environ["OUT_DIR"], f"seen_{attempt}_{rank}.json"), "w") as f:
        json.dump({"env": info, "text": open(info).read()}, f)
up = os.path.join(os.environ["OUT_DIR"], f"up_{attempt}_{rank}")
open(up, "w").close()
for i in range(20):
    c.send_heartbeat()
    time.sleep(0.02)
    if os.environ.get("FAIL") and attempt == 0 and rank == 1 and i == 5:
        # Only once rank 0 is connected, as NVRx's fault comes after training started.
        t0 = time.time()
        while not os.path.exists(up[:-1] + "0") and time.time() - t0 < 60:
            time.sleep(0.01)
        print("Simulating fault", flush=True)
        sys.exit(1)
c.shutdown_workload_monitoring()
print("Leaving main", flush=True)
"""

def ft_launcher(job: Path, tmp_path: Path, extra=(), **env):
    link = tmp_path / "ft_launcher"
    if not link.exists():
        link.symlink_to(vigil_bin())
    write(job / "t.py", RANK)
    write(job / "fault_tol_cfg_heartbeats.yaml", HEARTBEATS_YAML)
    # NVRx's functional scripts' command line, with 2 ranks on the CPU.
    args = [str(link), "--nproc-per-node=2", "--max-restarts=32", "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:0", "--ft-restart-check-interval=0.5",
            "--ft-cfg-path=fault_tol_cfg_heartbeats.yaml", "--term-timeout=15", *extra, "t.py"]
    # `2>&1 | tee log.log`: one stream, as the scripts read it.
    return subprocess.run(args, cwd=job, env=base_env(OUT_DIR=job, **env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)


def test_a_run_without_a_fault_prints_nvrx_restarter_sequence(job, tmp_path):
    r = ft_launcher(job, tmp_path)
    assert r.returncode == 0, r.stdout
    assert "Leaving main" in r.stdout and "Simulating fault" not in r.stdout
    assert restarter_sequence_ok(r.stdout, with_restarts=False), r.stdout
    assert not restarter_sequence_ok(r.stdout, with_restarts=True), r.stdout
    # The line is NVRx's whole line: its logger's time stamp, [ALWAYS] and its name.
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[ALWAYS\] \[RankMonServer\.Restarter\] "
                     r"\[NestedRestarter\] name=\[InJob\] state=initialize$", r.stdout, re.M), r.stdout


def test_a_failing_then_recovering_run_prints_the_sequence_with_restarts(job, tmp_path):
    r = ft_launcher(job, tmp_path, FAIL="1")
    assert r.returncode == 0, r.stdout
    assert "Simulating fault" in r.stdout and "Leaving main" in r.stdout
    assert restarter_sequence_ok(r.stdout, with_restarts=True), r.stdout


def test_vigil_run_prints_them_only_when_asked(job):
    write(job / "t.py", RANK)
    r = run_vigil(["run", "--nproc-per-node", "2", "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    assert r.returncode == 0, r.stderr
    assert "NestedRestarter" not in r.stdout + r.stderr
    r = run_vigil(["run", "--nvrx-restarter-log", "--nproc-per-node", "2", "t.py"], cwd=job,
                  env=base_env(OUT_DIR=job))
    assert r.returncode == 0, r.stderr
    assert restarter_sequence_ok(r.stdout, with_restarts=False), r.stdout


CYCLE_KEYS = ["job_id", "attempt_index", "cycle_number", "cycle_start_time", "cycle_end_time",
              "cycle_log_file", "active_nodes", "standby_nodes", "generation", "active_ranks"]
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def test_cycle_info_files_link_and_environment(job, tmp_path):
    r = ft_launcher(job, tmp_path, extra=["--ft-cycle-info-dir", "ci/nvrx"], FAIL="1",
                    SLURM_ARRAY_JOB_ID="4242", SLURM_RESTART_CNT="3")
    assert r.returncode == 0, r.stdout
    ci = job / "ci" / "nvrx"
    assert sorted(p.name for p in ci.iterdir()) == [
        "cycle_info.4242.3.0", "cycle_info.4242.3.1", "cycle_info.4242.current"]
    link = ci / "cycle_info.4242.current"
    assert os.readlink(link) == "cycle_info.4242.3.1", "relative, as NVRx's"
    files = {}
    for cycle in (0, 1):
        text = (ci / f"cycle_info.4242.3.{cycle}").read_text()
        info = json.loads(text)
        assert list(info) == CYCLE_KEYS, text
        # protobuf's JSON: two-space indent, the uint64 generation as a string, no final newline.
        assert text.startswith('{\n  "job_id": "4242",\n') and text.endswith('"\n}'), text
        assert info["job_id"] == "4242" and info["attempt_index"] == 3 and info["cycle_number"] == cycle
        assert ISO.match(info["cycle_start_time"]) and ISO.match(info["cycle_end_time"]), text
        assert info["cycle_start_time"] <= info["cycle_end_time"]
        assert info["generation"] == "1", "written at the start, updated once at the end"
        assert info["active_nodes"] and info["active_ranks"] == "0"
        assert info["cycle_log_file"] == "" and info["standby_nodes"] == ""
        files[cycle] = info
    assert files[0]["cycle_end_time"] <= files[1]["cycle_start_time"]
    # Each attempt's ranks found their own cycle's file behind NVRX_CURRENT_CYCLE_INFO.
    for attempt in (0, 1):
        for rank in (0, 1):
            seen = json.loads((job / f"seen_{attempt}_{rank}.json").read_text())
            assert seen["env"] == str(link)
            info = json.loads(seen["text"])
            assert info["cycle_number"] == attempt and info["cycle_end_time"] == ""
            assert info["generation"] == "0"


def test_without_a_cycle_info_dir_ranks_get_no_variable(job, tmp_path):
    r = ft_launcher(job, tmp_path)
    assert r.returncode == 0, r.stdout
    assert not list(job.glob("seen_*"))

"""Issue 19 on the real Slurm cluster: a job never loops or hangs for a node it wrongly blamed, and
vigil inside a container (no Slurm client on its PATH) still stops before the time limit, is
requeued by the batch script and tells the ranks the window Slurm really gives.

- A failure that every node shares, or that happens on the only node, is the code's: the job is
  requeued --max-requeues times and stops, nobody excluded (field finding 4: a one-node job was
  excluded from its only node and stayed PENDING forever).
- A failure on one node only still gets that node excluded, but never so many nodes that the
  partition cannot run the job (asked of sinfo).
- Inside a container: the batch script reads the end time, KillWait and GraceTime, and requeues on
  vigil's request file (docs/launch.md, "Inside a container"; field finding 8).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import SHIM, vigil_bin

from . import slurmlib
from .conftest import _unavailable
from .slurmlib import TERMINAL_STATES, sbatch, show_job, slurm_cmd, wait_job

TRAIN = r"""
import json, os, sys, time, pathlib
import vigil

out = pathlib.Path(os.environ["OUT_DIR"])
total = int(os.environ.get("TOTAL_STEPS", "20"))
step_s = float(os.environ.get("STEP_S", "0.05"))
fail_nodes = os.environ.get("FAIL_NODES", "").split(",")  # node names, or "all"
world = int(os.environ["WORLD_SIZE"])
rank = int(os.environ["RANK"])
alloc = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
node = os.environ.get("SLURMD_NODENAME")
ckpt = out / f"ckpt_{rank}.json"
run = out / f"run_{rank}_{alloc}_{attempt}.json"


def atomic_write(path, obj):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


start = json.loads(ckpt.read_text())["step"] + 1 if ckpt.exists() else 0
rec = {"rank": rank, "alloc": alloc, "attempt": attempt, "node": node, "resumed_from": start,
       "reached": None, "checkpoint": None, "end": None}
atomic_write(run, rec)
for step in range(start, total):
    time.sleep(step_s)
    rec["reached"] = step
    if vigil.should_stop(step):
        atomic_write(ckpt, {"step": step})
        rec["checkpoint"], rec["end"], rec["stop_step"] = step, "stopped", vigil.stop_step()
        atomic_write(run, rec)
        sys.exit(0)
    if step == start + 3 and ("all" in fail_nodes or node in fail_nodes):
        rec["end"] = "failed"
        atomic_write(run, rec)
        if "all" in fail_nodes:
            # Every rank of the attempt fails at one instant: no node's failure is seen before
            # another's (a barrier of files, then the next half second of the clock).
            (out / f"ready_{alloc}_{attempt}_{rank}").touch()
            while len(list(out.glob(f"ready_{alloc}_{attempt}_*"))) < world:
                time.sleep(0.005)
            time.sleep(0.5 - time.time() % 0.5)
        os._exit(3)
    if step % 10 == 0:
        atomic_write(run, rec)
vigil.mark_finished()
rec["end"] = "finished"
atomic_write(run, rec)
"""

NPROC = 2
SLURM_CLIENTS = {"scontrol", "squeue", "sinfo", "sbatch", "srun", "scancel", "salloc", "sacct",
                 "sattach", "sbcast", "sstat", "sprio", "sshare", "sdiag", "strigger", "sreport",
                 "sacctmgr", "scrontab", "sh5util", "sjobexitmod", "sjstat", "smap", "sview"}


def no_slurm_path(d: Path) -> str:
    """A directory of links to every program on PATH except Slurm's client: a container's view."""
    bin_dir = d / "noslurm-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for p in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        if not os.path.isdir(p):
            continue
        for f in os.listdir(p):
            link = bin_dir / f
            if f in SLURM_CLIENTS or link.exists() or link.is_symlink():
                continue
            link.symlink_to(os.path.join(p, f))
    return str(bin_dir)


def submit(d: Path, nodes: int, env: dict, vigil_flags: str = "", sbatch_opts: str = "",
           max_restarts: int = 1, before: str = "", after: str = "", vigil_path: str = "") -> int:
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.py").write_text(TRAIN)
    exports = " ".join(f"{k}={v}" for k, v in {"PYTHON_EXEC": sys.executable, "PYTHONPATH": SHIM,
                                                "OUT_DIR": d, **env}.items())
    # Without scontrol vigil cannot ask for node rank 0's NodeAddr; the test cluster's node names
    # are no host names (in a real container they are).
    prefix = f"env PATH={vigil_path} " if vigil_path else ""
    if vigil_path:
        vigil_flags += " --master-addr 127.0.0.1"
    return sbatch(
        f"""#!/bin/bash
#SBATCH -N {nodes} --ntasks-per-node=1 --open-mode=append {sbatch_opts}
export {exports}
{before}
srun --kill-on-bad-exit=0 {prefix}{vigil_bin()} run --nproc-per-node {NPROC} --max-restarts {max_restarts} \\
    --workers-stop-timeout 5 --max-no-progress 0 --log-dir {d}/logs --state-dir {d}/state {vigil_flags} train.py
{after}
""",
        d,
    )


def output(d: Path, job_id: int) -> str:
    f = d / f"slurm-{job_id}.out"
    return f.read_text() if f.exists() else "(no output)"


def ledger(d: Path, job_id: int) -> list:
    f = d / "state" / "ledger.jsonl"
    assert f.exists(), f"no ledger at {f}\n{output(d, job_id)}"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def runs(d: Path) -> dict:
    out = {}
    for f in d.glob("run_*.json"):
        r = json.loads(f.read_text())
        out[(r["rank"], r["alloc"], r["attempt"])] = r
    return out


def assert_requeued_max_then_stopped(d: Path, job_id: int, max_requeues: int, timeout: float = 400):
    """The job is requeued exactly `max_requeues` times, never left PENDING, and nobody excluded."""
    info = wait_job(job_id, timeout=timeout)
    out = output(d, job_id)
    assert info["JobState"] == "FAILED" and info["Restarts"] == str(max_requeues), f"{info}\n{out}"
    assert info["ExcNodeList"] == "(null)", f"{info}\n{out}"
    records = ledger(d, job_id)
    n = max_requeues + 1
    assert [r["allocation"] for r in records] == list(range(1, n + 1)), records
    assert [r["outcome"] for r in records] == ["failed"] * n, records
    assert [r["decision"] for r in records] == ["requeue"] * max_requeues + ["stop"], records
    assert all(r["excluded"] == [] for r in records), records
    assert "max-requeues" in records[-1]["why"], records[-1]
    assert "avoids" not in out, out
    return records, out


# --- a one-node cluster of its own ------------------------------------------------------------

ONE_DIR = Path(os.environ.get("VIGIL_SLURM1_DIR", "/tmp/vigil-slurm-1node"))
ONE_ENV = {
    "VIGIL_SLURM_DIR": str(ONE_DIR),
    "VIGIL_SLURM_NODES": "1",
    "VIGIL_SLURM_CTLD_PORT": os.environ.get("VIGIL_SLURM1_CTLD_PORT", "6917"),
    "VIGIL_SLURM_PORT0": os.environ.get("VIGIL_SLURM1_PORT0", "17100"),
    "VIGIL_SLURM_CLUSTER_NAME": "vigil1node",
}


def one_node_cluster(action: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "VIGIL_SLURM"))}
    env.update(ONE_ENV, SLURM_CONF=str(ONE_DIR / "etc" / "slurm.conf"))
    return subprocess.run(["bash", str(slurmlib.CLUSTER_SH), action], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)


@pytest.fixture(scope="module")
def one_node_up(slurm_cluster):
    """A private one-node cluster (n1) beside the shared one (which keeps munged its own to
    share), for this module's tests."""
    started = False
    if one_node_cluster("status").returncode != 0:
        p = one_node_cluster("start")
        if p.returncode != 0:
            _unavailable(f"the one-node cluster did not start:\n{p.stdout}")
        started = True
    yield
    if started:
        one_node_cluster("stop")


@pytest.fixture
def one_node(one_node_up, monkeypatch):
    """slurmlib's commands (sbatch, scontrol) point at the one-node cluster during one test."""
    monkeypatch.setattr(slurmlib, "SLURM_CONF", ONE_DIR / "etc" / "slurm.conf")


def test_a_one_node_job_failing_on_the_only_node_of_its_cluster_excludes_nobody(one_node, tmp_path):
    # Finding 4: every attempt fails on n1, the only node; excluding it left the job PENDING.
    job_id = submit(tmp_path, 1, {"TOTAL_STEPS": 10000, "FAIL_NODES": "all"}, "--max-requeues 2")
    records, _ = assert_requeued_max_then_stopped(tmp_path, job_id, 2)
    assert all(r["nodes"] == ["n1"] for r in records), records


def test_a_one_node_job_failing_every_time_excludes_nobody_where_other_nodes_exist(slurm_cluster, tmp_path):
    job_id = submit(tmp_path, 1, {"TOTAL_STEPS": 10000, "FAIL_NODES": "all"}, "--max-requeues 2")
    records, _ = assert_requeued_max_then_stopped(tmp_path, job_id, 2)
    # Nothing moved it: every allocation may land anywhere, and each one failed twice.
    assert all(r["restarts"] == 1 for r in records), records


def test_a_failure_every_node_shares_excludes_nobody(slurm_cluster, tmp_path):
    # Every rank on both nodes fails at one instant, in every attempt: whichever node's report
    # becomes the attempt's verdict, both nodes failed, and the failure is the code's.
    job_id = submit(tmp_path, 2, {"TOTAL_STEPS": 10000, "FAIL_NODES": "all"}, "--max-requeues 1")
    records, _ = assert_requeued_max_then_stopped(tmp_path, job_id, 1)
    assert records[0]["nodes"] == ["n1", "n2"], records


def test_a_node_that_alone_fails_is_excluded_but_never_past_what_the_partition_needs(slurm_cluster, tmp_path):
    # n2, then n3, fail alone twice in a row: n2 is excluded; n3 would leave the 3-node partition
    # one node short of the 2 the job needs, so it is not, and the job says why.
    job_id = submit(tmp_path, 2, {"TOTAL_STEPS": 10000, "FAIL_NODES": "n2,n3"}, "--max-requeues 2")
    info = wait_job(job_id, timeout=400)
    out = output(tmp_path, job_id)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "2", f"{info}\n{out}"
    assert info["ExcNodeList"] == "n2", f"{info}\n{out}"
    records = ledger(tmp_path, job_id)
    assert [r["decision"] for r in records] == ["requeue", "requeue", "stop"], records
    assert [r["nodes"] for r in records] == [["n1", "n2"], ["n1", "n3"], ["n1", "n3"]], records
    assert [r["excluded"] for r in records] == [["n2"], [], []], records
    assert "the next allocation avoids n2" in out, out
    assert "n3 not kept out of the next allocation: partition debug would have fewer than the 2" in out, out
    # n1's ranks never failed on their own.
    rs = runs(tmp_path)
    assert all(r["end"] != "failed" for r in rs.values() if r["node"] == "n1"), rs


# --- inside a container -------------------------------------------------------------------------

# The lines docs/launch.md ("Inside a container") gives a hand-written batch script, as vigil
# launch renders them: before srun ...
SCRIPT_BEFORE = r"""
export SLURM_JOB_END_TIME="${SLURM_JOB_END_TIME:-$(SLURM_TIME_FORMAT=%s squeue -h -j "$SLURM_JOB_ID" -o %e)}"
export VIGIL_SLURM_KILL_WAIT="$(scontrol show config | sed -n 's/^KillWait *= *\([0-9]*\).*/\1/p')"
export VIGIL_SLURM_GRACE_TIME="$(scontrol show partition "$SLURM_JOB_PARTITION" | sed -n 's/.*GraceTime=\([0-9]*\).*/\1/p')"
export VIGIL_REQUEUE_FILE="$OUT_DIR/state/requeue.$SLURM_JOB_ID"
rm -f "$VIGIL_REQUEUE_FILE"
"""
# ... and after it.
SCRIPT_AFTER = r"""
if [ -e "$VIGIL_REQUEUE_FILE" ]; then scontrol requeue "$SLURM_JOB_ID"; fi
"""


def test_without_slurms_commands_vigil_stops_before_the_limit_and_the_script_requeues(slurm_cluster, tmp_path):
    # Finding 8: vigil's PATH has no scontrol, squeue or sinfo; a 1-minute limit, --stop-lead 20.
    # 450 steps of 0.1 s cannot finish in one allocation.
    total, world = 450, 2 * NPROC
    path = no_slurm_path(tmp_path)
    job_id = submit(tmp_path, 2, {"TOTAL_STEPS": total, "STEP_S": 0.1}, "--stop-lead 20", "--time=1",
                    max_restarts=0, before=SCRIPT_BEFORE, after=SCRIPT_AFTER, vigil_path=path)
    info = wait_job(job_id, timeout=300)
    out = output(tmp_path, job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", f"{info}\n{out}"
    assert "DUE TO TIME LIMIT" not in out, out  # stopped ahead of Slurm's kill
    # Said once what it cannot do itself and what the script does, nothing failed loudly.
    assert out.count("Slurm's commands are not on PATH here") == 2, out  # one line per allocation
    assert "the end time is SLURM_JOB_END_TIME's" in out, out
    # The window after Slurm's own SIGTERM: KillWait 5 s (cluster.sh) at the time limit, the
    # partition's GraceTime 10 s at a preemption, each less a second or two for vigil.
    assert ("after Slurm's SIGTERM the ranks get 4.0s at the time limit (KillWait 5s from VIGIL_SLURM_KILL_WAIT), "
            "8.0s at a preemption (GraceTime 10s from VIGIL_SLURM_GRACE_TIME)") in out, out
    assert "the batch script requeues Slurm job" in out, out
    assert "could not requeue" not in out and "cannot learn when" not in out, out
    rs = runs(tmp_path)
    stopped = [rs.get((rank, 0, 0)) for rank in range(world)]
    assert all(r and r["end"] == "stopped" for r in stopped), stopped
    (s,) = {r["checkpoint"] for r in stopped}
    resumed = [rs.get((rank, 1, 0)) for rank in range(world)]
    assert all(r and r["resumed_from"] == s + 1 and r["end"] == "finished" for r in resumed), resumed
    records = ledger(tmp_path, job_id)
    assert [r["decision"] for r in records] == ["requeue", "finished"], records
    assert records[0]["stop_trigger"] in ("end-time", "time-limit"), records[0]
    assert not Path(tmp_path / "state" / f"requeue.{job_id}").exists()  # the script's rm at the start


@pytest.mark.parametrize("inside", [False, True], ids=["slurm-on-path", "container"])
def test_after_slurms_sigterm_the_ranks_are_told_slurms_window(slurm_cluster, tmp_path, inside):
    # A SIGTERM to the steps 10 minutes before the time limit can only be a preemption's (or
    # scancel --signal's): the ranks have the partition's GraceTime (10 s on 'debug', KillWait
    # 5 s), less vigil's own 2 s, not --term-timeout's 30 s.
    total, world = 10000, 2 * NPROC
    kw = {"before": SCRIPT_BEFORE, "after": SCRIPT_AFTER, "vigil_path": no_slurm_path(tmp_path)} if inside else {}
    job_id = submit(tmp_path, 2, {"TOTAL_STEPS": total, "STEP_S": 0.1}, sbatch_opts="--time=10",
                    max_restarts=0, **kw)
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"run_{r}_0_0.json").exists() for r in range(world)):
        assert show_job(job_id)["JobState"] not in TERMINAL_STATES, output(tmp_path, job_id)
        assert time.monotonic() < deadline, output(tmp_path, job_id)
        time.sleep(0.2)
    time.sleep(2)
    slurm_cmd("scancel", "--signal=TERM", job_id)
    deadline = time.monotonic() + 120
    while "they have" not in output(tmp_path, job_id):
        assert time.monotonic() < deadline, output(tmp_path, job_id)
        time.sleep(0.2)
    slurm_cmd("scancel", job_id)
    wait_job(job_id, timeout=120)
    out = output(tmp_path, job_id)
    assert "SIGTERM: asking every rank to checkpoint at one agreed step and exit (they have 8s)" in out, out
    assert "they have 30s" not in out, out

"""A job's state is that job's alone, and it survives the move to another host (issue 19).

Field conditions, deliberately: the jobs share one $TMPDIR (this test's, passed on by sbatch, as
/tmp is shared on a login node), their submit directory (a home directory) and, after a restart
of the cluster, their Slurm job ids (a new controller state starts again at 1). No test here
passes --log-dir or --state-dir: the default state directory is what is under test.

The cluster is restarted with `cluster.sh stop` + `start` (its state wiped, so job ids start at
1), and always left up for the tests that follow in the session.
"""
import json
import os
import sys
import time
from pathlib import Path

import pytest

from harness import SHIM, base_env, run_vigil, vigil_bin

from . import slurmlib
from .slurmlib import sbatch, show_job, slurm_cmd, wait_job
from .test_allocations import TRAIN, runs

# Rank 0 exits 3 (after rank 0 of the first allocation was told to go); every other rank waits to
# be stopped. It never reports a step: only --max-requeues bounds it, as always.
FAILS = r"""
import os, pathlib, sys, time
out = pathlib.Path(os.environ["OUT_DIR"])
alloc = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
rank = os.environ["RANK"]
(out / f"up_{alloc}_{rank}").write_text(os.environ["SLURMD_NODENAME"])
while os.environ.get("GATED") and alloc == 0 and not (out / "go").exists():
    time.sleep(0.05)
if rank == "0":
    sys.exit(3)
time.sleep(3600)
"""


@pytest.fixture
def restart_cluster(slurm_cluster):
    """Restarts the cluster with a new controller state (job ids start again at 1); the cluster
    is up again after the test whatever happened."""
    def restart():
        for action in ("stop", "start"):
            p = slurmlib.cluster(action)
            assert p.returncode == 0, f"cluster.sh {action} exited {p.returncode}:\n{p.stdout}"
    yield restart
    if slurmlib.cluster("status").returncode != 0:
        p = slurmlib.cluster("start")
        assert p.returncode == 0, p.stdout


def submit(home: Path, tag: str, script: str, nodes: int, env: dict, vigil_flags: str,
           sbatch_opts: str = "", node_local_tmp: bool = False) -> int:
    """`srun vigil run` of `script` from `home` (the submit directory), one rank per node, output
    in home/<tag>-<id>.out, the ranks' files in home/<tag>/. With `node_local_tmp` each Slurm node
    has a $TMPDIR of its own (home/tmp-<node>), as nodes with local disks do."""
    out = home / tag
    out.mkdir(parents=True, exist_ok=True)
    (home / f"{tag}.py").write_text(script)
    exports = " ".join(f"{k}={v}" for k, v in {"PYTHON_EXEC": sys.executable, "PYTHONPATH": SHIM,
                                                "OUT_DIR": out, **env}.items())
    tmp = f'export TMPDIR={home}/tmp-$SLURMD_NODENAME; mkdir -p $TMPDIR; ' if node_local_tmp else ""
    return sbatch(
        f"""#!/bin/bash
#SBATCH -N {nodes} --ntasks-per-node=1 --open-mode=append {sbatch_opts}
export {exports}
srun bash -c '{tmp}exec {vigil_bin()} run --nproc-per-node 1 --max-restarts 0 --workers-stop-timeout 5 {vigil_flags} {tag}.py'
""",
        home,
        extra_args=[f"--output={home}/{tag}-%j.out"],
    )


def output(home: Path, tag: str, job_id: int) -> str:
    f = home / f"{tag}-{job_id}.out"
    return f.read_text() if f.exists() else "(no output)"


def state_dir(home: Path, job_id: int) -> Path:
    """The job's default state directory: by its submit directory, named by cluster and id (or
    where vigil kept it before issue 19, $TMPDIR/vigil-job-<id>, so that a test run against an
    older vigil fails on what the job did, not on where its state is)."""
    found = list(home.glob(f"vigil-job-*-{job_id}")) or [Path(os.environ["TMPDIR"]) / f"vigil-job-{job_id}"]
    assert len(found) == 1, found
    return found[0]


def records(d: Path) -> list:
    return [json.loads(l) for l in (d / "ledger.jsonl").read_text().splitlines() if l.strip()]


def wait_restarts(job_id: int, n: int, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        info = show_job(job_id)
        if int(info.get("Restarts", "0")) >= n:
            return info
        assert info["JobState"] not in slurmlib.TERMINAL_STATES, info
        assert time.monotonic() < deadline, f"job {job_id} not requeued {n} time(s) in {timeout}s: {info}"
        time.sleep(0.2)


def test_two_jobs_with_the_same_slurm_id_from_two_controller_states_share_nothing(
        restart_cluster, tmp_path):
    home = tmp_path
    restart_cluster()
    # The first job 1 fails and is requeued, with a long lead; the cluster is then restarted
    # under it (its state is lost, as when a controller is rebuilt).
    old = submit(home, "old", FAILS, 1, {}, "--max-requeues 5 --stop-lead 90")
    wait_restarts(old, 1)
    old_records = records(state_dir(home, old))
    assert old_records and all(r["decision"] == "requeue" for r in old_records), old_records
    restart_cluster()
    # The new job 1: same id, same submit directory, same $TMPDIR.
    new = submit(home, "new", FAILS, 1, {}, "--max-requeues 1")
    assert new == old, "a new controller state starts at job id 1 again"
    info = wait_job(new, timeout=180)
    out = output(home, "new", new)
    # Its own count: requeued once (--max-requeues 1), then stopped; nothing of the old job 1.
    assert info["JobState"] == "FAILED" and info["Restarts"] == "1", f"{info}\n{out}"
    d = state_dir(home, new)
    mine = records(d)
    assert [(r["allocation"], r["restart_count"], r["decision"]) for r in mine] == [
        (1, 0, "requeue"), (2, 1, "stop")], mine
    assert mine[0]["why"] == "failed, 1 in a row (--max-requeues 1)", mine[0]
    assert all(r["stop_lead_s"] == 60.0 for r in mine), "the old job's lead was not carried"
    assert all(r["cluster"] == mine[0]["cluster"] and r["cluster"] for r in mine), mine
    # The old job's state was set aside, whole, and that was said once.
    (aside,) = d.glob("set-aside-*")
    aside_records = records(aside)  # the old job may have ended one more allocation since
    assert aside_records[:len(old_records)] == old_records, aside_records
    assert all(r["stop_lead_s"] == 90.0 for r in aside_records), aside_records
    assert out.count("already held a job's state") == 1, out
    # `vigil ledger <id>`, run from the submit directory, finds the new job's ledger.
    table = run_vigil(["ledger", str(new)], cwd=home, env=base_env())
    assert table.returncode == 0, table.stderr
    rows = [l for l in table.stdout.splitlines() if l[:1].isdigit()]
    assert len(rows) == 2 and "stop" in rows[1], table.stdout


def test_node_rank_0_on_another_host_keeps_the_requeue_count(slurm_cluster, tmp_path):
    home = tmp_path
    job = submit(home, "move", FAILS, 2, {"GATED": 1}, "--max-requeues 1", node_local_tmp=True)
    # Node rank 0 of the first allocation is kept out of the next one: the next node rank 0 is
    # another Slurm node, with another node-local $TMPDIR (on a real cluster: another host).
    out_dir = home / "move"
    slurmlib.wait_for_path(out_dir / "up_0_0")
    slurmlib.wait_for_path(out_dir / "up_0_1")
    first_head = (out_dir / "up_0_0").read_text()
    slurm_cmd("scontrol", "update", f"NodeName={first_head}", "State=DRAIN", "Reason=vigil-test-move")
    try:
        (out_dir / "go").write_text("1")
        info = wait_job(job, timeout=240)
    finally:
        slurm_cmd("scontrol", "update", f"NodeName={first_head}", "State=RESUME", check=False)
    out = output(home, "move", job)
    second_head = (out_dir / "up_1_0").read_text()
    assert second_head != first_head, (first_head, second_head)
    # Failed twice, requeued once (--max-requeues 1): the second node rank 0 found the count.
    assert info["JobState"] == "FAILED" and info["Restarts"] == "1", f"{info}\n{out}"
    assert not (out_dir / "up_2_0").exists(), "a third allocation ran"
    recs = records(state_dir(home, job))
    assert [(r["allocation"], r["outcome"], r["decision"]) for r in recs] == [
        (1, "failed", "requeue"), (2, "failed", "stop")], recs
    assert recs[0]["nodes"][0] == first_head and recs[1]["nodes"][0] == second_head, recs
    assert "2 in a row: more than --max-requeues 1" in recs[1]["why"], recs[1]
    table = run_vigil(["ledger", str(job)], cwd=home, env=base_env())
    assert table.returncode == 0 and len([l for l in table.stdout.splitlines() if l[:1].isdigit()]) == 2, \
        table.stdout + table.stderr


def test_a_one_minute_job_with_a_20s_lead_checkpoints_is_requeued_and_finishes(restart_cluster, tmp_path):
    home = tmp_path
    restart_cluster()
    # An earlier job 1 of another controller state, run with the default 60 s lead, finished.
    earlier = submit(home, "earlier", TRAIN, 1, {"TOTAL_STEPS": 5, "STEP_S": 0.01}, "")
    info = wait_job(earlier, timeout=120)
    assert info["JobState"] == "COMPLETED", f"{info}\n{output(home, 'earlier', earlier)}"
    restart_cluster()
    # 1-minute limit, --stop-lead 20: the ranks stop near 40 s, checkpoint, and the next
    # allocation resumes from there and finishes (450 steps of 0.1 s need more than one).
    job = submit(home, "minute", TRAIN, 1, {"TOTAL_STEPS": 450, "STEP_S": 0.1}, "--stop-lead 20",
                 sbatch_opts="--time=1")
    assert job == earlier
    info = wait_job(job, timeout=300)
    out = output(home, "minute", job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{out}"
    assert int(info["Restarts"]) >= 1, info
    assert "they have 20s" in out and "they have 60s" not in out, out
    recs = records(state_dir(home, job))
    assert [r["decision"] for r in recs] == ["requeue"] * (len(recs) - 1) + ["finished"], recs
    for r in recs[:-1]:
        assert r["outcome"] == "stopped" and r["stop_trigger"] == "time-limit", r
        assert r["stop_lead_s"] == 20.0 and r["stop_step"] is not None and r["stop_step"] > 0, r
    # Each allocation resumed from the checkpoint of the one before.
    rs = runs(home / "minute")
    for a in range(1, len(recs)):
        assert rs[(0, a, 0)]["resumed_from"] == rs[(0, a - 1, 0)]["checkpoint"] + 1, rs
    assert rs[(0, len(recs) - 1, 0)]["end"] == "finished", rs


def test_a_lead_as_long_as_the_slurm_time_limit_is_capped_and_the_job_finishes(slurm_cluster, tmp_path):
    """Finding 5 under Slurm, where the end is known only at run time: the default 60 s lead and a
    1-minute limit. The lead is capped at half the allocation, said once per allocation; the ranks
    train, checkpoint, and the job finishes."""
    home = tmp_path
    job = submit(home, "capped", TRAIN, 1, {"TOTAL_STEPS": 450, "STEP_S": 0.1}, "", sbatch_opts="--time=1")
    info = wait_job(job, timeout=300)
    out = output(home, "capped", job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{out}"
    allocations = int(info["Restarts"]) + 1
    assert allocations >= 2, info
    capped = [l for l in out.splitlines() if "the stop lead of 60s would leave less than half" in l]
    assert len(capped) == allocations, out
    recs = records(state_dir(home, job))
    assert [r["decision"] for r in recs] == ["requeue"] * (allocations - 1) + ["finished"], recs
    for r in recs[:-1]:
        assert r["outcome"] == "stopped" and r["stop_step"] and r["stop_lead_s"] <= 30.0, r
    rs = runs(home / "capped")
    assert rs[(0, 1, 0)]["resumed_from"] == rs[(0, 0, 0)]["checkpoint"] + 1 > 1, rs

"""Issue 10 on the real Slurm cluster: a job lives across allocations. Every rank checkpoints at one
agreed step before the time limit, on preemption or on `scancel --signal`; vigil (node rank 0)
requeues the job, the next allocation resumes from that step + 1; failed allocations are requeued
only --max-requeues times, a job without progress stops, a lost node is excluded, and a suspension
is neither a hang nor a reason to requeue. The ledger (<state dir>/ledger.jsonl) keeps one record per
allocation.

The training script follows the checkpoint convention of docs/allocations.md: each rank writes its
step atomically when `vigil.should_stop(step)` is True and exits 0, and resumes from the step + 1.
It also writes run_<rank>_<allocation>_<attempt>.json (resumed-from step, step reached, checkpoint
step, how it ended) for the test to read.
"""
import json
import os
import signal
import sys
import time
from pathlib import Path

from harness import SHIM, vigil_bin

from .slurmlib import TERMINAL_STATES, sbatch, show_job, slurm_cmd, wait_job

TRAIN = r"""
import json, os, sys, time, pathlib
import vigil

out = pathlib.Path(os.environ["OUT_DIR"])
total, step_s = int(os.environ["TOTAL_STEPS"]), float(os.environ.get("STEP_S", "0.1"))
ckpt_every = int(os.environ.get("CKPT_EVERY", "0"))  # also checkpoint every N steps (0: only at a stop)
fail_rank = os.environ.get("FAIL_RANK", "none")  # this rank ("all": every rank) exits 3 ...
fail_after = int(os.environ.get("FAIL_AFTER", "0"))  # ... this many steps after resuming
exit_delay = float(os.environ.get("EXIT_DELAY", "0"))  # seconds a stopped rank takes to exit
rank = int(os.environ["RANK"])
alloc = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
ckpt = out / f"ckpt_{rank}.json"
run = out / f"run_{rank}_{alloc}_{attempt}.json"


def atomic_write(path, obj):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def save(step):
    with vigil.section("checkpointing"):
        atomic_write(ckpt, {"step": step})
    rec["checkpoint"] = step


start = json.loads(ckpt.read_text())["step"] + 1 if ckpt.exists() else 0
rec = {"rank": rank, "alloc": alloc, "attempt": attempt, "node": os.environ.get("SLURMD_NODENAME"),
       "pid": os.getpid(), "resumed_from": start, "reached": None, "checkpoint": None, "end": None}
atomic_write(run, rec)
for step in range(start, total):
    time.sleep(step_s)
    vigil.heartbeat(step)
    rec["reached"] = step
    if vigil.should_stop(step):  # also tells the agent this rank reached `step`
        save(step)
        rec["end"], rec["stop_step"] = "stopped", vigil.stop_step()
        atomic_write(run, rec)
        time.sleep(exit_delay)
        sys.exit(0)
    if fail_rank in (str(rank), "all") and step >= start + fail_after:
        rec["end"] = "failed"
        atomic_write(run, rec)
        sys.exit(3)
    if ckpt_every and step % ckpt_every == 0:
        save(step)
    if step % 10 == 0:
        atomic_write(run, rec)
vigil.mark_finished()
rec["end"] = "finished"
atomic_write(run, rec)
"""

NPROC = 2


def submit(d: Path, nodes: int, env: dict, vigil_flags: str = "", sbatch_opts: str = "",
           max_restarts: int = 0) -> int:
    """Submits `srun vigil run` of TRAIN on `nodes` nodes, NPROC ranks each, no in-job restarts
    unless `max_restarts` says."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.py").write_text(TRAIN)
    exports = " ".join(f"{k}={v}" for k, v in {"PYTHON_EXEC": sys.executable, "PYTHONPATH": SHIM, "OUT_DIR": d,
                                                **env}.items())
    return sbatch(
        f"""#!/bin/bash
#SBATCH -N {nodes} --ntasks-per-node=1 --open-mode=append {sbatch_opts}
export {exports}
srun {vigil_bin()} run --nproc-per-node {NPROC} --max-restarts {max_restarts} --workers-stop-timeout 5 \\
    --log-dir {d}/logs --state-dir {d}/state {vigil_flags} train.py
""",
        d,
    )


def output(d: Path, job_id: int) -> str:
    f = d / f"slurm-{job_id}.out"
    return f.read_text() if f.exists() else "(no output)"


def runs(d: Path) -> dict:
    """{(rank, allocation, attempt): the rank's record}."""
    out = {}
    for f in d.glob("run_*.json"):
        r = json.loads(f.read_text())
        out[(r["rank"], r["alloc"], r["attempt"])] = r
    return out


def ledger(d: Path, job_id: int = None) -> list:
    f = d / "state" / "ledger.jsonl"
    assert f.exists(), f"no ledger at {f}" + (f"\n{output(d, job_id)}" if job_id else "")
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def finished(d: Path, job_id: int, timeout: float) -> dict:
    info = wait_job(job_id, timeout=timeout)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{output(d, job_id)}"
    return info


def wait_progress(d: Path, job_id: int, world: int, steps: int, timeout: float = 120.0, alloc: int = 0):
    """Waits until every rank of the allocation's first attempt reported reaching `steps`."""
    deadline = time.monotonic() + timeout
    while True:
        rs = runs(d)
        done = [r for (_, a, t), r in rs.items() if a == alloc and t == 0 and (r["reached"] or 0) >= steps]
        if len(done) == world:
            return
        info = show_job(job_id)
        if info["JobState"] in TERMINAL_STATES:
            raise AssertionError(f"job ended before ranks reached step {steps}: {info}\n{output(d, job_id)}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"ranks did not reach step {steps} within {timeout}s: {rs}")
        time.sleep(0.2)


def assert_stopped_together_and_resumed(d: Path, world: int, alloc: int = 0) -> int:
    """Every rank checkpointed at one step S in `alloc` and resumed at S + 1 in the next; returns S."""
    rs = runs(d)
    stopped = [rs.get((rank, alloc, 0)) for rank in range(world)]
    assert all(r and r["end"] == "stopped" for r in stopped), stopped
    steps = {r["checkpoint"] for r in stopped}
    assert len(steps) == 1, f"ranks checkpointed at different steps: {stopped}"
    (s,) = steps
    assert {r["stop_step"] for r in stopped} == {s} and {r["reached"] for r in stopped} == {s}, stopped
    resumed = [rs.get((rank, alloc + 1, 0)) for rank in range(world)]
    assert all(r and r["resumed_from"] == s + 1 for r in resumed), resumed
    return s


def assert_finished_last(d: Path, world: int, alloc: int, total: int):
    rs = runs(d)
    last = [rs.get((rank, alloc, 0)) for rank in range(world)]
    assert all(r and r["end"] == "finished" and r["reached"] == total - 1 for r in last), last


def assert_stop_then_finish_ledger(records: list, s: int, triggers: tuple, nodes: list, job_id: int, total: int):
    assert len(records) == 2, records
    first, second = records
    assert first["format"] == 1 and first["allocation"] == 1 and first["job_id"] == str(job_id), first
    assert first["restart_count"] == 0 and first["nodes"] == nodes, first
    assert first["outcome"] == "stopped" and first["decision"] == "requeue", first
    assert first["stop_step"] == s and first["highest_step"] == s, first
    assert first["stop_trigger"] in triggers, first
    assert first["exit_status"] == 75 and first["excluded"] == [], first
    assert first["stop_lead_s"] >= 20 and first["start"] < first["end"] <= second["start"], records
    assert second["allocation"] == 2 and second["restart_count"] == 1, second
    assert second["outcome"] == "finished" and second["decision"] == "finished", second
    assert second["highest_step"] == total - 1 and second["exit_status"] == 0, second


def test_time_limit_checkpoints_at_one_step_requeues_and_resumes(slurm_cluster, tmp_path):
    # 450 steps of 0.1 s (45 s) cannot finish in a 1-minute allocation that stops 20 s early; the
    # rest fits in the second even at 0.15 s a step. No --signal: vigil reads the end time from Slurm.
    total, world = 450, 3 * NPROC
    job_id = submit(tmp_path, 3, {"TOTAL_STEPS": total}, "--stop-lead 20", "--time=1")
    info = finished(tmp_path, job_id, timeout=300)
    assert info["Restarts"] == "1", info
    out = output(tmp_path, job_id)
    assert "DUE TO TIME LIMIT" not in out, out  # stopped and requeued before Slurm's kill
    s = assert_stopped_together_and_resumed(tmp_path, world)
    assert_finished_last(tmp_path, world, 1, total)
    assert_stop_then_finish_ledger(ledger(tmp_path), s, ("end-time", "time-limit"), ["n1", "n2", "n3"], job_id, total)


def test_preemption_checkpoints_within_the_grace_and_resumes(slurm_cluster, tmp_path):
    total, world = 200, 3 * NPROC
    low = tmp_path / "low"
    job_id = submit(low, 3, {"TOTAL_STEPS": total}, "--stop-lead 20", "-p low")
    wait_progress(low, job_id, world, 30)
    # --exclusive: the high job needs a whole node, so it cannot share one with the low job.
    high = sbatch("#!/bin/bash\n#SBATCH -N 1 -p high --exclusive\nsleep 1\n", tmp_path / "high")
    assert wait_job(high, timeout=120)["JobState"] == "COMPLETED"
    info = finished(low, job_id, timeout=240)
    assert info["Restarts"] == "1", info
    # Stopped ranks wrote their checkpoint and exited 0: all within the 20 s GraceTime of 'low'.
    s = assert_stopped_together_and_resumed(low, world)
    assert s < total - 1
    assert_finished_last(low, world, 1, total)
    assert_stop_then_finish_ledger(ledger(low), s, ("SIGTERM",), ["n1", "n2", "n3"], job_id, total)


def test_scancel_signal_to_the_steps_stops_at_one_step_and_requeues(slurm_cluster, tmp_path):
    total, world = 200, 3 * NPROC
    job_id = submit(tmp_path, 3, {"TOTAL_STEPS": total}, "--stop-lead 20")
    wait_progress(tmp_path, job_id, world, 30)
    slurm_cmd("scancel", "--signal=TERM", job_id)  # the job's steps only, not the batch shell
    info = finished(tmp_path, job_id, timeout=240)
    assert info["Restarts"] == "1", info
    s = assert_stopped_together_and_resumed(tmp_path, world)
    assert_finished_last(tmp_path, world, 1, total)
    assert_stop_then_finish_ledger(ledger(tmp_path), s, ("SIGTERM",), ["n1", "n2", "n3"], job_id, total)


def requeued_at_30_then_finished(tmp_path, env):
    """A 2-node job of 200 steps (`env` added to the ranks') that `scontrol requeue` stops once
    every rank reached step 30; it resumes at one step and finishes. Returns (job id, stop step,
    the first allocation's ledger record, the second's)."""
    total, world = 200, 2 * NPROC
    job_id = submit(tmp_path, 2, {"TOTAL_STEPS": total, **env}, "--stop-lead 20")
    wait_progress(tmp_path, job_id, world, 30)
    slurm_cmd("scontrol", "requeue", job_id)
    info = finished(tmp_path, job_id, timeout=300)
    assert info["Restarts"] == "1", info
    s = assert_stopped_together_and_resumed(tmp_path, world)
    assert_finished_last(tmp_path, world, 1, total)
    records = ledger(tmp_path, job_id)
    assert [(r["allocation"], r["restart_count"]) for r in records] == [(1, 0), (2, 1)], records
    first, second = records
    assert (first["outcome"], first["decision"], first["stop_step"]) == ("stopped", "requeue", s), first
    assert first["stop_trigger"] == "SIGTERM", first
    assert second["outcome"] == "finished" and second["highest_step"] == total - 1, second
    return job_id, s, first, second


def test_a_requeue_whose_ranks_outlast_killwait_is_still_in_the_ledger(slurm_cluster, tmp_path):
    # `scontrol requeue`: Slurm SIGTERMs the job and SIGKILLs it KillWait (5 s here) later. The
    # ranks stop at one step and save it, then take 20 s to exit (a slow interpreter shutdown, a
    # loaded node): node rank 0 must have recorded the allocation when the stop was agreed.
    # The next allocation must not wait for the ranks' delay: the rest runs with none.
    _, _, first, _ = requeued_at_30_then_finished(tmp_path, {"EXIT_DELAY": 20})
    assert len(first["nodes"]) == 2 and set(first["nodes"]) <= {"n1", "n2", "n3"}, first


def test_a_requeue_slurm_made_itself_is_recorded_as_a_requeue_and_not_made_again(slurm_cluster, tmp_path):
    # `scontrol requeue` with ranks that exit at once after their save: node rank 0 gets to ask
    # Slurm how the job ended. The job is COMPLETING before its time limit, as after a scancel,
    # but Slurm has requeued it (its Restarts= counts the next start): the ledger says requeue,
    # not stop, and vigil does not requeue it a second time.
    job_id, _, first, _ = requeued_at_30_then_finished(tmp_path, {})
    assert "Slurm requeued the job itself" in first["why"], first
    out = output(tmp_path, job_id)
    assert f"Slurm job {job_id} is requeued" in out and "requeued Slurm job" not in out, out


def test_scancel_ends_the_job_for_good_after_one_checkpoint(slurm_cluster, tmp_path):
    # A plain scancel reaches the agents as a SIGTERM, as the time limit does: the ranks still
    # checkpoint at one step, but vigil must not requeue a job a person cancelled.
    total, world = 10000, 2 * NPROC
    job_id = submit(tmp_path, 2, {"TOTAL_STEPS": total})
    wait_progress(tmp_path, job_id, world, 30)
    slurm_cmd("scancel", job_id)
    info = wait_job(job_id, timeout=120)
    out = output(tmp_path, job_id)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", f"{info}\n{out}"
    (record,) = ledger(tmp_path, job_id)
    assert record["decision"] == "stop" and "scancel" in record["why"], record
    assert "requeued Slurm job" not in out, out


def test_always_failing_job_is_requeued_max_requeues_times_then_stops(slurm_cluster, tmp_path):
    # Rank 0 fails 10 steps after each resume, after checkpoints every 5 steps: progress each time,
    # so only --max-requeues ends it.
    env = {"TOTAL_STEPS": 10000, "FAIL_RANK": 0, "FAIL_AFTER": 10, "CKPT_EVERY": 5}
    job_id = submit(tmp_path, 2, env, "--max-requeues 2")
    info = wait_job(job_id, timeout=300)
    out = output(tmp_path, job_id)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "2", f"{info}\n{out}"
    records = ledger(tmp_path)
    assert [r["allocation"] for r in records] == [1, 2, 3], records
    assert [r["outcome"] for r in records] == ["failed"] * 3, records
    assert [r["decision"] for r in records] == ["requeue", "requeue", "stop"], records
    assert "max-requeues" in records[-1]["why"], records[-1]
    assert records[-1]["exit_status"] not in (0, 75), records[-1]
    highest = [r["highest_step"] for r in records]
    assert highest == sorted(set(highest)), f"progress was made each time: {records}"
    rs = runs(tmp_path)
    assert [rs[(0, a, 0)]["end"] for a in range(3)] == ["failed"] * 3
    assert (0, 3, 0) not in rs


def test_job_without_progress_stops_requeueing(slurm_cluster, tmp_path):
    # Every rank fails at step 5 every time and never checkpoints: the highest step stays 5.
    env = {"TOTAL_STEPS": 10000, "FAIL_RANK": "all", "FAIL_AFTER": 5}
    job_id = submit(tmp_path, 2, env, "--max-requeues 10 --max-no-progress 2")
    info = wait_job(job_id, timeout=300)
    out = output(tmp_path, job_id)
    assert info["JobState"] in TERMINAL_STATES - {"COMPLETED"}, f"{info}\n{out}"
    records = ledger(tmp_path, job_id)
    # 2 allocations without progress after the first: at most 3 allocations, far below 10 requeues.
    assert 2 <= len(records) <= 3 and info["Restarts"] == str(len(records) - 1), records
    assert [r["decision"] for r in records] == ["requeue"] * (len(records) - 1) + ["stop"], records
    # The allocation failed; the decision not to requeue says why: no progress.
    assert records[-1]["outcome"] == "failed" and "progress" in records[-1]["why"], records[-1]
    assert {r["highest_step"] for r in records} == {5}, records
    assert all(r["resumed_from"] == 0 for r in runs(tmp_path).values())


def agent_pid(job_id: int, node: str) -> int:
    """The pid of the job's vigil agent on `node` (all nodes are this host: read each environ)."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode()}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if (p / "comm").read_text().strip() != "vigil":
                continue
            env = set((p / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            return int(p.name)
    raise AssertionError(f"no vigil agent of job {job_id} on {node}")


def test_lost_node_is_excluded_and_the_job_runs_on_the_others(slurm_cluster, tmp_path):
    total, world = 300, 2 * NPROC
    job_id = submit(tmp_path, 2, {"TOTAL_STEPS": total, "CKPT_EVERY": 10})
    wait_progress(tmp_path, job_id, world, 30)
    assert show_job(job_id)["NodeList"] == "n[1-2]"
    os.kill(agent_pid(job_id, "n2"), signal.SIGKILL)
    info = finished(tmp_path, job_id, timeout=300)
    assert info["Restarts"] == "1" and info["ExcNodeList"] == "n2" and info["NodeList"] == "n[1,3]", info
    rs = runs(tmp_path)
    for rank in range(world):
        first, second = rs[(rank, 0, 0)], rs[(rank, 1, 0)]
        assert second["node"] == ("n1" if rank < NPROC else "n3"), second
        # The run record is written just after each checkpoint: a kill between the two leaves it
        # one checkpoint behind. Either way the rank resumed from a checkpoint it had reached.
        resumed = second["resumed_from"] - 1
        assert resumed % 10 == 0 and first["checkpoint"] <= resumed <= first["reached"], (first, second)
        assert second["end"] == "finished", second
    records = ledger(tmp_path)
    assert len(records) == 2, records
    assert records[0]["outcome"] == "lost" and records[0]["decision"] == "requeue", records[0]
    assert records[0]["excluded"] == ["n2"] and records[0]["nodes"] == ["n1", "n2"], records[0]
    assert records[1]["outcome"] == "finished" and records[1]["nodes"] == ["n1", "n3"], records[1]


def test_suspend_and_resume_neither_restarts_nor_requeues(slurm_cluster, tmp_path):
    total, world = 200, 3 * NPROC
    # A 5 s heartbeat timeout: a suspension twice as long must not count as a hang.
    job_id = submit(tmp_path, 3, {"TOTAL_STEPS": total}, "--heartbeat-timeout 5")
    wait_progress(tmp_path, job_id, world, 30)
    pid = runs(tmp_path)[(0, 0, 0)]["pid"]
    slurm_cmd("scontrol", "suspend", job_id)
    deadline = time.monotonic() + 30
    while "T" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]:
        assert time.monotonic() < deadline, "rank 0 not stopped by the suspension"
        time.sleep(0.1)
    assert show_job(job_id)["JobState"] == "SUSPENDED"
    time.sleep(10)  # the suspension's length is this test's input, not a wait for something
    slurm_cmd("scontrol", "resume", job_id)
    info = finished(tmp_path, job_id, timeout=240)
    assert info["Restarts"] == "0", info
    rs = runs(tmp_path)
    assert sorted(rs) == [(rank, 0, 0) for rank in range(world)], sorted(rs)  # one attempt, no restart
    assert_finished_last(tmp_path, world, 0, total)
    records = ledger(tmp_path)
    assert len(records) == 1 and records[0]["outcome"] == "finished" and records[0]["restarts"] == 0, records
    assert records[0]["decision"] == "finished" and records[0]["stop_step"] is None, records


def test_a_job_submitted_with_no_requeue_stops_at_one_step_and_says_it_cannot_be_requeued(slurm_cluster, tmp_path):
    total, world = 10000, 2 * NPROC
    job_id = submit(tmp_path, 2, {"TOTAL_STEPS": total}, "--stop-lead 20", "--no-requeue")
    wait_progress(tmp_path, job_id, world, 30)
    slurm_cmd("scancel", "--signal=TERM", job_id)
    info = wait_job(job_id, timeout=240)
    out = output(tmp_path, job_id)
    assert info["Restarts"] == "0" and info["Requeue"] == "0", f"{info}\n{out}"
    rs = runs(tmp_path)
    stopped = [rs.get((rank, 0, 0)) for rank in range(world)]
    assert all(r and r["end"] == "stopped" for r in stopped) and len({r["checkpoint"] for r in stopped}) == 1, stopped
    # One clear line from vigil: the job wanted a requeue, Slurm refuses it (--no-requeue).
    lines = [x for x in out.splitlines() if "vigil" in x and "no-requeue" in x]
    assert lines, out
    (record,) = ledger(tmp_path)
    assert record["outcome"] == "stopped" and "no-requeue" in record["why"], record


def test_a_spare_node_takes_a_lost_nodes_place_without_a_requeue(slurm_cluster, tmp_path):
    # Hot spares: 3 nodes, one of them a standby. The agent of node rank 1 (n2) dies; the standby
    # (n3) takes its group rank in the same allocation, from the last checkpoint.
    total, world = 300, 2 * NPROC
    job_id = submit(tmp_path, 3, {"TOTAL_STEPS": total, "CKPT_EVERY": 10}, "--spare-nodes 1",
                    max_restarts=2)
    wait_progress(tmp_path, job_id, world, 30)
    rs = runs(tmp_path)
    assert {rs[(r, 0, 0)]["node"] for r in range(NPROC, world)} == {"n2"}, rs
    os.kill(agent_pid(job_id, "n2"), signal.SIGKILL)
    info = wait_job(job_id, timeout=300)
    out = output(tmp_path, job_id)
    # Not requeued: the job finished in its first allocation. (srun's own status counts the agent
    # that was killed, so Slurm may call the job FAILED: vigil's ledger says what happened.)
    assert info["Restarts"] == "0", f"{info}\n{out}"
    assert "every rank finished successfully (2 of the 3 nodes run ranks)" in out, out
    rs = runs(tmp_path)
    for rank in range(world):
        again = rs[(rank, 0, 1)]
        assert again["node"] == ("n1" if rank < NPROC else "n3"), again
        assert again["resumed_from"] > 0 and again["end"] == "finished", again
    (record,) = ledger(tmp_path, job_id)
    assert record["decision"] == "finished" and record["restarts"] == 1, record
    assert record["promotions"] == [{"cycle": 1, "slot": 1, "lost": 1, "standby": 2}], record


def test_an_allocation_whose_node_rank_0_was_lost_is_recorded_and_counted(slurm_cluster, tmp_path):
    # Issue 36: node rank 0 hosts the job's store and writes the ledger. Its agent (on n1) dies:
    # the survivor records the allocation as lost in its place, excludes n1 and requeues, so the
    # requeue is counted; the next allocation runs on n[2-3] and finishes.
    total, world = 300, 2 * NPROC
    job_id = submit(tmp_path, 2, {"TOTAL_STEPS": total, "CKPT_EVERY": 10})
    wait_progress(tmp_path, job_id, world, 30)
    assert show_job(job_id)["NodeList"] == "n[1-2]"
    os.kill(agent_pid(job_id, "n1"), signal.SIGKILL)
    info = finished(tmp_path, job_id, timeout=300)
    assert info["Restarts"] == "1" and info["ExcNodeList"] == "n1", f"{info}\n{output(tmp_path, job_id)}"
    records = ledger(tmp_path, job_id)
    assert [(r["allocation"], r["outcome"], r["decision"]) for r in records] == \
        [(1, "lost", "requeue"), (2, "finished", "finished")], records
    assert records[0]["excluded"] == ["n1"] and records[0]["restart_count"] == 0, records[0]
    assert records[1]["restart_count"] == 1, records[1]

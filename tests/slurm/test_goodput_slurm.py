"""`vigil goodput` on a real Slurm job (docs/goodput.md): it waits in the queue (`--begin`), in its
first allocation a rank crashes, then a rank hangs, then Slurm's time limit comes within the stop
lead and vigil stops the job at one step and requeues it; the second allocation goes on from that
step and finishes. Rank 0 saves its checkpoints in a `checkpointing` section. Each badput category
the job went through is non-zero and the categories add up to the wall time, which starts at
Slurm's SubmitTime (in the ledger).
"""
import json

from harness import base_env, run_vigil

from .slurmlib import wait_job
from .test_lifecycle_identity import output, submit

# Allocation 0: rank 1 crashes after 12 s of steps, then (next attempt) stops heartbeating after
# 12 s; the attempt after runs until asked to stop. Allocation 1 finishes after 12 s. Rank 0
# checkpoints for both every 40 steps and at the agreed stop step, each save 0.3 s in the
# `checkpointing` section.
TRAIN = r"""
import json, os, pathlib, sys, time
import vigil
out = pathlib.Path(os.environ["OUT_DIR"])
alloc = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
rank = int(os.environ["RANK"])
ckpt = out / "ckpt.json"
step = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
t0 = time.monotonic()

def save(s):
    if rank != 0:
        return
    with vigil.section("checkpointing"):
        time.sleep(0.3)
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": s}))
        os.replace(tmp, ckpt)

while True:
    step += 1
    time.sleep(0.2)
    vigil.heartbeat(step=step)
    ran = time.monotonic() - t0
    if alloc == 0 and rank == 1 and ran > 12 and not (out / "crashed").exists():
        (out / "crashed").write_text("1")
        os._exit(1)
    if alloc == 0 and rank == 1 and ran > 12 and not (out / "hung").exists():
        (out / "hung").write_text("1")
        time.sleep(3600)
    if vigil.should_stop(step):
        save(step)
        sys.exit(0)
    if step % 40 == 0:
        save(step)
    if alloc > 0 and ran > 12:
        save(step)
        vigil.mark_finished()
        sys.exit(0)
"""


def test_goodput_of_a_job_that_crashes_hangs_is_stopped_for_its_time_limit_and_requeued(
        slurm_cluster, tmp_path):
    home = tmp_path
    job = submit(
        home, "gp", TRAIN, 1, {},
        f"--nproc-per-node 2 --max-restarts 3 --heartbeat-timeout 2 --stop-lead 10 --max-requeues 2 "
        f"--log-dir {home}/logs --state-dir {home}/state",
        sbatch_opts="--time=1 --begin=now+4",
    )
    info = wait_job(job, timeout=300)
    out = output(home, "gp", job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", f"{info}\n{out}"

    ledger = [json.loads(l) for l in (home / "state" / "ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == 2, ledger
    # Slurm's times, from the agent's `scontrol show job` (one machine, one clock): the job was
    # submitted, held until its begin time, then started, then the agent started.
    first = ledger[0]
    assert first["submit_time"] + 3 <= first["slurm_start"] <= first["start"] + 1, first
    assert all(r["submit_time"] <= r["slurm_start"] for r in ledger), ledger

    r = run_vigil(["goodput", str(home), "--json"], cwd=home, env=base_env())
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)
    b = g["breakdown"]
    assert abs(sum(b.values()) - g["wall_s"]) < 1e-6, g
    assert all(v >= 0 for v in b.values()), b
    for cat in ("goodput", "start_up", "lost_progress", "failure_handling"):
        assert b[cat] > 0, (cat, b, out)
    # The lead left at the first allocation's end, then Slurm's queue: at least one of them.
    assert b["stop_lead_unused"] + b["queue_wait"] > 0, b
    # The hang's detection wait is failure handling: at least the second a rank is silent before
    # it is found hung. Both restarts follow attempts that made progress, so neither backs off
    # (the back-off grows only without progress, docs/usage.md "Progress").
    hangs = [json.loads(l) for f in (home / "logs").glob("*/events.jsonl")
             for l in f.read_text().splitlines() if '"event":"hang"' in l]
    assert len(hangs) == 1 and hangs[0]["silent_ms"] >= 1000, hangs
    assert b["failure_handling"] >= hangs[0]["silent_ms"] / 1000, (b, hangs)
    assert b["checkpoint"] > 0, b
    # The wall time starts at the submission; the wait before the first allocation is queue wait.
    assert g["start"] == first["submit_time"], (g["start"], first)
    assert g["allocations"][0]["breakdown"]["queue_wait"] >= 3, g["allocations"][0]
    assert [a["number"] for a in g["allocations"]] == [1, 2], g["allocations"]
    assert abs(sum(sum(a["breakdown"].values()) for a in g["allocations"]) - g["wall_s"]) < 1e-6

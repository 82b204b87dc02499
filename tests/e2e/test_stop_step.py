"""Stopping at one agreed step, on loopback agents without Slurm.

Every rank runs TRAIN: it calls `vigil.should_stop(step)` after each step and, when it is True,
writes its checkpoint step and exits 0. The tests assert what a user relies on: every rank of every
node checkpoints at the same step, no rank is signalled, and the agent ends with the "run me again"
status (75). Bounds are generous failure limits; the timings live in bench/stop_bench.py.
"""
import json
import os
import signal
import time

from harness import base_env, events, of, one, run_vigil, start_vigil, wait_for, write
from test_multinode import Nodes

# Argument 1: steps to start ahead (ranks on different steps); 2: "deaf" ranks report their step
# but ignore the answer.
TRAIN = """
import json, os, sys, time, pathlib
import vigil
rank = int(os.environ["RANK"])
out = pathlib.Path(os.environ["OUT_DIR"])
ahead = int(sys.argv[1]) if len(sys.argv) > 1 else 0
deaf = sys.argv[2].split(",") if len(sys.argv) > 2 else []
hb_only = sys.argv[3].split(",") if len(sys.argv) > 3 else []
step = ahead * rank
if str(rank) in hb_only:
    import signal
    def on_term(*_):
        (out / f"sigterm_{rank}").write_text(str(step))
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
vigil.heartbeat()
(out / f"up_{rank}").write_text(str(os.getpid()))
while True:
    step += 1
    time.sleep(0.01)
    (out / f"at_{rank}").write_text(str(step))
    if str(rank) in hb_only:
        vigil.heartbeat(step)
        continue
    if vigil.should_stop(step) and str(rank) not in deaf:
        (out / f"ckpt_{rank}.json").write_text(json.dumps(
            {"step": step, "asked": vigil.stop_step(), "reason": vigil.stop_reason()}))
        sys.exit(0)
"""


def ckpts(out, ranks):
    return {r: json.loads((out / f"ckpt_{r}.json").read_text()) for r in ranks}


def stepped(job, nproc, n):
    """Every rank has taken at least `n` steps (since its start step), so the agent knows its pace."""
    def at(r):
        f = job / f"at_{r}"
        try:
            return int(f.read_text())
        except (OSError, ValueError):
            return None
    first = {}
    def ok():
        for r in range(nproc):
            a = at(r)
            if a is None:
                return False
            first.setdefault(r, a)
            if a - first[r] < n:
                return False
        return True
    return ok


def start_one(job, nproc, args=(), script_args=()):
    write(job / "train.py", TRAIN)
    p = start_vigil(["run", "--nproc-per-node", str(nproc), "--log-dir", str(job / "logs"), *args,
                     "train.py", *script_args], cwd=job, env=base_env(OUT_DIR=job))
    # A stop asked before any rank's pace is known may name a step a fast rank has passed already
    # (S is then the next step, docs/allocations.md); training that is worth stopping has a pace.
    wait_for(stepped(job, nproc, 5), 60, "every rank stepping")
    return p


def test_sigterm_stops_every_rank_at_one_step_even_from_different_steps(job):
    p = start_one(job, 3, script_args=["50"])  # ranks start at steps 0, 50 and 100
    p.send_signal(signal.SIGTERM)
    o, e = p.communicate(timeout=60)
    assert p.returncode == 75, e
    c = ckpts(job, range(3))
    steps = {v["step"] for v in c.values()}
    assert len(steps) == 1, c
    (s,) = steps
    assert all(v["asked"] == s and v["reason"] == "SIGTERM" for v in c.values()), c
    ev = events(job / "logs")
    agreed = one(ev, "stop_agreed")
    assert agreed["step"] == s and agreed["trigger"] == "SIGTERM"
    # Nobody was signalled: every rank exited 0 on its own.
    assert of(ev, "stop") == [] and of(ev, "escalate") == []
    assert {x["exit_code"] for x in of(ev, "rank_exited")} == {0}
    assert one(ev, "result")["outcome"] == "stopped"
    assert f"stopped for SIGTERM at step {s}" in e


def test_sigusr1_is_a_stop_trigger_too(job):
    p = start_one(job, 2)
    p.send_signal(signal.SIGUSR1)
    o, e = p.communicate(timeout=60)
    assert p.returncode == 75, e
    c = ckpts(job, range(2))
    assert c[0]["step"] == c[1]["step"] and c[0]["reason"] == "SIGUSR1", c


def test_a_rank_that_ignores_the_request_is_stopped_at_the_window_and_named(job):
    p = start_one(job, 2, args=["--term-timeout", "3"], script_args=["0", "1"])
    p.send_signal(signal.SIGTERM)
    o, e = p.communicate(timeout=60)
    ev = events(job / "logs")
    overdue = one(ev, "stop_overdue")
    assert overdue["ranks"] == [1]
    assert "rank(s) 1 did not stop within 3s" in e
    # Rank 0 checkpointed at the agreed step; rank 1 was stopped by the signal.
    assert ckpts(job, [0])[0]["step"] == one(ev, "stop_agreed")["step"]
    assert not (job / "ckpt_1.json").exists()
    assert p.returncode == 75


def test_a_rank_that_only_heartbeats_gets_the_signal_at_once_the_others_a_step(job):
    p = start_one(job, 2, script_args=["0", "", "1"])
    p.send_signal(signal.SIGTERM)
    o, e = p.communicate(timeout=60)
    assert p.returncode == 75, e
    # Rank 1 may handle SIGTERM itself (as NeMo's callback does): it got it at once.
    assert (job / "sigterm_1").exists() and not (job / "ckpt_1.json").exists()
    assert ckpts(job, [0])[0]["step"] == one(events(job / "logs"), "stop_agreed")["step"]


def test_ranks_that_never_speak_to_the_shim_get_the_signal_at_once(job):
    write(job / "plain.py", "import os, time, pathlib\n"
          "pathlib.Path(os.environ['OUT_DIR'], 'plain_up').write_text('1')\ntime.sleep(600)\n")
    p = start_vigil(["run", "--nproc-per-node", "2", "--log-dir", str(job / "logs"), "plain.py"], cwd=job,
                    env=base_env(OUT_DIR=job))
    wait_for(lambda: (job / "plain_up").exists(), 60, "the ranks")
    p.send_signal(signal.SIGTERM)
    o, e = p.communicate(timeout=60)
    # As before the stop-at-step feature: forwarded, exit 128 + SIGTERM.
    assert p.returncode == 128 + signal.SIGTERM, e
    assert of(events(job / "logs"), "stop_agreed") == []


def test_the_node_that_sees_the_trigger_first_stops_every_node_at_one_step(job):
    write(job / "train.py", TRAIN)
    nodes = Nodes(job, 2, ["train.py", "20"], nproc=2)
    try:
        wait_for(stepped(job, 4, 5), 60, "every rank stepping")
        nodes.procs[1].send_signal(signal.SIGTERM)  # node rank 1 alone sees it
        res = nodes.wait(timeout=90)
    finally:
        nodes.kill()
    assert [r[0] for r in res] == [75, 75], [r[2][-2000:] for r in res]
    c = ckpts(job, range(4))
    assert len({v["step"] for v in c.values()}) == 1, c
    for i in range(2):
        ev = nodes.events(i)
        assert one(ev, "stop_agreed")["step"] == c[0]["step"]
        assert one(ev, "result")["outcome"] == "stopped"
    assert len(of(nodes.events(1), "stop_triggered")) == 1
    assert of(nodes.events(0), "stop_triggered") == []


# Resumes from its checkpoint; finishes (mark_finished, exit 0) at step FINISH_AT.
RESUMING = """
import json, os, sys, time, pathlib
import vigil
rank = int(os.environ["RANK"])
out = pathlib.Path(os.environ["OUT_DIR"])
finish_at = int(sys.argv[1])
ck = out / f"ckpt_{rank}.json"
step = json.loads(ck.read_text())["step"] if ck.exists() else 0
(out / f"resumed_{rank}_{os.getpid()}").write_text(str(step))
while True:
    step += 1
    time.sleep(0.01)
    if step >= finish_at:
        vigil.mark_finished()
        sys.exit(0)
    if vigil.should_stop(step):
        ck.write_text(json.dumps({"step": step}))
        sys.exit(0)
"""


def test_the_allocation_end_stops_every_rank_in_time_and_the_ledger_keeps_each_allocation(job):
    write(job / "resume.py", RESUMING)
    state = job / "state"

    def allocation(end_in, finish_at):
        args = ["run", "--nproc-per-node", "2", "--log-dir", str(job / "logs"), "--state-dir", str(state),
                "--stop-lead", "3", "--end-time", str(int(time.time()) + end_in), "resume.py", str(finish_at)]
        p = start_vigil(args, cwd=job, env=base_env(OUT_DIR=job))
        o, e = p.communicate(timeout=120)
        return p.returncode, e, time.time()

    end = time.time() + 8
    code, err, ended = allocation(8, 10**9)
    assert code == 75, err
    # Stopped before the end, with the lead to spare.
    assert ended < end, (ended, end, err)
    c = ckpts(job, range(2))
    assert c[0]["step"] == c[1]["step"] > 0, c
    s = c[0]["step"]
    # The next allocation resumes from the agreed step and finishes.
    code, err, _ = allocation(600, s + 30)
    assert code == 0, err
    resumed = sorted(int(p.read_text()) for p in job.glob("resumed_*"))
    assert resumed == [0, 0, s, s], resumed
    recs = [json.loads(l) for l in (state / "ledger.jsonl").read_text().splitlines()]
    assert [(r["allocation"], r["outcome"], r["decision"]) for r in recs] == [
        (1, "stopped", "requeue"), (2, "finished", "finished")], recs
    assert recs[0]["stop_step"] == s and recs[0]["stop_trigger"] == "time-limit"
    assert recs[1]["highest_step"] >= s + 29
    table = run_vigil(["ledger", str(state)], cwd=job)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["#", "start", "(UTC)"], lines
    rows = {l.split()[0]: l for l in lines[1:] if l[:1].isdigit()}
    assert "requeue" in rows["1"] and f"{s}@time-limit" in rows["1"] and "finished" in rows["2"], lines


# Fails at step 5 of every attempt, starting from 0 each time: no progress after the first.
STUCK = """
import sys, time
import vigil
for step in range(1, 100):
    time.sleep(0.01)
    vigil.should_stop(step)
    if step == 5:
        sys.exit(3)
"""


def test_attempts_without_progress_are_not_restarted_and_the_ledger_says_so(job):
    write(job / "stuck.py", STUCK)
    r = run_vigil(["run", "--nproc-per-node", "1", "--max-restarts", "10", "--max-no-progress", "2",
                   "--log-dir", str(job / "logs"), "--state-dir", str(job / "state"), "stuck.py"], cwd=job)
    assert r.returncode == 1, r.stderr
    ev = events(job / "logs")
    # Attempt 0 made progress (the first step ever reported); attempts 1 and 2 did not.
    assert len(of(ev, "cycle_start")) == 3
    assert one(ev, "result")["outcome"] == "no_progress"
    assert "the last 2 in a row did not get 10 step(s) past step 5" in r.stderr
    (rec,) = [json.loads(l) for l in (job / "state" / "ledger.jsonl").read_text().splitlines()]
    assert (rec["outcome"], rec["decision"], rec["restarts"]) == ("no_progress", "stop", 2), rec

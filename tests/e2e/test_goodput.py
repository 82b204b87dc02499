"""`vigil goodput` on a real job's records (docs/goodput.md): one job that crashes, hangs, is
stopped for its time limit and is run again (a requeue by hand, `--state-dir`), then finishes.
Each badput category the job went through is non-zero, the categories add up to the wall time,
and `vigil report`'s page and `vigil ledger` show the same job's goodput.

`steps` records come at most every 10 s, so each attempt runs a little over 10 s of steps to
leave two of them (step time is measured between two records of one attempt).
"""
import json
import time

from harness import base_env, run_vigil, write

# Steps every 0.2 s with a heartbeat; rank 0 checkpoints for both every 40 steps and at the agreed
# stop step. Attempt 0: rank 1 crashes after 12 s of steps (steps after the checkpoint are redone).
# Attempt 1: rank 1 stops heartbeating after 12 s (a hang). Later: runs until asked to stop;
# with FINISH_AFTER set (the second allocation), finishes after that many seconds.
TRAIN = r"""
import json, os, pathlib, sys, time
import vigil
out = pathlib.Path(os.environ["OUT_DIR"])
rank = int(os.environ["RANK"])
ckpt = out / "ckpt.json"
step = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
finish_after = float(os.environ.get("FINISH_AFTER", "0"))
t0 = time.monotonic()

def save(s):
    if rank != 0:
        return
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": s}))
    os.replace(tmp, ckpt)

while True:
    step += 1
    time.sleep(0.2)
    vigil.heartbeat(step=step)
    ran = time.monotonic() - t0
    if rank == 1 and ran > 12 and not (out / "crashed").exists():
        (out / "crashed").write_text("1")
        os._exit(1)
    if rank == 1 and ran > 12 and not (out / "hung").exists():
        (out / "hung").write_text("1")
        time.sleep(3600)
    if vigil.should_stop(step):
        save(step)
        sys.exit(0)
    if step % 40 == 0:
        save(step)
    if finish_after and ran > finish_after:
        save(step)
        vigil.mark_finished()
        sys.exit(0)
"""


def vigil_run(job, *args, **env):
    return run_vigil(
        ["run", "--nproc-per-node", "2", "--rdzv-id", "gp", "--state-dir", str(job / "state"),
         "--log-dir", str(job / "logs"), "--max-restarts", "3", "--heartbeat-timeout", "2", *args,
         "train.py"],
        cwd=job, env=base_env(OUT_DIR=job, **env), timeout=240,
    )


def test_a_crash_a_hang_a_time_limit_stop_and_a_requeue_are_each_counted_and_add_up(job):
    write(job / "train.py", TRAIN)
    first = vigil_run(job, "--time-limit", "50s", "--stop-lead", "5")
    assert first.returncode == 75, first.stderr
    # Past the first allocation's would-be end (its start + 50 s): a queue wait after the unused lead.
    time.sleep(6)
    second = vigil_run(job, FINISH_AFTER=12)
    assert second.returncode == 0, second.stderr

    r = run_vigil(["goodput", str(job), "--json"], cwd=job, env=base_env())
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)
    b = g["breakdown"]
    assert abs(sum(b.values()) - g["wall_s"]) < 1e-6, g
    assert all(v >= 0 for v in b.values()), b
    for cat in ("goodput", "start_up", "lost_progress", "failure_handling", "stop_lead_unused", "queue_wait"):
        assert b[cat] > 0, (cat, b)
    # Failure handling holds the hang's silence before it was found (the detection wait).
    silent = [e["silent_ms"] / 1000 for d in sorted((job / "logs").glob("vigil_*"))
              for e in map(json.loads, (d / "events.jsonl").read_text().splitlines()) if e["event"] == "hang"]
    assert len(silent) == 1 and b["failure_handling"] >= silent[0], (silent, b)
    # Its saves are in no checkpoint section: no `section` record, so 0, and said.
    assert b["checkpoint"] == 0
    assert any("no `section` record of a checkpoint section" in n for n in g["notes"]), g["notes"]
    assert [a["number"] for a in g["allocations"]] == [1, 2]
    assert abs(sum(sum(a["breakdown"].values()) for a in g["allocations"]) - g["wall_s"]) < 1e-6
    # Steps of 0.2 s: the ideal step time is near it (all under a second, said so).
    st = g["steps"]
    assert st["sub_second"] is True
    assert 0.18 < st["ideal_step_time_s"] < 0.4, st
    assert 0.0 < g["goodput_fraction"] < 1.0

    # The table: every category, and the total that is the wall time.
    t = run_vigil(["goodput", str(job)], cwd=job, env=base_env())
    assert t.returncode == 0, t.stderr
    for label in ("goodput (kept step time)", "start-up", "checkpoint saves", "progress lost to failures",
                  "failure handling", "stop lead unused", "queue wait", "other", "total",
                  "ideal step time"):
        assert label in t.stdout, (label, t.stdout)

    # The page has a Goodput section; the ledger a goodput line.
    p = run_vigil(["report", str(job)], cwd=job, env=base_env())
    assert p.returncode == 0, p.stderr
    html = (job / "report.html").read_text()
    assert "<section id=\"goodput\">\n<h2>Goodput</h2>" in html and "id=\"goodput-plot\"" in html
    led = run_vigil(["ledger", str(job / "state")], cwd=job, env=base_env())
    assert led.returncode == 0, led.stderr
    assert "goodput " in led.stdout and "see vigil goodput" in led.stdout, led.stdout


# Both ranks: steps of 0.1 s in a `step` section; every 30 steps a save of 0.8 s in the
# `checkpointing` section (NVRx's name); after 13 s, finished.
SAVES = r"""
import sys, time
import vigil
t0 = time.monotonic()
step = 0
while True:
    step += 1
    with vigil.section("step"):
        time.sleep(0.1)
    vigil.heartbeat(step=step)
    if step % 30 == 0:
        with vigil.section("checkpointing"):
            time.sleep(0.8)
    if time.monotonic() - t0 > 13:
        vigil.mark_finished()
        sys.exit(0)
"""


def test_checkpoint_sections_are_their_own_category_and_the_sum_is_still_the_wall_time(job):
    write(job / "train.py", SAVES)
    r = run_vigil(["run", "--nproc-per-node", "2", "--rdzv-id", "saves", "--log-dir", str(job / "logs"),
                   "train.py"], cwd=job, env=base_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    events = [json.loads(l) for d in (job / "logs").glob("vigil_*")
              for l in (d / "events.jsonl").read_text().splitlines()]
    saves = [e for e in events if e["event"] == "section"]
    # Only checkpoint sections are recorded (not one per step), one per rank and save.
    assert saves and {e["name"] for e in saves} == {"checkpointing"}, saves
    assert {e["rank"] for e in saves} == {0, 1}
    assert all(600 <= e["duration_ms"] < 5000 for e in saves), saves
    # The ranks save together: the union of their saves' spans.
    spans = sorted((e["ts"] - e["duration_ms"] / 1000, e["ts"]) for e in saves)
    union, end = 0.0, float("-inf")
    for s, e in spans:
        union += max(0.0, e - max(s, end))
        end = max(end, e)

    g = json.loads(run_vigil(["goodput", str(job), "--json"], cwd=job, env=base_env()).stdout)
    b = g["breakdown"]
    assert b["checkpoint"] > 0, b
    assert abs(b["checkpoint"] - union) < 1e-3, (b, union)
    assert abs(sum(b.values()) - g["wall_s"]) < 1e-6, g
    assert all(v >= 0 for v in b.values()), b
    assert b["goodput"] > 0, b
    assert not any("no `section` record" in n for n in g["notes"]), g["notes"]
    t = run_vigil(["goodput", str(job)], cwd=job, env=base_env())
    row = next(l for l in t.stdout.splitlines() if l.startswith("checkpoint saves"))
    assert float(row.split()[2].rstrip("s")) > 0, row


def test_a_directory_without_records_is_a_usage_error(job):
    r = run_vigil(["goodput", str(job)], cwd=job, env=base_env())
    assert r.returncode == 2
    assert r.stderr.startswith("vigil goodput: error: "), r.stderr
    assert "no vigil records" in r.stderr


def test_help_names_the_command_and_its_doc():
    r = run_vigil(["--help"], cwd=".", env=base_env())
    assert r.returncode == 0
    line = next(l for l in r.stdout.splitlines() if l.strip().startswith("goodput "))
    assert "docs/goodput.md" in line, line
    h = run_vigil(["goodput", "--help"], cwd=".", env=base_env())
    assert h.returncode == 0 and "--json" in h.stdout and "vigil report" in h.stdout, h.stdout


# 200 steps of 0.02 s, each reported, then done: a job far shorter than the 10 s between `steps`
# records while an attempt runs.
SHORT = r"""
import sys, time
import vigil
for step in range(1, 201):
    time.sleep(0.02)
    vigil.heartbeat(step=step)
sys.exit(0)
"""


def test_a_job_of_a_few_seconds_has_its_last_steps_recorded_and_its_step_time_counted(job):
    write(job / "short.py", SHORT)
    r = run_vigil(["run", "--nproc-per-node", "2", "--log-dir", str(job / "logs"), "short.py"],
                  cwd=job, env=base_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    events = [json.loads(l) for d in (job / "logs").glob("vigil_*")
              for l in (d / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["event"] == "steps"]
    # The first record at once, the last when the attempt ended: step 200, stamped no later than
    # the ranks' exits, with the ranks' own step time.
    assert steps[-1]["min_step"] == 200, steps
    exits = [e["ts"] for e in events if e["event"] == "rank_exited"]
    assert steps[-1]["ts"] <= max(exits), (steps, exits)
    assert 0.015 < steps[-1]["step_s"] < 1.0, steps[-1]
    g = json.loads(run_vigil(["goodput", str(job), "--json"], cwd=job, env=base_env()).stdout)
    b = g["breakdown"]
    assert abs(sum(b.values()) - g["wall_s"]) < 1e-6, g
    # 200 steps of at least 0.02 s: nearly all of it between the first and the last record.
    assert b["goodput"] >= 3.0, b
    assert g["steps"]["median_step_time_s"] >= 0.015, g["steps"]

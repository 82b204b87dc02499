"""Stops after a failure are immediate; stop signals sent to a rank reach the agent; restarts are
not mistaken for hangs; the hang excerpt shows the training loop. The real agent, real ranks.

A rank that calls `vigil.should_stop(step)` holds SIGTERM (Slurm signals every process of a step on
preemption, and the rank must stop at the agreed step, not die). A stop after a failure, a hang or
a lost node is no preemption: such a rank is ended with SIGKILL at once and saves nothing, exactly
as a rank that does not hold SIGTERM dies of it at once (docs/allocations.md#signals). Bounds are
generous failure limits, not timing goals: bench/restart_bench.py measures the restart.
"""
import json
import os
import re
import signal

from harness import REPO, base_env, events, of, one, run_dirs, run_vigil, start_vigil, wait_for, write
from test_multinode import Nodes

TOY = str(REPO / "examples" / "toy_train.py")


def without_torch(job):
    """The environment of ranks that cannot import torch: the README's example then only
    simulates work (its ranks share no collective, so each runs at its own pace)."""
    d = job / "no_torch"
    d.mkdir()
    write(d / "torch.py", "raise ImportError('torch hidden by the test: the ranks only simulate work')\n")
    env = base_env()
    env["PYTHONPATH"] = os.pathsep.join([str(d), env["PYTHONPATH"]])
    return env


def attempt_log(job, attempt, local_rank):
    (run_dir,) = run_dirs(job / "logs")
    return (run_dir / f"attempt_{attempt}" / str(local_rank) / "stdout.log").read_text()


def test_readme_example_a_crash_kills_the_ranks_that_hold_sigterm_at_once_and_they_save_nothing(job):
    # The README's command with 100 steps instead of 20: ranks that start late under load must not
    # be able to reach the end (2 s) before rank 3 crashes at its step 5.
    r = run_vigil(
        ["run", "--nproc-per-node", "4", "--max-restarts", "1", "--log-dir", "logs",
         TOY, "--steps", "100", "--crash-at", "5"],
        cwd=job, env=without_torch(job), timeout=300,
    )
    assert r.returncode == 0, r.stderr
    ev = events(job / "logs")
    pids = {e["rank"]: e["pid"] for e in of(ev, "rank_started", cycle=0)}
    crash = one(ev, "rank_exited", cycle=0, rank=3)
    assert crash["exit_code"] == 1 and crash["expected"] is False
    # Every other rank holds SIGTERM (it calls should_stop): the failure stop kills it at once.
    for rank in (0, 1, 2):
        # It saved nothing on the way out and did not train on to the end.
        out = attempt_log(job, 0, rank)
        assert "stopped at step" not in out and "done after" not in out, out
        e = one(ev, "rank_exited", cycle=0, rank=rank)
        assert e.get("signal") == signal.SIGKILL and e["expected"] is True, e
    stop = one(ev, "stop", cycle=0)
    assert stop["reason"] == "rank_failed"
    assert sorted(stop["killed"]) == sorted(pids[r] for r in (0, 1, 2)), stop
    assert of(ev, "escalate") == [], "nobody waited for a grace to run out"
    assert "SIGKILL now (they hold SIGTERM for vigil.should_stop" in r.stderr
    restart = one(ev, "restart")
    assert ev.index(crash) < ev.index(stop) < ev.index(restart)
    assert restart["ts"] - crash["ts"] < 5.0, "restarted promptly (generous bound; the goal is in bench/)"
    # Attempt 1 resumes every rank from its last periodic checkpoint (every 5 steps: 4, 9, ...;
    # a rank slower to start may have none yet), not from one saved on the way out; it finishes.
    for rank in range(4):
        out = attempt_log(job, 1, rank)
        resumed = [int(m) for m in re.findall(r"resumed from step (\d+)$", out, re.M)]
        assert all((n + 1) % 5 == 0 for n in resumed), out
        assert resumed or f"rank {rank}: starting at step 0" in out, out
        assert f"rank {rank}: done after 100 steps" in out


BLOCKED = """
import os, pathlib, sys, time
import vigil
out = pathlib.Path(os.environ["OUT_DIR"])
rank = int(os.environ["RANK"])
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    sys.exit(0)
vigil.should_stop(1)  # holds SIGTERM from here on
if rank == 0:
    r, w = os.pipe()
    (out / "holding").write_text(str(os.getpid()))
    # Blocked in C, as in a collective whose peer died: a Python handler never ends this (read(2)
    # is retried after each signal), only a signal that is not held does.
    os.read(r, 1)
    (out / "unblocked").write_text("1")
else:
    while not (out / "holding").exists():
        time.sleep(0.01)
    sys.exit(3)
"""


def test_a_rank_blocked_in_a_c_call_while_holding_sigterm_is_stopped_at_once_by_a_failure(job):
    write(job / "t.py", BLOCKED)
    # A grace of 30 s: a stop that relied on SIGTERM would wait for it and then escalate.
    r = run_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--workers-stop-timeout", "30",
                   "--log-dir", "logs", "t.py"], cwd=job, env=base_env(OUT_DIR=job), timeout=120)
    assert r.returncode == 0, r.stderr
    ev = events(job / "logs")
    failed = one(ev, "rank_exited", cycle=0, rank=1)
    assert failed["exit_code"] == 3 and failed["expected"] is False
    restart = one(ev, "restart")
    assert restart["ts"] - failed["ts"] < 15.0, "well within the 30 s grace"
    assert of(ev, "escalate") == [], "SIGKILL came with the stop, not after the grace"
    stop = one(ev, "stop", cycle=0)
    blocked = one(ev, "rank_exited", cycle=0, rank=0)
    assert stop["killed"] == [blocked["pid"]] == [int((job / "holding").read_text())]
    assert blocked.get("signal") == signal.SIGKILL and blocked["expected"] is True
    assert not (job / "unblocked").exists()
    assert one(ev, "result")["outcome"] == "succeeded"


STEPPING = """
import json, os, pathlib, sys, time
import vigil
out = pathlib.Path(os.environ["OUT_DIR"])
rank = int(os.environ["RANK"])
(out / f"pid_{rank}").write_text(str(os.getpid()))
for step in range(3000):  # 30 s at most, then the run is finished
    time.sleep(0.01)
    (out / f"at_{rank}").write_text(str(step))
    if vigil.should_stop(step):
        (out / f"ckpt_{rank}.json").write_text(json.dumps(
            {"step": step, "asked": vigil.stop_step(), "reason": vigil.stop_reason()}))
        sys.exit(0)
vigil.mark_finished()
"""


def test_a_rank_sent_sigterm_on_its_own_stops_the_whole_job_at_one_step_not_finished(job):
    write(job / "t.py", STEPPING)
    p = start_vigil(["run", "--nproc-per-node", "2", "--log-dir", str(job / "logs"), "t.py"], cwd=job,
                    env=base_env(OUT_DIR=job))
    try:
        def stepping():
            try:
                return all(int((job / f"at_{r}").read_text()) >= 5 for r in range(2))
            except (OSError, ValueError):
                return False
        wait_for(stepping, 60, "both ranks stepping")
        os.kill(int((job / "pid_1").read_text()), signal.SIGTERM)  # to the rank, not to vigil
        o, e = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    ev = events(job / "logs")
    told = one(ev, "rank_signalled")
    assert (told["rank"], told["signal"]) == (1, signal.SIGTERM)
    agreed = one(ev, "stop_agreed")
    assert agreed["trigger"] == "SIGTERM"
    # Both ranks checkpointed at the one agreed step; the run stopped (run it again), not finished.
    ckpts = {r: json.loads((job / f"ckpt_{r}.json").read_text()) for r in range(2)}
    assert {c["step"] for c in ckpts.values()} == {agreed["step"]}, ckpts
    assert all(c["reason"] == "SIGTERM" for c in ckpts.values())
    assert {x["exit_code"] for x in of(ev, "rank_exited")} == {0}
    assert of(ev, "training_finished") == []
    assert one(ev, "result")["outcome"] == "stopped"
    assert p.returncode == 75, e
    assert "rank 1 received SIGTERM (sent to the rank, not to vigil)" in e


SLOW_RESTART = """
import json, os, pathlib, sys, time
out = pathlib.Path(os.environ["OUT_DIR"])
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def since_start():
    # Seconds since this process started: the initial heartbeat timeout runs from there.
    ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    return float(open("/proc/uptime").read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")


if attempt == 1:
    # A slow start (a loaded node, a cold cache): longer than 5 x attempt 0's quick ones, well
    # within the configured initial timeout.
    quick = max(json.loads((out / f"quick_{r}").read_text()) for r in range(2))
    time.sleep(max(0.0, max(6.0, 5 * quick + 3.0) - since_start()))
import vigil
if attempt == 0:
    (out / f"quick_{rank}").write_text(json.dumps(since_start()))
vigil.heartbeat(0)
if attempt == 1:
    for step in range(1, 5):
        time.sleep(0.05)
        vigil.heartbeat(step)
    sys.exit(0)
for step in range(1, 20):  # enough heartbeats for vigil to calculate timeouts on its own
    time.sleep(1.5 if step == 3 else 0.01)  # one longer gap: the heartbeat timeout is not tight
    vigil.heartbeat(step)
deadline = time.time() + 60
while (vigil.timeouts() or {}).get("heartbeat_ms") == 30000:
    assert time.time() < deadline, "no calculated timeouts"
    vigil.heartbeat(step)
    time.sleep(0.05)
if rank == 1:
    sys.exit(1)  # the failure that restarts the job
while True:
    vigil.heartbeat(step)
    time.sleep(0.05)
"""


def test_a_slow_start_after_a_quick_first_attempt_is_not_a_hang(job):
    write(job / "t.py", SLOW_RESTART)
    r = run_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--calculate-timeouts", "--initial-heartbeat-timeout", "60",
                   "--heartbeat-timeout", "30", "--log-dir", "logs", "t.py"], cwd=job, env=base_env(OUT_DIR=job),
                  timeout=180)
    ev = events(job / "logs")
    assert of(ev, "hang") == [], r.stderr
    assert r.returncode == 0, r.stderr
    calc = [e for e in of(ev, "timeouts_updated") if e["source"] == "calculated"]
    assert calc, "attempt 0 calculated timeouts"
    assert ev.index(calc[0]) < ev.index(one(ev, "restart"))
    # The start attempt 0 saw was quick; the calculation did not take it for the slowest start.
    assert calc[0]["timeouts"]["initial"] == 60
    assert calc[0]["timeouts"]["heartbeat"] < 30


EXTRA_THREADS = """
import os, signal, sys, threading, time
import vigil
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    sys.exit(0)


def loader_worker(ev):  # DataLoader-like helper threads, newer than the main thread
    ev.wait()


for _ in range(6):
    threading.Thread(target=loader_worker, args=(threading.Event(),), daemon=True).start()
# The stack-dump signal then lands on one of the helpers (a library may block it in the main
# thread; the kernel picks any thread that takes it): faulthandler lists that thread first.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
vigil.heartbeat(0)


def the_training_loop_hangs_here():
    while True:
        time.sleep(1)


the_training_loop_hangs_here()
"""


def test_the_hang_excerpt_shows_the_main_thread_first_whatever_other_threads_run(job):
    write(job / "t.py", EXTRA_THREADS)
    r = run_vigil(["run", "--max-restarts", "1", "--heartbeat-timeout", "1", "--log-dir", "logs", "t.py"],
                  cwd=job, env=base_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    ev = events(job / "logs")
    st = one(ev, "stacks", cycle=0)
    dump = open(st["python_stacks"]).read()
    assert dump.count("in loader_worker") >= 6 and "in the_training_loop_hangs_here" in dump
    main = [f for f in st["innermost"] if "in the_training_loop_hangs_here" in f]
    assert main, st["innermost"]
    # First, and named: the thread the signal landed on comes after it.
    assert st["innermost"][0] == main[0] and "(main)" in main[0], st["innermost"]
    # The console's excerpt starts with the training loop too.
    excerpt = r.stderr.split("innermost frames:", 1)[1]
    assert excerpt.index("the_training_loop_hangs_here") < excerpt.index("loader_worker")


ALL_BLOCKED = """
import os, pathlib, sys, time
import vigil
out = pathlib.Path(os.environ["OUT_DIR"])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    sys.exit(0)
vigil.should_stop(1)  # holds SIGTERM from here on
if rank != world - 1:
    r, w = os.pipe()
    (out / f"holding_{rank}").write_text(str(os.getpid()))
    os.read(r, 1)  # in a collective with the rank that is about to die
    (out / f"unblocked_{rank}").write_text("1")
else:
    while len(list(out.glob("holding_*"))) < world - 1:
        time.sleep(0.01)
    sys.exit(3)
"""


def test_a_failure_on_another_node_kills_this_nodes_blocked_ranks_at_once(job):
    write(job / "t.py", ALL_BLOCKED)
    nodes = Nodes(job, 2, ["t.py"], nproc=2, extra=["--max-restarts", "1", "--workers-stop-timeout", "30"])
    res = nodes.wait(timeout=120)
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    assert not list(job.glob("unblocked_*"))
    for i in (0, 1):
        assert of(nodes.events(i), "escalate") == [], "nobody waited for the 30 s grace"
        assert one(nodes.events(i), "result")["outcome"] == "succeeded"
    ev0 = nodes.events(0)
    stop = one(ev0, "stop", cycle=0)
    assert stop["reason"] == "peer" and sorted(stop["killed"]) == sorted(stop["pids"]), stop
    for rank in (0, 1):
        e = one(ev0, "rank_exited", cycle=0, rank=rank)
        assert e.get("signal") == signal.SIGKILL and e["expected"] is True, e

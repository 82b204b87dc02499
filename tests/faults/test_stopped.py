"""Stopped processes: a rank frozen by SIGSTOP alone is a hang and really ends (SIGCONT with the
signal, SIGKILL after the grace even if it ignores SIGTERM), and is named the root cause even when
the ranks waiting on it went silent first (fault-findings 16); a whole job stopped past every
timeout and resumed is no hang.

Every test runs the real agent with real ranks using the shim (and torch's gloo for the barrier).
"""
import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from harness import base_env, events, of, one, pid_alive, start_vigil, wait_for, write  # noqa: E402


def current_events(log_dir):
    try:
        return events(log_dir)
    except (ValueError, FileNotFoundError):
        return []


def in_order(ev, *records):
    idx = [next(i for i, e in enumerate(ev) if e is r) for r in records]
    assert idx == sorted(idx), ([r["event"] for r in records], idx, [e["event"] for e in ev])


def state(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def finish(p, timeout=120):
    try:
        return p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_a_stopped_rank_that_ignores_sigterm_still_ends(job):
    # Rank 1 of attempt 0 ignores SIGTERM and stops itself; attempt 1 succeeds.
    write(job / "t.py", """
import os, signal, sys, time
import vigil
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    sys.exit(0)
rank = int(os.environ["RANK"])
if rank == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
for i in range(5):
    vigil.heartbeat(i)
    time.sleep(0.02)
if rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
while True:
    vigil.heartbeat()
    time.sleep(0.05)
""")
    p = start_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--heartbeat-timeout", "1",
                     "--workers-stop-timeout", "1", "--log-dir", "logs", "t.py"], cwd=job)
    out, err = finish(p)
    assert p.returncode == 0, err
    ev = events(job / "logs")
    hang = one(ev, "hang", cycle=0)
    assert hang["rank"] == 1, hang
    esc = one(ev, "escalate", cycle=0)
    assert esc["pids"] == [hang["pid"]], esc
    exited = one(ev, "rank_exited", cycle=0, rank=1)
    assert exited.get("signal") == signal.SIGKILL, exited
    in_order(ev, hang, one(ev, "stop", cycle=0), esc, exited, one(ev, "restart"),
             one(ev, "cycle_start", cycle=1), ev[-1])
    assert ev[-1]["outcome"] == "succeeded"
    assert not pid_alive(hang["pid"])


# Both ranks heartbeat every 0.1 s for about 6 s in all.
BEATING = """
import os, time
import vigil
for i in range(60):
    vigil.heartbeat(i)
    if i == 3:
        open(os.path.join(os.environ["OUT_DIR"], "beating_" + os.environ["RANK"]), "w").close()
    time.sleep(0.1)
"""


def stop_whole_job(job, p, resume_agent_first):
    wait_for(lambda: (job / "beating_0").exists() and (job / "beating_1").exists()
             and len(of(current_events(job / "logs"), "registered")) == 2, timeout=60,
             what="both ranks heartbeating")
    pids = [e["pid"] for e in of(current_events(job / "logs"), "rank_started")]
    assert len(pids) == 2
    everyone = pids + [p.pid]
    try:
        for pid in everyone:
            os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: all(state(x) == "T" for x in everyone), what="the whole job to be stopped")
        # Stopped past every timeout of the job: heartbeat (2 s) and node (2 s).
        t0 = time.monotonic()
        wait_for(lambda: time.monotonic() - t0 > 5, timeout=30, what="5 s to pass")
    finally:
        for pid in [p.pid] + pids if resume_agent_first else pids + [p.pid]:
            os.kill(pid, signal.SIGCONT)


def check_no_false_hang(job, p):
    out, err = finish(p)
    assert p.returncode == 0, err
    ev = events(job / "logs")
    assert not of(ev, "hang") and not of(ev, "restart") and not of(ev, "stop"), [e["event"] for e in ev]
    sus = one(ev, "suspended")
    assert sus["seconds"] >= 4.0, sus
    assert ev[-1]["outcome"] == "succeeded"


def test_whole_job_stopped_and_resumed_agent_first_is_no_hang(job):
    write(job / "t.py", BEATING)
    p = start_vigil(["run", "--nproc-per-node", "2", "--heartbeat-timeout", "2", "--node-timeout", "2",
                     "--log-dir", "logs", "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    try:
        stop_whole_job(job, p, resume_agent_first=True)
    finally:
        check_no_false_hang(job, p)


def test_whole_job_stopped_and_resumed_ranks_first_is_no_hang(job):
    write(job / "t.py", BEATING)
    p = start_vigil(["run", "--nproc-per-node", "2", "--heartbeat-timeout", "2", "--node-timeout", "2",
                     "--log-dir", "logs", "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    try:
        stop_whole_job(job, p, resume_agent_first=False)
    finally:
        check_no_false_hang(job, p)


def test_frozen_rank_is_the_root_cause_not_the_rank_waiting_on_it(job):
    # Rank 1 heartbeats, then waits (as in a barrier) for rank 0, without heartbeats. Rank 0
    # heartbeats later than rank 1 did, then freezes. Rank 1's heartbeat deadline comes first.
    write(job / "t.py", """
import os, signal, time
import vigil
out, rank = os.environ["OUT_DIR"], int(os.environ["RANK"])
for i in range(3):
    vigil.heartbeat(i)
    time.sleep(0.02)
if rank == 1:
    vigil.heartbeat()
    open(os.path.join(out, "waiting"), "w").close()
    while True:
        time.sleep(0.05)
while not os.path.exists(os.path.join(out, "waiting")):
    vigil.heartbeat()
    time.sleep(0.05)
time.sleep(0.3)
vigil.heartbeat()
os.kill(os.getpid(), signal.SIGSTOP)
# Continued (the stack dump needs it running): still never reaches the barrier.
while True:
    time.sleep(0.05)
""")
    p = start_vigil(["run", "--nproc-per-node", "2", "--heartbeat-timeout", "2", "--log-dir", "logs", "t.py"],
                    cwd=job, env=base_env(OUT_DIR=job))
    out, err = finish(p)
    assert p.returncode == 1, err
    ev = events(job / "logs")
    hang = one(ev, "hang", cycle=0)
    assert hang["rank"] == 0, hang
    assert hang["stopped"] is True, hang
    assert "its process is stopped" in err
    # The summary's root cause is the frozen rank: the first (and only) failed rank block.
    root = err[err.index("Root Cause"):]
    assert "rank      : 0 (local_rank: 0)" in root and "rank      : 1" not in root, err
    assert "the process was stopped" in root, err


def test_frozen_rank_in_a_gloo_barrier_is_the_root_cause(job):
    pytest.importorskip("torch")
    # Every step: heartbeat, then a real gloo barrier. At step 5 rank 0 is late (so the waiting
    # rank 1 heartbeats first) and freezes before the barrier; rank 1 waits in it, silent.
    write(job / "t.py", """
import datetime, os, signal, time
import torch.distributed as dist
import vigil
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
rank = dist.get_rank()
for i in range(1000000):
    if rank == 0 and i == 5:
        time.sleep(0.3)
        vigil.heartbeat(i)
        os.kill(os.getpid(), signal.SIGSTOP)
        while True:
            time.sleep(0.05)
    vigil.heartbeat(i)
    dist.barrier()
""")
    p = start_vigil(["run", "--nproc-per-node", "2", "--heartbeat-timeout", "3", "--log-dir", "logs", "t.py"],
                    cwd=job)
    out, err = finish(p, timeout=300)
    assert p.returncode == 1, err
    ev = events(job / "logs")
    hang = one(ev, "hang", cycle=0)
    assert hang["rank"] == 0 and hang["stopped"] is True, hang
    root = err[err.index("Root Cause"):]
    assert "rank      : 0 (local_rank: 0)" in root and "rank      : 1" not in root, err

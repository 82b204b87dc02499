"""A frozen agent is counted lost; a whole job suspended and resumed is not (fault-findings 7).

Found by attack: with `--node-timeout 5`, a SIGSTOPped agent was never counted lost, because its
kernel kept answering TCP keepalives, and a rank SIGKILLed on its node went unnoticed for as long
as it stayed frozen. Every test here runs two real agents on loopback (`--nnodes 2`) with real
ranks; bounds are generous failure limits, never timing goals.
"""
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from harness import pid_alive, wait_for, write  # noqa: E402
from test_multinode import Nodes, markers, of  # noqa: E402

NODE_TIMEOUT = 5

# Every rank records its pid, then works (sleeps in small steps) until the test releases it.
WORKER = """
import os, pathlib, time
out = pathlib.Path(os.environ["OUT_DIR"])
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
(out / f"tmp_{rank}_{attempt}").write_text(str(os.getpid()))
os.rename(out / f"tmp_{rank}_{attempt}", out / f"ran_{rank}_{attempt}")
step = 0
while not (out / "release").exists():
    step += 1
    time.sleep(0.05)
(out / f"done_{rank}_{attempt}").write_text(str(step))
"""


def start(job):
    write(job / "worker.py", WORKER)
    nodes = Nodes(job, 2, ["worker.py"], extra=["--max-restarts", "3", "--node-timeout", str(NODE_TIMEOUT),
                                                 "--workers-stop-timeout", "3"])
    wait_for(lambda: len(markers(job, "ran_")) == 4, timeout=60, what="all four ranks running")
    pids = {int(n.split("_")[1]): int((job / n).read_text()) for n in markers(job, "ran_")}
    return nodes, pids


def expect_lost(nodes, i, timeout=90):
    """Node `i`'s agent exits 75 (requeue) on its own within `timeout`."""
    try:
        rc = nodes.procs[i].wait(timeout=timeout)
    except Exception:
        nodes.kill()
        raise AssertionError(f"node {i} was still running {timeout}s later")
    assert rc == 75, (i, rc, nodes.procs[i].stderr.read())
    return nodes.procs[i].stderr.read()


def resume(proc):
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)


def all_gone(nodes, pids):
    wait_for(lambda: not any(pid_alive(p) for p in pids.values()), timeout=30, what="every rank gone")
    assert all(p.poll() is not None for p in nodes.procs)


def test_frozen_agent_on_node1_is_lost(job):
    nodes, pids = start(job)
    try:
        os.kill(nodes.procs[1].pid, signal.SIGSTOP)
        err0 = expect_lost(nodes, 0)
        assert "node 1 was lost" in err0 and "no sign of life" in err0 and "requeue" in err0, err0
        assert of(nodes.events(0), "cycle_ended", cycle=0, end="lost")
        os.kill(nodes.procs[1].pid, signal.SIGCONT)
        expect_lost(nodes, 1)
        all_gone(nodes, pids)
        assert not markers(job, "done_"), "no rank was released: each was stopped"
    finally:
        resume(nodes.procs[1])
        nodes.kill()


def test_rank_killed_under_a_frozen_agent_ends_the_job(job):
    nodes, pids = start(job)
    try:
        os.kill(nodes.procs[1].pid, signal.SIGSTOP)
        # Its agent cannot notice: node rank 0 must, through the frozen agent's silence.
        os.kill(pids[3], signal.SIGKILL)
        err0 = expect_lost(nodes, 0)
        assert "node 1 was lost" in err0, err0
        os.kill(nodes.procs[1].pid, signal.SIGCONT)
        expect_lost(nodes, 1)
        all_gone(nodes, pids)
    finally:
        resume(nodes.procs[1])
        nodes.kill()


def test_frozen_head_is_lost_by_the_others(job):
    nodes, pids = start(job)
    try:
        os.kill(nodes.procs[0].pid, signal.SIGSTOP)
        err1 = expect_lost(nodes, 1)
        assert "node rank 0 was lost" in err1 and "did not answer" in err1, err1
        os.kill(nodes.procs[0].pid, signal.SIGCONT)
        expect_lost(nodes, 0)
        all_gone(nodes, pids)
    finally:
        resume(nodes.procs[0])
        nodes.kill()


def test_whole_job_suspended_past_the_timeout_then_resumed_completes(job):
    nodes, pids = start(job)
    agents = [p.pid for p in nodes.procs]
    groups = list(pids.values())  # every rank leads its own process group
    try:
        for a in agents:
            os.kill(a, signal.SIGSTOP)
        for g in groups:
            os.killpg(g, signal.SIGSTOP)
        # The fault itself: everything stays stopped for twice the node timeout (as under
        # `scontrol suspend`), which is what must not be blamed on anyone.
        time.sleep(2 * NODE_TIMEOUT)
        for g in groups:
            os.killpg(g, signal.SIGCONT)
        for a in agents:
            os.kill(a, signal.SIGCONT)
        # Nobody is blamed for the suspension in the node timeout and more that follow.
        time.sleep(1.5 * NODE_TIMEOUT)
        assert [p.poll() for p in nodes.procs] == [None, None], [p.stderr.read() for p in nodes.procs]
        (job / "release").write_text("")
        res = nodes.wait(timeout=90)
    finally:
        for p in nodes.procs:
            resume(p)
        nodes.kill()
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    assert markers(job, "done_") == [f"done_{r}_0" for r in range(4)]
    for i in range(2):
        ev = nodes.events(i)
        assert of(ev, "suspended"), "the agent saw its own suspension"
        assert not of(ev, "cycle_ended", end="lost")
        assert ev[-1]["outcome"] == "succeeded"

"""A frozen active agent, lost and replaced by the standby, never comes back into the job (the
chaos soak's `agent_sigstop`, docs/reliability.md "Also seen"): woken, it reads that node rank 0
dropped it (`vigil/dropped/<node>`) and leaves with 75, running no ranks.

Two active agents and one standby (`--nnodes 2:3`, node 2 starts as the standby), real agents on
loopback, real rank processes. As the soak does, only node 1's agent is stopped (SIGSTOP); it is
woken at three moments of the replacement (WAKE), with its rank running on meanwhile or failing
as its peer goes. The vigil of a61c482 (before active agents read the drop) rejoined the next
attempt as a standby in every one of the six cases."""
import json
import signal
import time

import pytest

from harness import base_env, events, of, pid_alive, start_vigil, wait_for, write
from test_multinode import free_port

# Each rank steps until argument 1, checkpointing its step; it records where it ran (its node
# and pid) for each attempt. With argument 2 "peer", a rank fails (exit 1) once the other rank of
# its attempt is gone before finishing, as a rank of a real job does when its collective's peer
# is gone.
TRAIN = """
import os, sys, time, pathlib, vigil
out = pathlib.Path(os.environ["OUT_DIR"])
rank, node = int(os.environ["RANK"]), os.environ["NODE_ID"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
ckpt = out / f"ckpt_{rank}"
start = int(ckpt.read_text()) + 1 if ckpt.exists() else 0
(out / f"up_{attempt}_{rank}_{node}").write_text(str(os.getpid()))
peer = None
for n, step in enumerate(range(start, int(sys.argv[1]))):
    time.sleep(0.05)
    (out / f"done_{attempt}_{rank}_{node}").write_text(str(n + 1))
    if sys.argv[2] == "peer":
        if peer is None:
            found = list(out.glob(f"up_{attempt}_{1 - rank}_*"))
            peer = int(found[0].read_text()) if found and found[0].read_text() else None
        elif not (out / f"fin_{attempt}_{1 - rank}").exists() and (
                not os.path.exists(f"/proc/{peer}")
                or open(f"/proc/{peer}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"):
            sys.exit(1)
    tmp = out / f"ckpt_{rank}.{node}.tmp"
    tmp.write_text(str(step))
    os.replace(tmp, ckpt)
    vigil.heartbeat(step)
(out / f"fin_{attempt}_{rank}").write_text("")
"""


def start_agents(job, steps, ranks):
    port = free_port()
    procs = []
    for i in range(3):
        (job / f"node{i}").mkdir()
        args = ["run", "--nnodes", "2:3", "--node-rank", str(i), "--master-addr", "127.0.0.1",
                "--master-port", str(port), "--nproc-per-node", "1", "--max-restarts", "3",
                "--rdzv-id", "th", "--node-timeout", "3", "--log-dir", str(job / f"node{i}"),
                "train.py", str(steps), ranks]
        procs.append(start_vigil(args, cwd=job, env=base_env(OUT_DIR=job, NODE_ID=str(i))))
    return procs


def ev0(job):
    try:
        return events(job / "node0")
    except (ValueError, FileNotFoundError):
        return []


def lost_1(ev):
    """Node rank 0's records of node 1 lost: its attempt ended as `node 1 was lost`."""
    return [e for e in ev if e["event"] == "cycle_ended" and e.get("node") == 1
            and "node 1 was lost" in e.get("reason", "")]


def steps_done(job, name):
    try:
        return int((job / name).read_text() or 0)
    except FileNotFoundError:
        return 0


# When node 1's agent wakes, as node rank 0's records and the ranks' files say:
# - "lost": node rank 0 recorded node 1 lost (the next attempt's rendezvous is under way);
# - "promoted": node rank 0 recorded the promotion (the next attempt's rendezvous is done);
# - "running": the promoted standby's rank has done 10 steps of the next attempt.
WAKE = {
    "lost": lambda job: lost_1(ev0(job)),
    "promoted": lambda job: of(ev0(job), "promotion"),
    "running": lambda job: steps_done(job, "done_1_1_2") >= 10,
}


@pytest.mark.parametrize("ranks", ["run_on", "peer"])
@pytest.mark.parametrize("when", sorted(WAKE))
def test_a_frozen_active_node_replaced_by_the_standby_leaves_when_it_wakes(job, when, ranks):
    """`ranks`: node 1's rank runs on while its agent is frozen ("run_on"), or fails once node
    0's rank is stopped ("peer"), so that the woken agent finds its attempt failed and restarts."""
    freeze_wake_and_check(job, when, ranks)


def test_a_woken_agent_whose_liveness_read_was_in_flight_stands_by_in_no_attempt(job):
    """Node 1's agent freezes while its liveness check's read is unanswered: node rank 0 (whose
    agent hosts the store) is stopped for longer than one liveness period (--node-timeout / 8 =
    0.375 s), so that a read is sent and waits, and is woken once node 1's agent is frozen.
    Woken, node 1's liveness check takes that stale answer and reads again only a period later;
    meanwhile its agent restarts and joins the next attempt. The vigil of 43f17b3 stood by in it
    until that read came (a `standby` record of attempt 1, then 75); the join reads the drop
    too now."""
    freeze_wake_and_check(job, "promoted", "run_on", store_stalled_s=0.6)


def freeze_wake_and_check(job, when, ranks, store_stalled_s=0.0):
    write(job / "train.py", TRAIN)
    procs = start_agents(job, 300, ranks)
    try:
        wait_for(lambda: all((job / f"up_0_{r}_{r}").exists() for r in range(2)), timeout=90,
                 what="attempt 0's ranks on nodes 0 and 1")
        wait_for(lambda: of(events(job / "node2"), "standby"), timeout=60, what="the standby")
        rank1_pid = int((job / "up_0_1_1").read_text())
        if store_stalled_s:
            procs[0].send_signal(signal.SIGSTOP)
            try:
                # A stall, not a wait for a condition: every agent's liveness read to node rank
                # 0's store goes out within a period and stays unanswered for the rest of it.
                time.sleep(store_stalled_s)
                procs[1].send_signal(signal.SIGSTOP)
            finally:
                procs[0].send_signal(signal.SIGCONT)
        else:
            procs[1].send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: WAKE[when](job), timeout=120, what=f"the moment to wake ({when})")
        finally:
            procs[1].send_signal(signal.SIGCONT)
        out1 = procs[1].communicate(timeout=120)
        res = {i: procs[i].communicate(timeout=180) for i in (0, 2)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    ev = events(job / "node0")
    (loss,) = lost_1(ev)
    (promo,) = of(ev, "promotion")
    assert (promo["cycle"], promo["slot"], promo["lost"], promo["standby"]) == (1, 1, 1, 2), promo
    # Woken, node 1's agent reads that it was dropped and leaves to be requeued.
    assert procs[1].returncode == 75, out1[1][-2000:]
    assert "node 1 was dropped from the job" in out1[1], out1[1][-2000:]
    ev1 = events(job / "node1")
    (res1,) = of(ev1, "result")
    assert res1["outcome"] == "lost" and "dropped from the job" in res1["reason"], res1
    # After node rank 0 lost it, node 1 joined no attempt, stood by in none and ran no ranks.
    back = [e for e in ev1 if e["ts"] > loss["ts"]
            and e["event"] in ("joined", "standby", "cycle_start", "rank_started")]
    assert not back, back
    assert sorted(p.name for p in job.glob("up_*_1")) == ["up_0_1_1"]
    # Its rank did not outlive it.
    assert not pid_alive(rank1_pid), f"node 1's rank {rank1_pid} outlived its agent"
    # The job completes on the promoted standby, with one promotion and no other loss.
    assert [procs[0].returncode, procs[2].returncode] == [0, 0], [res[i][1][-2000:] for i in (0, 2)]
    assert not of(ev, "standby_gone")
    (rec,) = [json.loads(l) for l in
              (job / "node0" / "vigil-job-th" / "ledger.jsonl").read_text().splitlines()]
    assert rec["decision"] == "finished", rec
    assert rec["promotions"] == [{"cycle": 1, "slot": 1, "lost": 1, "standby": 2}], rec
    assert steps_done(job, "done_1_1_2") > 0 and steps_done(job, "done_1_0_0") > 0

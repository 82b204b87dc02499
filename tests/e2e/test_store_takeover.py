"""Losing any node, node rank 0's included, is a spare's promotion: with the store outside the
job (`vigil store`, every agent `--rdzv-conf is_host=false`), the coordinator's work moves to the
live agent with the lowest node rank when node rank 0's agent is lost (docs/store.md, "The store
outside the job"; docs/spares.md, "Node rank 0"). Node ranks are given explicitly (`--node-rank`)
or handed out by c10d (every agent draws one from the store; the first is node rank 0)."""
import json
import signal
import subprocess

from harness import base_env, of, events, start_vigil, wait_for, write
from test_store_service import SECRET, Service

# Records GROUP_RANK per attempt and runs until released (the file `release`).
TRAIN = """
import json, os, pathlib, time
out = pathlib.Path(os.environ["OUT_DIR"])
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
tmp = out / f"seen_{attempt}_{rank}.tmp"
tmp.write_text(json.dumps({
    "node": os.environ["NODE_ID"], "group_rank": os.environ["GROUP_RANK"],
    "world": os.environ["WORLD_SIZE"]}))
os.replace(tmp, out / f"seen_{attempt}_{rank}.json")
while not (out / "release").exists():
    time.sleep(0.05)
"""


def start_agents(job, port, n, nnodes, ranked=True):
    """`ranked`: node ranks given (`--node-rank`); else c10d hands them out (torchrun's
    `--rdzv-backend c10d --rdzv-endpoint`), in the order the agents reach the store."""
    procs = []
    for i in range(n):
        (job / f"node{i}").mkdir()
        where = (["--node-rank", str(i), "--master-addr", "127.0.0.1", "--master-port", str(port)]
                 if ranked else
                 ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"])
        args = ["run", "--nnodes", nnodes, *where, "--nproc-per-node", "1", "--max-restarts", "2",
                "--node-timeout", "5", "--workers-stop-timeout", "3", "--rdzv-id", "take",
                "--rdzv-conf", "is_host=false", "--log-dir", str(job / f"node{i}"), "train.py"]
        env = base_env(OUT_DIR=job, NODE_ID=str(i), VIGIL_STORE_SECRET=SECRET)
        procs.append(start_vigil(args, cwd=job, env=env))
    return procs


def wait_attempt(job, attempt, world, timeout=60):
    """Until every rank of `attempt` recorded what it saw."""
    wait_for(lambda: all((job / f"seen_{attempt}_{r}.json").exists() for r in range(world)),
             timeout=timeout, what=f"attempt {attempt}'s ranks")


def seen(job, attempt, world):
    return {r: json.loads((job / f"seen_{attempt}_{r}.json").read_text()) for r in range(world)}


def finish(procs, timeout=120):
    out = {}
    try:
        for i, p in enumerate(procs):
            if p.returncode is None:
                try:
                    out[i] = p.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out[i] = p.communicate()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def test_losing_node_rank_0_promotes_the_standby_and_another_agent_coordinates(job):
    write(job / "train.py", TRAIN)
    store = Service(job, env={"VIGIL_STORE_SECRET": SECRET})
    procs = start_agents(job, store.port, 4, "3:4")
    try:
        wait_attempt(job, 0, 3, timeout=60)
        s0 = seen(job, 0, 3)
        (victim,) = [int(s["node"]) for s in s0.values() if s["group_rank"] == "0"]
        assert victim == 0, s0
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].communicate()
        wait_attempt(job, 1, 3, timeout=60)
        s1 = seen(job, 1, 3)
        # The standby (node 3) plays node 0's slot: GROUP_RANK 0 and its ranks; the world stays.
        assert {r: (s["node"], s["group_rank"]) for r, s in s1.items()} == \
            {0: ("3", "0"), 1: ("1", "1"), 2: ("2", "2")}, s1
        assert {s["world"] for s in s1.values()} == {"3"}
        write(job / "release", "")
        out = finish(procs)
        codes = [procs[i].returncode for i in (1, 2, 3)]
        assert codes == [0, 0, 0], {i: o[1][-2000:] for i, o in out.items()}
        # Node rank 1, the lowest left, coordinated: it says so and promoted the standby.
        assert "node rank 1 coordinates the job from now on" in out[1][1], out[1][1][-2000:]
        promos = of(events(job / "node1"), "promotion")
        assert [(p["cycle"], p["slot"], p["lost"], p["standby"]) for p in promos] == [(1, 0, 0, 3)], promos
        for i in (2, 3):
            assert "coordinates the job" not in out[i][1]
            assert not of(events(job / f"node{i}"), "promotion")
        ev3 = events(job / "node3")
        assert of(ev3, "standby", cycle=0) and of(ev3, "rank_started"), [e["event"] for e in ev3]
        # The new coordinator wrote the job's end: the service clears the job.
        wait_for(lambda: any("cleared" in line for line in store.lines), timeout=30,
                 what="the store service clearing the job")
    finally:
        finish(procs, timeout=5)
        rc, err = store.stop()
    assert rc == 0, err


def test_losing_node_rank_0_without_a_standby_requeues_the_job(job):
    write(job / "train.py", TRAIN)
    store = Service(job, env={"VIGIL_STORE_SECRET": SECRET})
    procs = start_agents(job, store.port, 3, "3")
    try:
        wait_attempt(job, 0, 3, timeout=60)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].communicate()
        out = finish(procs[1:], timeout=60)
        assert [p.returncode for p in procs[1:]] == [75, 75], {i: o[1][-2000:] for i, o in out.items()}
        assert all("node 0 was lost" in o[1] for o in out.values()), {i: o[1][-2000:] for i, o in out.items()}
        # Node rank 1 took the coordinator's work over to end the job: it wrote the job's end, so
        # the service clears the job and the requeued allocation finds a clean store.
        wait_for(lambda: any("cleared" in line for line in store.lines), timeout=30,
                 what="the store service clearing the job")
    finally:
        finish(procs, timeout=5)
        rc, err = store.stop()
    assert rc == 0, err


def test_c10d_without_node_ranks_losing_group_rank_0_promotes_the_standby(job):
    """The issue's check as worded: `vigil store` plus 4 agents (`--nnodes 3:4`, c10d without
    node ranks, is_host=false); SIGKILL the agent whose ranks have GROUP_RANK 0."""
    write(job / "train.py", TRAIN)
    store = Service(job, env={"VIGIL_STORE_SECRET": SECRET})
    procs = start_agents(job, store.port, 4, "3:4", ranked=False)
    try:
        wait_attempt(job, 0, 3, timeout=60)
        s0 = seen(job, 0, 3)
        by_group = {s["group_rank"]: int(s["node"]) for s in s0.values()}
        assert sorted(by_group) == ["0", "1", "2"], s0
        victim = by_group["0"]
        (standby,) = set(range(4)) - set(by_group.values())
        # Every agent drew its node rank from the store; none hosts it.
        for i in range(4):
            assert procs[i].poll() is None, i
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].communicate()
        wait_attempt(job, 1, 3, timeout=60)
        s1 = seen(job, 1, 3)
        # The standby plays the lost agent's GROUP_RANK 0; the others keep theirs.
        assert {s["group_rank"]: int(s["node"]) for s in s1.values()} == \
            {"0": standby, "1": by_group["1"], "2": by_group["2"]}, (s0, s1)
        assert {s["world"] for s in s1.values()} == {"3"}
        write(job / "release", "")
        rest = [i for i in range(4) if i != victim]
        out = finish([procs[i] for i in rest])
        codes = [procs[i].returncode for i in rest]
        assert codes == [0, 0, 0], {rest[i]: o[1][-2000:] for i, o in out.items()}
        # Node rank 1 (GROUP_RANK 1's agent), the lowest left, coordinated from then on.
        coordinator = rest.index(by_group["1"])
        assert "node rank 1 coordinates the job from now on" in out[coordinator][1], \
            out[coordinator][1][-2000:]
        assert all("outside the job: vigil store" in o[1] for o in out.values()), out
        promos = of(events(job / f"node{by_group['1']}"), "promotion")
        assert [(p["cycle"], p["slot"], p["lost"], p["standby"]) for p in promos] == [(1, 0, 0, 3)], promos
        wait_for(lambda: any("cleared" in line for line in store.lines), timeout=30,
                 what="the store service clearing the job")
    finally:
        finish(procs, timeout=5)
        rc, err = store.stop()
    assert rc == 0, err


def test_a_frozen_coordinator_is_lost_like_a_killed_one_and_leaves_when_it_wakes(job):
    """SIGSTOP instead of SIGKILL: the coordinator's counter stops, and after the agents'
    --node-timeout its lease counts as expired although the store (its own timeout 30 s) still
    holds its connection: node rank 1 takes the lease over and the standby takes its place. Woken,
    the old coordinator finds the lease in another's hands and leaves, its node lost."""
    write(job / "train.py", TRAIN)
    store = Service(job, "--node-timeout", "30", env={"VIGIL_STORE_SECRET": SECRET})
    procs = start_agents(job, store.port, 4, "3:4")
    try:
        wait_attempt(job, 0, 3, timeout=60)
        procs[0].send_signal(signal.SIGSTOP)
        wait_attempt(job, 1, 3, timeout=90)
        s1 = seen(job, 1, 3)
        assert {r: (s["node"], s["group_rank"]) for r, s in s1.items()} == \
            {0: ("3", "0"), 1: ("1", "1"), 2: ("2", "2")}, s1
        procs[0].send_signal(signal.SIGCONT)
        (out0,) = finish(procs[:1], timeout=60).values()
        assert procs[0].returncode == 75, out0[1][-2000:]
        assert "node rank 1 coordinates the job now" in out0[1], out0[1][-2000:]
        # The others went on without it.
        assert [p.poll() for p in procs[1:]] == [None, None, None]
        write(job / "release", "")
        out = finish(procs[1:])
        assert [p.returncode for p in procs[1:]] == [0, 0, 0], {i: o[1][-2000:] for i, o in out.items()}
        assert "node rank 1 coordinates the job from now on" in out[0][1], out[0][1][-2000:]
    finally:
        if procs[0].poll() is None:
            procs[0].send_signal(signal.SIGCONT)
        finish(procs, timeout=5)
        rc, err = store.stop()
    assert rc == 0, err


def test_a_job_that_lost_every_agent_is_cleared_and_its_requeue_runs(job):
    """Every agent SIGKILLed at once: nobody writes the job's end, so the service clears the job
    once no lease was left for twice its --node-timeout; the same job started again (a requeued
    allocation: same --rdzv-id, c10d tickets from the start) runs to the end."""
    write(job / "train.py", TRAIN)
    store = Service(job, "--node-timeout", "2", env={"VIGIL_STORE_SECRET": SECRET})
    first = start_agents(job, store.port, 2, "2", ranked=False)
    again = job / "again"
    again.mkdir()
    second = []
    try:
        wait_attempt(job, 0, 2, timeout=60)
        for p in first:
            p.send_signal(signal.SIGKILL)
        finish(first, timeout=10)
        wait_for(lambda: any("lost every agent without an end written" in line for line in store.lines),
                 timeout=60, what="the store service clearing the lost job")
        write(again / "train.py", TRAIN)
        write(again / "release", "")
        second = start_agents(again, store.port, 2, "2", ranked=False)
        out = finish(second)
        assert [p.returncode for p in second] == [0, 0], {i: o[1][-2000:] for i, o in out.items()}
        assert sorted(json.loads((again / f"seen_0_{r}.json").read_text())["group_rank"]
                      for r in range(2)) == ["0", "1"]
        wait_for(lambda: any("ended and every agent left" in line for line in store.lines),
                 timeout=30, what="the store service clearing the second job")
    finally:
        finish(first + second, timeout=5)
        rc, err = store.stop()
    assert rc == 0, err

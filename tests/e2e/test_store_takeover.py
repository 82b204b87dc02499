"""Losing any node, node rank 0's included, is a spare's promotion: with the store outside the
job (`vigil store`, every agent `--rdzv-conf is_host=false`), the coordinator's work moves to the
live agent with the lowest node rank when node rank 0's agent is lost (docs/store.md, "The store
outside the job"; docs/spares.md, "Node rank 0"). Node ranks are given explicitly (`--node-rank`)."""
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


def start_agents(job, port, n, nnodes):
    procs = []
    for i in range(n):
        (job / f"node{i}").mkdir()
        args = ["run", "--nnodes", nnodes, "--node-rank", str(i), "--master-addr", "127.0.0.1",
                "--master-port", str(port), "--nproc-per-node", "1", "--max-restarts", "2",
                "--node-timeout", "5", "--workers-stop-timeout", "3", "--rdzv-id", "take",
                "--rdzv-conf", "is_host=false", "--log-dir", str(job / f"node{i}"), "train.py"]
        env = base_env(OUT_DIR=job, NODE_ID=str(i), VIGIL_STORE_SECRET=SECRET)
        procs.append(start_vigil(args, cwd=job, env=env))
    return procs


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
        wait_for(lambda: all((job / f"seen_0_{r}.json").exists() for r in range(3)), timeout=60,
                 what="attempt 0's ranks")
        s0 = seen(job, 0, 3)
        (victim,) = [int(s["node"]) for s in s0.values() if s["group_rank"] == "0"]
        assert victim == 0, s0
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].communicate()
        wait_for(lambda: all((job / f"seen_1_{r}.json").exists() for r in range(3)), timeout=60,
                 what="attempt 1's ranks")
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
        wait_for(lambda: all((job / f"seen_0_{r}.json").exists() for r in range(3)), timeout=60,
                 what="attempt 0's ranks")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].communicate()
        out = finish(procs[1:], timeout=60)
        assert [p.returncode for p in procs[1:]] == [75, 75], {i: o[1][-2000:] for i, o in out.items()}
        assert all("node 0 was lost" in o[1] for o in out.values()), {i: o[1][-2000:] for i, o in out.items()}
    finally:
        finish(procs, timeout=5)
        rc, err = store.stop()
    assert rc == 0, err

"""Hot spares (issue 13, work in progress): a standby agent takes a lost node's place in the same
allocation, keeping every rank's number, without a requeue."""
import json
import os
import signal

from harness import base_env, events, of, start_vigil, wait_for, write
from fakes.nvml import nvml_env
from test_multinode import free_port

TRAIN = """
import json, os, sys, time, pathlib, vigil
out = pathlib.Path(os.environ["OUT_DIR"])
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
ckpt = out / f"ckpt_{rank}"
start = int(ckpt.read_text()) + 1 if ckpt.exists() else 0
(out / f"seen_{attempt}_{rank}.json").write_text(json.dumps({
    "node": os.environ["NODE_ID"], "group_rank": os.environ["GROUP_RANK"],
    "world": os.environ["WORLD_SIZE"], "start": start, "pid": os.getpid()}))
for step in range(start, int(sys.argv[1])):
    time.sleep(0.05)
    tmp = out / f"ckpt_{rank}.tmp"
    tmp.write_text(str(step))
    os.replace(tmp, ckpt)
    vigil.heartbeat(step)
"""



def start_agents(job, flags, script, fakes=None):
    """Three agents of one job, `--nnodes 2:3` (node 2 starts as the standby); each agent's ranks
    see NODE_ID; `fakes`: per node, the fake NVML file it reads."""
    port = free_port()
    procs = []
    for i in range(3):
        (job / f"node{i}").mkdir()
        args = ["run", "--nnodes", "2:3", "--node-rank", str(i), "--master-addr", "127.0.0.1",
                "--master-port", str(port), *flags, "--log-dir", str(job / f"node{i}"), *script]
        env = base_env(OUT_DIR=job, NODE_ID=str(i))
        if fakes:
            env = nvml_env(env, fakes[i])
        procs.append(start_vigil(args, cwd=job, env=env))
    return procs

def test_a_standby_takes_a_lost_nodes_place_and_the_job_completes(job):
    write(job / "train.py", TRAIN)
    procs = start_agents(job, ["--nproc-per-node", "2", "--max-restarts", "2", "--rdzv-id", "sp"],
                         ["train.py", "120"])
    try:
        wait_for(lambda: all((job / f"seen_0_{r}.json").exists() for r in range(4)), timeout=60,
                 what="attempt 0's ranks")
        seen0 = {r: json.loads((job / f"seen_0_{r}.json").read_text()) for r in range(4)}
        assert {r: s["node"] for r, s in seen0.items()} == {0: "0", 1: "0", 2: "1", 3: "1"}, seen0
        wait_for(lambda: (job / "ckpt_3").exists() and int((job / "ckpt_3").read_text()) >= 10,
                 what="progress")
        procs[1].send_signal(signal.SIGKILL)
        procs[1].communicate()
        res = [p.communicate(timeout=120) for p in (procs[0], procs[2])]
        codes = [procs[0].returncode, procs[2].returncode]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert codes == [0, 0], [r[1][-2000:] for r in res]
    seen1 = {r: json.loads((job / f"seen_1_{r}.json").read_text()) for r in range(4)}
    # The standby (node 2) plays node 1's slot: the same global ranks, GROUP_RANK and world.
    assert {r: s["node"] for r, s in seen1.items()} == {0: "0", 1: "0", 2: "2", 3: "2"}, seen1
    assert [seen1[r]["group_rank"] for r in range(4)] == ["0", "0", "1", "1"]
    assert {s["world"] for s in seen1.values()} == {"4"}
    # Its ranks went on from the checkpoint node 1's ranks saved before the loss.
    assert seen1[3]["start"] > 10, seen1
    promos = of(events(job / "node0"), "promotion")
    assert [(p["cycle"], p["slot"], p["lost"], p["standby"]) for p in promos] == [(1, 1, 1, 2)], promos
    # The ledger keeps the promotion, and the allocation finished: nothing to requeue.
    (rec,) = [json.loads(l) for l in (job / "node0" / "vigil-job-sp" / "ledger.jsonl").read_text().splitlines()]
    assert rec["decision"] == "finished" and rec["restarts"] == 1, rec
    assert rec["promotions"] == [{"cycle": 1, "slot": 1, "lost": 1, "standby": 2}], rec
    ev2 = events(job / "node2")
    assert of(ev2, "standby") and of(ev2, "joined"), [e["event"] for e in ev2]
    assert all(int((job / f"ckpt_{r}").read_text()) == 119 for r in range(4))


def test_a_node_that_fails_its_health_check_runs_no_ranks_and_a_standby_plays_its_part(job):
    from fakes.nvml import gpu, write_nvml
    write(job / "train.py", TRAIN)
    fakes = [write_nvml(job / f"nvml{i}.json", [gpu(0, ecc_uncorrected_volatile=2 if i == 1 else 0)])
             for i in range(3)]
    procs = start_agents(job, ["--nproc-per-node", "2", "--health-check"], ["train.py", "20"], fakes)
    res = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [r[1][-2000:] for r in res]
    seen = {r: json.loads((job / f"seen_0_{r}.json").read_text()) for r in range(4)}
    # Node 1 failed its check (ECC): node 2 ran group rank 1 from the first attempt.
    assert {r: s["node"] for r, s in seen.items()} == {0: "0", 1: "0", 2: "2", 3: "2"}, seen
    assert not of(events(job / "node1"), "rank_started")
    assert of(events(job / "node1"), "standby")


def test_losing_node_rank_0_ends_the_job_for_a_requeue_and_says_why(job):
    write(job / "train.py", TRAIN)
    procs = start_agents(job, ["--nproc-per-node", "1", "--max-restarts", "2", "--node-timeout", "3"],
                         ["train.py", "100000"])
    try:
        wait_for(lambda: all((job / f"seen_0_{r}.json").exists() for r in range(2)), timeout=60,
                 what="attempt 0's ranks")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].communicate()
        res = [p.communicate(timeout=120) for p in procs[1:]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs[1:]] == [75, 75], [r[1][-1500:] for r in res]
    assert all("cannot take node rank 0's place" in r[1] for r in res), [r[1][-1500:] for r in res]


def test_a_standby_that_fails_its_health_check_is_never_promoted(job):
    from fakes.nvml import gpu, write_nvml
    write(job / "train.py", TRAIN)
    # The standby (node 2) has an uncorrectable ECC error; the actives are clean.
    fakes = [write_nvml(job / f"nvml{i}.json", [gpu(0, ecc_uncorrected_volatile=2 if i == 2 else 0)])
             for i in range(3)]
    procs = start_agents(job, ["--nproc-per-node", "1", "--max-restarts", "2", "--health-check"],
                         ["train.py", "100000"], fakes)
    try:
        wait_for(lambda: all((job / f"seen_0_{r}.json").exists() for r in range(2)), timeout=60,
                 what="attempt 0's ranks")
        procs[1].send_signal(signal.SIGKILL)
        procs[1].communicate()
        res = {i: procs[i].communicate(timeout=120) for i in (0, 2)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    # No healthy standby: the job ends to be requeued, as without spares; node 2 never ran ranks.
    assert procs[0].returncode == 75, res[0][1][-1500:]
    assert not of(events(job / "node2"), "rank_started")
    assert not of(events(job / "node0"), "promotion")


FAILS_ON_NODE_1 = """
import os, sys, time
if os.environ["NODE_ID"] == "1":
    sys.exit(3)
time.sleep(0.3)
"""


def test_a_node_whose_ranks_fail_twice_in_a_row_is_replaced_by_a_standby(job):
    write(job / "train.py", FAILS_ON_NODE_1)
    procs = start_agents(job, ["--nproc-per-node", "1", "--max-restarts", "3"], ["train.py"])
    res = [p.communicate(timeout=120) for p in procs]
    # Node 1's ranks fail in attempts 0 and 1; attempt 2 runs with the standby and succeeds.
    assert [p.returncode for p in procs] == [0, 0, 0], [r[1][-1500:] for r in res]
    promos = of(events(job / "node0"), "promotion")
    assert [(p["cycle"], p["slot"], p["lost"], p["standby"]) for p in promos] == [(2, 1, 1, 2)], promos
    assert of(events(job / "node1"), "standby", cycle=2)

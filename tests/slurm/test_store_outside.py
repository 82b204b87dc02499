"""The store outside the job on the real Slurm cluster (docs/store.md, "The store outside the job";
docs/slurm.md, "The store outside the job"): `vigil store --listen` runs in the test process, not
in the Slurm job; a 3-node job runs `srun vigil run --nnodes 2:3 --rdzv-conf is_host=false`, so
every agent, node rank 0's included, is only the store's client, and n3 (node rank 2) is a standby.
Node rank 0's agent (on n1) is SIGKILLed: the standby takes GROUP_RANK 0 in the next attempt, node
rank 1 coordinates from then on, and the job finishes in its first allocation. The same scenario
without Slurm: tests/e2e/test_store_takeover.py.

Node ranks come from Slurm (`SLURM_NODEID`): they count as given node ranks, as `--node-rank`
does, so no flag is needed.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import SHIM, base_env, events, of, start_vigil, vigil_bin, wait_for
from harness import StoreService

from .slurmlib import TERMINAL_STATES, sbatch, show_job, slurm_cmd, wait_job

SECRET = "0123456789abcdef-outside-the-slurm-job"

# Records GROUP_RANK per attempt and runs until released (the file `release`).
TRAIN = """
import json, os, pathlib, time
out = pathlib.Path(os.environ["OUT_DIR"])
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
tmp = out / f"seen_{attempt}_{rank}.tmp"
tmp.write_text(json.dumps({
    "node": os.environ["SLURM_NODEID"], "host": os.environ["SLURMD_NODENAME"],
    "group_rank": os.environ["GROUP_RANK"], "world": os.environ["WORLD_SIZE"]}))
os.replace(tmp, out / f"seen_{attempt}_{rank}.json")
while not (out / "release").exists():
    time.sleep(0.05)
"""


def submit(d: Path, port: int) -> int:
    """A 3-node job, one agent per node; each agent's stdout, stderr and exit status go to
    agent<node id>.out/.err/.rc, its events to node<node id>/."""
    (d / "train.py").write_text(TRAIN)
    agent = (
        f"{vigil_bin()} run --nnodes 2:3 --master-addr 127.0.0.1 --master-port {port} "
        "--rdzv-conf is_host=false --node-timeout 5 --workers-stop-timeout 3 --max-restarts 2 "
        f"--nproc-per-node 1 --log-dir {d}/node$SLURM_NODEID --state-dir {d}/state train.py "
        f">{d}/agent$SLURM_NODEID.out 2>{d}/agent$SLURM_NODEID.err; "
        f"echo $? >{d}/agent$SLURM_NODEID.rc"
    )
    return sbatch(
        f"""#!/bin/bash
#SBATCH -N 3 --ntasks-per-node=1
export PYTHON_EXEC={sys.executable} PYTHONPATH={SHIM} OUT_DIR={d}
export VIGIL_STORE_SECRET={SECRET}
srun --kill-on-bad-exit=0 bash -c '{agent}'
""",
        d,
    )


def output(d: Path, job_id: int) -> str:
    parts = []
    for f in [d / f"slurm-{job_id}.out", *sorted(d.glob("agent*"))]:
        if f.exists():
            parts.append(f"--- {f.name}\n{f.read_text()[-3000:]}")
    return "\n".join(parts)


def agent_pid(job_id: int, node_id: int) -> int:
    """The pid of the job's vigil agent with SLURM_NODEID=node_id (every node is this host)."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_NODEID={node_id}".encode()}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if (p / "comm").read_text().strip() != "vigil":
                continue
            cmd = (p / "cmdline").read_bytes().split(b"\0")
            env = set((p / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if b"run" in cmd and want <= env:
            return int(p.name)
    raise AssertionError(f"no vigil agent of job {job_id} with SLURM_NODEID={node_id}")


def wait_seen(d: Path, job_id: int, attempt: int, world: int, timeout: float = 120.0) -> dict:
    """Waits until every rank of `attempt` recorded what it saw; fails early if the job ended."""
    paths = [d / f"seen_{attempt}_{r}.json" for r in range(world)]
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if show_job(job_id)["JobState"] in TERMINAL_STATES:
            raise AssertionError(f"job ended before attempt {attempt}'s ranks ran\n{output(d, job_id)}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"attempt {attempt}'s ranks not all seen within {timeout}s\n{output(d, job_id)}")
        time.sleep(0.1)
    return {r: json.loads(p.read_text()) for r, p in enumerate(paths)}


def test_losing_node_rank_0_promotes_the_standby_with_the_store_outside_the_job(slurm_cluster, tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    store = StoreService(tmp_path, env={"VIGIL_STORE_SECRET": SECRET})
    job_id = None
    try:
        job_id = submit(d, store.port)
        s0 = wait_seen(d, job_id, 0, 2)
        # Node rank 0 (n1) and 1 (n2) run ranks, n3 (node rank 2) stands by.
        assert {r: (s["node"], s["host"], s["group_rank"]) for r, s in s0.items()} == \
            {0: ("0", "n1", "0"), 1: ("1", "n2", "1")}, s0
        ev2 = wait_for(lambda: of(events(d / "node2"), "standby", cycle=0) if (d / "node2").exists() else [],
                       timeout=60, what="node rank 2 standing by")
        assert ev2
        # Killed at once: the others park on the store's record of the coordinator's loss
        # (vigil/lease_lost/coord), which exists whether they parked before or after the loss.
        os.kill(agent_pid(job_id, 0), signal.SIGKILL)
        try:
            s1 = wait_seen(d, job_id, 1, 2)
        except AssertionError as e:
            ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,args"], capture_output=True, text=True).stdout
            ps = "\n".join(l for l in ps.splitlines() if "vigil" in l or "train" in l)
            ss = subprocess.run(["ss", "-tnp"], capture_output=True, text=True).stdout
            raise AssertionError(f"{e}\nstore: {store.lines}\n{ps}\n{ss}")
        # The standby (node rank 2, n3) plays node rank 0's slot: GROUP_RANK 0; the world stays 2.
        assert {r: (s["node"], s["host"], s["group_rank"]) for r, s in s1.items()} == \
            {0: ("2", "n3", "0"), 1: ("1", "n2", "1")}, s1
        assert {s["world"] for s in s1.values()} == {"2"}, s1
        (d / "release").write_text("")
        info = wait_job(job_id, timeout=180)
        out = output(d, job_id)
        # srun counts the agent that was killed, so Slurm may say FAILED: the agents say what happened.
        assert info["Restarts"] == "0", f"{info}\n{out}"
        rcs = {i: (d / f"agent{i}.rc").read_text().strip() for i in range(3)}
        assert rcs == {0: "137", 1: "0", 2: "0"}, f"{rcs}\n{out}"
        err = {i: (d / f"agent{i}.err").read_text() for i in (1, 2)}
        # Node rank 1, the lowest left, coordinated: it says so and promoted the standby.
        assert "node rank 1 coordinates the job from now on" in err[1], out
        assert "coordinates the job" not in err[2], out
        promos = of(events(d / "node1"), "promotion")
        assert [(p["cycle"], p["slot"], p["lost"], p["standby"]) for p in promos] == [(1, 0, 0, 2)], promos
        assert not of(events(d / "node2"), "promotion")
        ev2 = events(d / "node2")
        assert of(ev2, "rank_started"), [e["event"] for e in ev2]
        for i in (1, 2):
            last = events(d / f"node{i}")[-1]
            assert last["event"] == "result" and last["outcome"] == "succeeded", (i, last)
        # The new coordinator concluded the allocation in node rank 0's place: the ledger holds
        # it, with the promotion.
        ledger = [json.loads(line) for line in (d / "state" / "ledger.jsonl").read_text().splitlines()
                  if line.strip()]
        assert [(r["allocation"], r["outcome"]) for r in ledger] == [(1, "finished")], ledger
        assert ledger[0]["promotions"] == [{"cycle": 1, "slot": 0, "lost": 0, "standby": 2}], ledger
        # The store served the job from outside it: one job joined; the new coordinator wrote the
        # job's end, so the service clears it.
        joined = [line for line in store.lines if "joined" in line]
        assert len(joined) == 1 and f'"{job_id}"' in joined[0], store.lines
        wait_for(lambda: any("cleared" in line for line in store.lines), timeout=30,
                 what="the store service clearing the job")
    finally:
        if job_id is not None and show_job(job_id)["JobState"] not in TERMINAL_STATES:
            (d / "release").write_text("")
            slurm_cmd("scancel", job_id, check=False)
        rc, serr = store.stop()
    assert rc == 0, serr

"""Several agents on loopback, one per simulated node, with torchrun's explicit flags.

Every agent is the real binary with real rank processes, coordinating through the real store on
node rank 0. Assertions are on exit statuses, event logs and their order; bounds are generous
failure limits, never timing goals (the timings live in bench/multinode_bench.py).
"""
import json
import os
import signal
import socket
import subprocess

from harness import base_env, events, of, one, pid_alive, start_vigil, wait_for, write


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nodes:
    """`n` agents of one job, node ranks 0..n-1, each with its own log directory."""

    def __init__(self, job, n, script, *, nproc=2, extra=(), per_node=None, env=None, port=None,
                 node_ranks=None, per_node_env=None):
        self.job, self.n = job, n
        self.port = port or free_port()
        self.procs = []
        for i, node_rank in enumerate(node_ranks or range(n)):
            (job / f"node{i}" / "logs").mkdir(parents=True, exist_ok=True)
            args = ["run", "--nnodes", str(n), "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
                    "--master-port", str(self.port), "--nproc-per-node", str(nproc),
                    "--log-dir", str(job / f"node{i}" / "logs"), *extra,
                    *(per_node(i) if per_node else ()), *script]
            node_env = {**(env or {}), **(per_node_env(i) if per_node_env else {})}
            self.procs.append(start_vigil(args, cwd=job, env=base_env(OUT_DIR=job, **node_env)))
        self.results = None

    def wait(self, timeout=120):
        out = []
        try:
            for p in self.procs:
                o, e = p.communicate(timeout=timeout)
                out.append((p.returncode, o, e))
        finally:
            self.kill()
        self.results = out
        return out

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.communicate()

    def events(self, i):
        return events(self.job / f"node{i}" / "logs")


def markers(job, prefix):
    return sorted(p.name for p in job.glob(prefix + "*"))


ENV_DUMP = """
import json, os, sys
keys = sys.argv[1].split(",")
path = os.path.join(os.environ["OUT_DIR"], f"env_{os.environ['RANK']}.json")
json.dump({k: os.environ.get(k) for k in keys}, open(path, "w"))
"""

KEYS = ("RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK "
        "ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS "
        "TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE").split()

# The rank speaks c10d (VALIDATE, then PING) to MASTER_ADDR:MASTER_PORT, its node's ranks' door, which
# carries it to node rank 0's store; the answer is recorded as DOOR.
DOOR_PING = """
import socket, struct
s = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=30)
s.sendall(b"\\x00" + struct.pack("<I", 0x3C85F7CE) + b"\\x0d" + struct.pack("<I", 0x5EED))
got = b""
while len(got) < 4:
    got += s.recv(4 - len(got)) or b"????"
s.close()
d = json.load(open(path))
d["DOOR"] = "answers" if got == struct.pack("<I", 0x5EED) else repr(got)
json.dump(d, open(path, "w"))
"""

# Rank `bad` fails in the first `fails` attempts; everyone else waits to be stopped in those.
FLAKY = """
import os, sys, time, pathlib
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
out = pathlib.Path(os.environ["OUT_DIR"])
(out / f"ran_{rank}_{attempt}").write_text(f"{os.getpid()} {os.environ['WORLD_SIZE']}")
bad, fails = int(sys.argv[1]), int(sys.argv[2])
if attempt < fails:
    if rank == bad:
        # Fail once every rank of the attempt is up, so that each of them has something to stop.
        while len(list(out.glob(f"ran_*_{attempt}"))) < int(os.environ["WORLD_SIZE"]):
            time.sleep(0.01)
        sys.exit(7)
    time.sleep(120)
"""


def test_global_environment_and_leaving_together(job):
    write(job / "dump.py", ENV_DUMP + DOOR_PING)
    nodes = Nodes(job, 2, ["dump.py", ",".join(KEYS)], nproc=2, extra=["--rdzv-id", "j9", "--max-restarts", "4"])
    res = nodes.wait()
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    for rank in range(4):
        e = json.loads((job / f"env_{rank}.json").read_text())
        assert e["RANK"] == e["ROLE_RANK"] == str(rank)
        assert e["LOCAL_RANK"] == str(rank % 2)
        assert e["GROUP_RANK"] == str(rank // 2), "global ranks follow node rank"
        assert e["WORLD_SIZE"] == e["ROLE_WORLD_SIZE"] == "4"
        assert (e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) == ("2", "2")
        # Each node's ranks reach node rank 0's store through their own node's door on loopback.
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] != str(nodes.port), e
        assert e["DOOR"] == "answers", e
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert (e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "4")
        assert e["TORCHELASTIC_RUN_ID"] == "j9"
    doors = [{json.loads((job / f"env_{r}.json").read_text())["MASTER_PORT"] for r in (n, n + 1)} for n in (0, 2)]
    assert len(doors[0]) == len(doors[1]) == 1 and doors[0] != doors[1], doors
    for i in range(2):
        ev = nodes.events(i)
        assert of(ev, "joined", cycle=0, rank_offset=2 * i)
        assert of(ev, "cycle_ended", cycle=0, end="done")
        assert ev[-1]["event"] == "result" and ev[-1]["outcome"] == "succeeded"


def test_crash_on_node1_restarts_every_node(job):
    write(job / "flaky.py", FLAKY)
    nodes = Nodes(job, 2, ["flaky.py", "3", "1"], extra=["--max-restarts", "2"])
    res = nodes.wait()
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    assert markers(job, "ran_") == [f"ran_{r}_{a}" for r in range(4) for a in range(2)]
    for i in range(2):
        ev = nodes.events(i)
        ended = of(ev, "cycle_ended", cycle=0)
        assert len(ended) == 1 and ended[0]["end"] == "failed" and ended[0]["node"] == 1
        assert "rank 3 exited with code 7" in ended[0]["reason"]
        assert [e["to_cycle"] for e in of(ev, "restart")] == [1]
        assert [e["cycle"] for e in of(ev, "cycle_start")] == [0, 1]
    # Node 0's ranks did not fail: they were stopped because of node 1.
    ev0 = nodes.events(0)
    stop = of(ev0, "stop", cycle=0)[0]
    assert stop["reason"] == "peer"
    assert not [e for e in of(ev0, "rank_exited", cycle=0) if not e["expected"]]
    assert "attempt 0 failed on node 1: rank 3 exited with code 7" in res[0][2]


HANG = """
import os, time, pathlib, vigil
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
(pathlib.Path(os.environ["OUT_DIR"]) / f"ran_{rank}_{attempt}").touch()
for i in range(3):
    vigil.heartbeat(i)
    time.sleep(0.05)
if rank == 0 and attempt == 0:
    time.sleep(120)  # hung: no more heartbeats
"""


def test_hang_on_node0_restarts_every_node(job):
    write(job / "hang.py", HANG)
    nodes = Nodes(job, 2, ["hang.py"], extra=["--max-restarts", "1", "--heartbeat-timeout", "2",
                                               "--stack-dump-timeout", "1"])
    res = nodes.wait()
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    ev0, ev1 = nodes.events(0), nodes.events(1)
    assert of(ev0, "hang", cycle=0, rank=0)
    for ev in (ev0, ev1):
        (ended,) = of(ev, "cycle_ended", cycle=0)
        assert (ended["end"], ended["node"]) == ("failed", 0) and "rank 0 hung" in ended["reason"]
        assert [e["cycle"] for e in of(ev, "cycle_start")] == [0, 1]
    # Node 1's ranks had all finished attempt 0 when node 0's rank hung: it waited, then restarted.
    kinds1 = [e["event"] for e in ev1 if e.get("cycle") == 0]
    assert kinds1.index("cycle_ended") > max(i for i, k in enumerate(kinds1) if k == "rank_exited")
    assert markers(job, "ran_") == [f"ran_{r}_{a}" for r in range(4) for a in range(2)]


def test_restart_budget_is_one_for_the_job(job):
    write(job / "flaky.py", FLAKY)
    # Node 1 asks for 5 restarts, node 0 for 1: node rank 0's budget is the job's.
    nodes = Nodes(job, 2, ["flaky.py", "3", "99"], extra=["--workers-stop-timeout", "3"],
                  per_node=lambda i: ["--max-restarts", "1" if i == 0 else "5"])
    res = nodes.wait()
    assert [rc for rc, _, _ in res] == [1, 1], [e for _, _, e in res]
    for i in range(2):
        ev = nodes.events(i)
        assert [e["cycle"] for e in of(ev, "cycle_start")] == [0, 1]
        assert ev[-1]["outcome"] == "failed" and ev[-1]["restarts"] == 1
    assert markers(job, "ran_") == [f"ran_{r}_{a}" for r in range(4) for a in range(2)]
    # Node 0 had no failure of its own: its summary points at node 1.
    assert "Root Cause" in res[0][2] and "on node 1: rank 3 exited with code 7" in res[0][2]
    assert "exitcode  : 7" in res[1][2]


def rank_pids(job):
    return [int((job / n).read_text().split()[0]) for n in markers(job, "ran_")]


def running_job(job):
    """Two agents whose four ranks are all running (and would never end on their own)."""
    write(job / "flaky.py", FLAKY)
    nodes = Nodes(job, 2, ["flaky.py", "-1", "1"], extra=["--max-restarts", "3", "--node-timeout", "5",
                                                          "--workers-stop-timeout", "3"])
    # A marker exists before its pid is written in it: wait for the pids, not the files.
    wait_for(lambda: len([n for n in markers(job, "ran_") if (job / n).read_text().strip()]) == 4,
             what="all four ranks running")
    return nodes, rank_pids(job)


def test_agent_sigkilled_ends_the_job_everywhere(job):
    nodes, pids = running_job(job)
    nodes.procs[1].kill()
    rc0 = nodes.procs[0].wait(timeout=60)
    res = nodes.wait()
    assert rc0 == 75, res[0][2]
    assert "node 1" in res[0][2] and "was lost" in res[0][2] and "requeue" in res[0][2]
    ev0 = nodes.events(0)
    (ended,) = of(ev0, "cycle_ended", cycle=0)
    assert ended["end"] == "lost"
    assert ev0[-1]["outcome"] == "lost" and ev0[-1]["exit_code"] == 75
    assert not of(ev0, "restart"), "a lost node is not restarted in the job"
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=30, what="every rank gone")


def test_head_sigkilled_no_agent_hangs(job):
    nodes, pids = running_job(job)
    nodes.procs[0].kill()
    rc1 = nodes.procs[1].wait(timeout=60)
    res = nodes.wait()
    assert rc1 == 75, res[1][2]
    assert "lost the connection to node rank 0's store" in res[1][2]
    ev1 = nodes.events(1)
    assert ev1[-1]["outcome"] == "lost"
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=30, what="every rank gone")


def test_sigterm_to_one_agent_stops_every_node_without_restart(job):
    write(job / "flaky.py", FLAKY)
    nodes = Nodes(job, 2, ["flaky.py", "-1", "1"], extra=["--max-restarts", "3", "--term-timeout", "3"])
    wait_for(lambda: len(markers(job, "ran_")) == 4, what="all four ranks running")
    nodes.procs[1].send_signal(signal.SIGTERM)
    res = nodes.wait(timeout=60)
    assert [rc for rc, _, _ in res] == [143, 143], [e for _, _, e in res]
    ev0 = nodes.events(0)
    assert ev0[-1]["outcome"] == "peer_stopped" and ev0[-1]["node"] == 1
    assert not of(ev0, "restart") and not of(nodes.events(1), "restart")
    assert "stopped because node 1 stopped the job" in res[0][2]


def test_duplicate_node_rank_and_join_timeout(job):
    write(job / "flaky.py", FLAKY)
    # Three nodes expected; two agents claim node rank 1 and node rank 2 never comes.
    nodes = Nodes(job, 3, ["flaky.py", "-1", "0"], extra=["--join-timeout", "4"], node_ranks=[0, 1, 1])
    res = nodes.wait(timeout=60)
    codes = [rc for rc, _, _ in res]
    dup = [i for i, (rc, _, e) in enumerate(res) if "already taken" in e]
    assert len(dup) == 1 and codes[dup[0]] == 2, [e for _, _, e in res]
    others = [i for i in range(3) if i not in dup]
    for i in others:
        assert codes[i] == 75, res[i][2]
        assert "only 2 of 3 nodes joined attempt 0" in res[i][2]
    assert not markers(job, "ran_"), "no rank starts before every node joined"


def test_contradicting_slurm_is_refused_before_anything_starts(job):
    env = base_env(SLURM_JOB_ID="77", SLURM_NNODES="2", SLURM_NODEID="1", SLURM_STEP_ID="0",
                   SLURM_STEP_NUM_NODES="2", SLURM_STEP_NUM_TASKS="2", SLURM_JOB_NODELIST="n[1-2]")
    write(job / "t.py", "print('never')\n")
    r = subprocess.run([*start_args(), "--nnodes", "4", "t.py"], cwd=job, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--nnodes 4" in r.stderr and "SLURM_STEP_NUM_NODES=2" in r.stderr
    assert "never" not in r.stdout


def start_args():
    from harness import vigil_bin
    return [vigil_bin(), "run"]


def test_flags_from_pet_environment_work_across_nodes(job):
    write(job / "dump.py", ENV_DUMP)
    port = free_port()
    procs = []
    for i in range(2):
        (job / f"n{i}").mkdir()
        env = base_env(OUT_DIR=job, PET_NNODES="2", PET_NODE_RANK=str(i), PET_RDZV_ENDPOINT=f"127.0.0.1:{port}",
                       PET_NPROC_PER_NODE="1")
        procs.append(start_vigil(["run", "--log-dir", str(job / f"n{i}"), "dump.py", "RANK,WORLD_SIZE,MASTER_PORT"],
                                 cwd=job, env=env))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    got = [json.loads((job / f"env_{r}.json").read_text()) for r in range(2)]
    assert [(g["RANK"], g["WORLD_SIZE"]) for g in got] == [(str(r), "2") for r in range(2)]
    # The ranks' doors, not the endpoint's port (node rank 0's store).
    assert all(g["MASTER_PORT"] not in (None, "0", str(port)) for g in got), got
    assert os.path.exists(job / "env_1.json")


BEATS = """
import os, time, vigil
gap = 0.05 if os.environ["GROUP_RANK"] == "0" else 0.3
for i in range(18):
    vigil.heartbeat(i)
    time.sleep(gap)
"""


def test_calculated_timeouts_are_job_wide_and_saved_once(job):
    write(job / "beats.py", BEATS)
    nodes = Nodes(job, 2, ["beats.py"], nproc=1, extra=["--calculate-timeouts", "--heartbeat-timeout", "60", "--rdzv-id", "tj"])
    res = nodes.wait()
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    calc = [of(nodes.events(i), "timeouts_updated", source="calculated") for i in range(2)]
    assert all(len(c) == 1 for c in calc), calc
    hb = [c[0]["timeouts"]["heartbeat"] for c in calc]
    # Node 1's ranks beat every 0.3 s (x5 safety factor), node 0's every 0.05 s (the 1 s floor):
    # both nodes apply the larger.
    assert hb[0] == hb[1] and hb[0] > 1.2, hb
    saved = list((job / "node0" / "logs").glob("vigil-job-tj/timeouts.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["timeouts"]["heartbeat"] == hb[0]
    assert not list((job / "node1" / "logs").glob("**/timeouts.json")), "only node rank 0 saves"


EXCLUDE = """
import os, sys, time, pathlib
import vigil.compat as ft
c = ft.RankMonitorClient()
c.init_workload_monitoring()
if os.environ["GROUP_RANK"] == "1" and os.environ["LOCAL_RANK"] == "0":
    c.send_workload_control_request(ft.WorkloadControlRequest(ft.WorkloadAction.ExcludeThisNode, "ECC errors"))
    time.sleep(0.5)
    sys.exit(4)
time.sleep(300)
"""


def test_exclude_this_node_ends_the_job_on_every_node_as_a_lost_node(job):
    write(job / "ex.py", EXCLUDE)
    nodes = Nodes(job, 2, ["ex.py"], nproc=1, extra=["--max-restarts", "3", "--rdzv-id", "ex"])
    res = nodes.wait(timeout=120)
    # No in-job restart without that node: both end as for a lost node, "run me again".
    assert [r[0] for r in res] == [75, 75], [r[2][-1500:] for r in res]
    for i in range(2):
        ev = nodes.events(i)
        assert len(of(ev, "cycle_start")) == 1, i
        assert one(ev, "result")["outcome"] == "lost"
    assert of(nodes.events(1), "workload_control")[0]["action"] == "exclude_this_node"
    # Node rank 0 learned which node left: node 1 (ExcNodeList under Slurm).
    assert any(e.get("node") == 1 for e in of(nodes.events(0), "cycle_ended"))

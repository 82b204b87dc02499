"""torchrun's c10d rendezvous without node ranks, and `--nnodes MIN:MAX`'s elastic start.

Every agent is the real binary on loopback, started with `--rdzv-backend c10d --rdzv-endpoint`
and no `--node-rank` (nor Slurm's or NGC's): the agent that binds the endpoint hosts vigil's store
and is node rank 0, the others get 1..N-1 in the order they reach it, and keep them across the
job's restarts. Assertions are on exit statuses, the ranks' environment and the event logs; bounds
are generous failure limits, never timing goals.
"""
import json
import socket

from harness import base_env, events, of, read_events, start_vigil, wait_for, write

# Each rank records its environment per attempt in its agent's OUT_DIR; rank WORLD_SIZE-1 fails
# the first `fails` attempts once every rank of the attempt is up (SHARED counts them).
RECORD = """
import json, os, sys, time, pathlib
e = os.environ
rank, attempt = int(e["RANK"]), int(e["TORCHELASTIC_RESTART_COUNT"])
out, shared = pathlib.Path(e["OUT_DIR"]), pathlib.Path(e["SHARED"])
keys = "RANK LOCAL_RANK WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK MASTER_PORT".split()
(out / f"a{attempt}_l{e['LOCAL_RANK']}.json").write_text(json.dumps({k: e.get(k) for k in keys}))
(shared / f"up_{attempt}_{rank}").write_text("")
fails = int(sys.argv[1])
world = int(e["WORLD_SIZE"])
if attempt < fails:
    if rank == world - 1:
        while len(list(shared.glob(f"up_{attempt}_*"))) < world:
            time.sleep(0.01)
        sys.exit(7)
    time.sleep(120)
# Wait for a release file when asked to, so that the job is still up while a test pokes at it.
release = e.get("RELEASE")
while release and not pathlib.Path(release).exists():
    time.sleep(0.02)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class C10d:
    """Agents of one job started as torchrun's c10d users start them: no node rank anywhere."""

    def __init__(self, job, nnodes, *, nproc=2, extra=(), script_args=("0",), env=None):
        self.job, self.nnodes, self.nproc = job, str(nnodes), nproc
        self.port = free_port()
        self.extra, self.script_args, self.env = list(extra), list(script_args), env or {}
        (job / "shared").mkdir(exist_ok=True)
        write(job / "record.py", RECORD)
        self.procs = []

    def start(self, nnodes=None, **env_of_this_agent):
        i = len(self.procs)
        logs, out = self.job / f"node{i}" / "logs", self.job / f"out{i}"
        logs.mkdir(parents=True)
        out.mkdir()
        args = ["run", "--nnodes", nnodes or self.nnodes, "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", "c10d-test",
                "--nproc-per-node", str(self.nproc), "--log-dir", str(logs), *self.extra,
                "record.py", *self.script_args]
        env = base_env(OUT_DIR=out, SHARED=self.job / "shared", **{**self.env, **env_of_this_agent})
        self.procs.append(start_vigil(args, cwd=self.job, env=env))
        return self.procs[-1]

    def start_all(self, n):
        """The first agent binds the endpoint before the others start: it is the endpoint's host."""
        first = self.start()
        wait_for(lambda: listening(self.port) or first.poll() is not None, 60,
                 "the first agent to host the store")
        assert first.poll() is None, first.communicate()
        for _ in range(n - 1):
            self.start()

    def wait(self, timeout=120):
        out = []
        try:
            for p in self.procs:
                o, e = p.communicate(timeout=timeout)
                out.append((p.returncode, o, e))
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        return out

    def node_rank(self, i):
        ranks = {e["node_rank"] for e in events(self.job / f"node{i}" / "logs") if "node_rank" in e}
        assert len(ranks) == 1, ranks
        return ranks.pop()

    def records(self, i, attempt):
        return [json.loads((self.job / f"out{i}" / f"a{attempt}_l{l}.json").read_text())
                for l in range(self.nproc)]


def check_ranks(c, n, attempts):
    """Node ranks 0..n-1, the endpoint's host 0, and every rank's environment following its
    agent's node rank in every attempt."""
    ranks = [c.node_rank(i) for i in range(n)]
    assert ranks[0] == 0, "the agent that hosts the endpoint is node rank 0"
    assert sorted(ranks) == list(range(n)), ranks
    for attempt in range(attempts):
        seen = []
        for i, node in enumerate(ranks):
            for local, r in enumerate(c.records(i, attempt)):
                assert r["GROUP_RANK"] == str(node), (i, attempt, r)
                assert r["RANK"] == r["ROLE_RANK"] == str(node * c.nproc + local), r
                assert r["WORLD_SIZE"] == str(n * c.nproc), r
                assert r["GROUP_WORLD_SIZE"] == str(n), r
                # The ranks' door of their node, not the endpoint (node rank 0's store).
                assert r["MASTER_PORT"] != str(c.port), r
                seen.append(int(r["RANK"]))
        assert sorted(seen) == list(range(n * c.nproc)), seen
    return ranks


def test_two_agents_without_node_ranks_are_given_0_and_1(job):
    c = C10d(job, 2)
    c.start_all(2)
    res = c.wait()
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    check_ranks(c, 2, 1)
    assert "node 0 of 2 (handed out by the rendezvous)" in res[0][2]
    assert "(here)" in res[0][2] and "node 1 of 2" in res[1][2]


def test_three_agents_keep_their_node_ranks_across_a_restart(job):
    c = C10d(job, 3, script_args=["1"], extra=["--max-restarts", "2"])
    c.start_all(3)
    res = c.wait()
    assert [rc for rc, _, _ in res] == [0, 0, 0], [e for _, _, e in res]
    # Attempt 0 failed on the node of the last rank; attempt 1 ran with the same node ranks.
    ranks = check_ranks(c, 3, 2)
    for i in range(3):
        ev = events(job / f"node{i}" / "logs")
        assert of(ev, "cycle_ended", cycle=0, end="failed"), [e["event"] for e in ev]
        assert of(ev, "cycle_ended", cycle=1, end="done")
        assert ev[-1]["event"] == "result" and ev[-1]["outcome"] == "succeeded"
    assert not (job / "out0" / "a2_l0.json").exists(), ranks


def test_a_stray_with_another_nnodes_and_one_agent_too_many_are_refused(job):
    release = job / "release"
    c = C10d(job, 2, env={"RELEASE": release})
    c.start_all(2)
    wait_for(lambda: len(list((job / "shared").glob("up_0_*"))) == 4, 60, "the job's ranks")
    stray = c.start(nnodes="3")
    _, err = stray.communicate(timeout=120)
    assert stray.returncode == 2, err
    assert "refused by node rank 0: it runs --nnodes 2 and this agent has --nnodes 3" in err, err
    assert "had not given a node rank yet" in err, err
    # One agent too many, of the job's own shape: admitted, but no node rank is left.
    extra = c.start()
    _, err = extra.communicate(timeout=120)
    assert extra.returncode == 2, err
    assert "every node rank of the job (--nnodes 2) was handed out by the rendezvous already" in err, err
    release.write_text("")
    c.procs.remove(stray)
    c.procs.remove(extra)
    res = c.wait()
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    check_ranks(c, 2, 1)


def test_min_1_of_4_starts_alone_after_the_last_call(job):
    # torch's elastic example, `--nnodes=1:4`, on one machine.
    c = C10d(job, "1:4", extra=["--rdzv-conf", "last_call_timeout=1"])
    c.start()
    ((rc, _, err),) = c.wait()
    assert rc == 0, err
    assert "attempt 0 starts with 1 of up to 4 nodes: no other joined within the last call (1s" in err, err
    assert "node rank(s) 1, 2, 3 take no part in this job" in err, err
    # The last line counts the nodes that ran ranks, not --nnodes' maximum.
    assert "all ranks finished successfully" in err and "all 4 nodes" not in err, err
    ev = events(job / "node0" / "logs")
    assert of(ev, "cycle_ended", cycle=0, end="done"), [e["event"] for e in ev]
    assert [r["WORLD_SIZE"] for r in c.records(0, 0)] == ["2", "2"]
    assert [r["GROUP_RANK"] for r in c.records(0, 0)] == ["0", "0"]


def test_min_2_of_3_starts_with_the_two_present(job):
    c = C10d(job, "2:3", extra=["--rdzv-conf", "last_call_timeout=1"])
    c.start_all(2)
    res = c.wait()
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    assert "attempt 0 starts with 2 of up to 3 nodes" in res[0][2], res[0][2]
    assert "every rank finished successfully (2 of the 3 nodes run ranks)" in res[0][2], res[0][2]
    check_ranks(c, 2, 1)


def test_a_node_that_comes_after_the_last_call_waits_as_a_standby(job):
    release = job / "release"
    c = C10d(job, "1:2", extra=["--rdzv-conf", "last_call_timeout=1"], env={"RELEASE": release})
    c.start_all(1)
    wait_for(lambda: (job / "shared" / "up_0_0").exists(), 60, "the job to start with one node")
    c.start()
    wait_for(lambda: (job / "node1" / "logs").exists() and any(
        e["event"] == "standby" for e in events_so_far(job / "node1" / "logs")), 60,
        "the late agent to wait as a standby")
    release.write_text("")
    res = c.wait()
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    assert c.node_rank(1) == 1
    assert not list((job / "out1").iterdir()), "a standby runs no ranks"
    assert [r["WORLD_SIZE"] for r in c.records(0, 0)] == ["2", "2"]


def events_so_far(logs):
    return [e for d in logs.iterdir() if d.is_dir() for e in read_events(d / "events.jsonl")]


def test_is_host_false_leaves_the_store_to_another_agent(job):
    # torch's `--rdzv-conf is_host=false`: the first agent started does not host, so the second,
    # which binds the endpoint, is node rank 0 and the first is handed node rank 1.
    c = C10d(job, 2)
    c.extra = ["--rdzv-conf", "is_host=false"]
    first = c.start()
    c.extra = []
    second = c.start()
    res = c.wait()
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    assert (c.node_rank(0), c.node_rank(1)) == (1, 0)
    assert "(here)" in res[1][2] and "(here)" not in res[0][2]
    assert first.returncode == second.returncode == 0


def test_no_store_at_the_endpoint_is_a_requeue_not_a_usage_error(job):
    # Nobody hosts the endpoint: the agent cannot be handed a node rank within --join-timeout and
    # exits 75 (requeue), as an agent given --node-rank that cannot reach node rank 0's store.
    c = C10d(job, 2, extra=["--rdzv-conf", "is_host=false", "--join-timeout", "2"])
    c.start()
    ((rc, _, err),) = c.wait()
    assert rc == 75, err
    assert "cannot reach node rank 0's store at 127.0.0.1:" in err, err


def test_nvrx_cycle_info_names_the_nodes_as_they_joined(job):
    # NVRx's cycle info files (--ft-cycle-info-dir) name the active nodes and the standbys: node
    # rank 0 learns them from the join records. Three agents for --nnodes 2:3: the third is a
    # standby. Each names itself as Slurm would (SLURMD_NODENAME).
    c = C10d(job, "2:3", extra=["--rdzv-conf", "last_call_timeout=1", "--cycle-info-dir", "ci"])
    first = c.start(SLURMD_NODENAME="n12")
    wait_for(lambda: listening(c.port) or first.poll() is not None, 60, "the store's host")
    c.start(SLURMD_NODENAME="n3")
    c.start(SLURMD_NODENAME="n7")
    res = c.wait()
    assert [rc for rc, _, _ in res] == [0, 0, 0], [e for _, _, e in res]
    ranks = [c.node_rank(i) for i in range(3)]
    names = {r: n for r, n in zip(ranks, ["n12", "n3", "n7"])}
    # No Slurm job id: NVRx's name has an empty job id, `cycle_info..<attempt>.<cycle>`.
    info = json.loads((job / "ci" / "cycle_info..0.0").read_text())
    # Group ranks 0 and 1 are node ranks 0 and 1; node rank 2 stands by.
    active = sorted([names[0], names[1]], key=lambda n: int(n[1:]))
    assert info["active_nodes"] == f"n[{active[0][1:]},{active[1][1:]}]", info
    assert info["standby_nodes"] == names[2], info
    # The active nodes' group ranks in the order of their names.
    assert info["active_ranks"] == ("0,1" if active[0] == names[0] else "1,0"), info

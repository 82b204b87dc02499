"""Hot spares under faults aimed at the standby (issue 36): a standby is part of the job, so its
departure (SIGTERM), freeze past --node-timeout and loss (SIGKILL) are handled and recorded by the
coordinator (node rank 0), and the training on the active nodes runs on.

Two active agents and one standby (`--nnodes 2:3`, node 2 starts as the standby), real agents on
loopback, real rank processes."""
import json
import os
import signal

from harness import base_env, events, of, start_vigil, wait_for, write
from test_multinode import free_port

# Each rank steps until argument 1, checkpointing its step; it stops at the job's agreed step
# when asked (`should_stop`), so a SIGTERM to an active node ends with the "run me again" status.
TRAIN = """
import os, sys, time, pathlib, vigil
out = pathlib.Path(os.environ["OUT_DIR"])
rank = int(os.environ["RANK"])
ckpt = out / f"ckpt_{rank}"
start = int(ckpt.read_text()) + 1 if ckpt.exists() else 0
(out / f"up_{os.environ['TORCHELASTIC_RESTART_COUNT']}_{rank}").write_text(os.environ["NODE_ID"])
for step in range(start, int(sys.argv[1])):
    time.sleep(0.05)
    tmp = out / f"ckpt_{rank}.tmp"
    tmp.write_text(str(step))
    os.replace(tmp, ckpt)
    if vigil.should_stop(step):
        (out / f"stopped_{rank}").write_text(str(step))
        sys.exit(0)
"""


def start_agents(job, steps, flags=()):
    port = free_port()
    procs = []
    for i in range(3):
        (job / f"node{i}").mkdir()
        args = ["run", "--nnodes", "2:3", "--node-rank", str(i), "--master-addr", "127.0.0.1",
                "--master-port", str(port), "--nproc-per-node", "1", "--max-restarts", "2",
                "--rdzv-id", "sf", "--node-timeout", "3", "--metrics-textfile", str(job / f"node{i}"),
                *flags, "--log-dir", str(job / f"node{i}"), "train.py", str(steps)]
        procs.append(start_vigil(args, cwd=job, env=base_env(OUT_DIR=job, NODE_ID=str(i))))
    return procs


def running(job, procs):
    """Attempt 0's ranks run on nodes 0 and 1 and node 2 stands by."""
    wait_for(lambda: all((job / f"up_0_{r}").exists() for r in range(2)), timeout=90,
             what="attempt 0's ranks")
    assert [(job / f"up_0_{r}").read_text() for r in range(2)] == ["0", "1"]
    wait_for(lambda: of(events(job / "node2"), "standby"), timeout=60, what="the standby")


def finish(procs, which, timeout=180):
    try:
        res = {i: procs[i].communicate(timeout=timeout) for i in which}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return res


def ledger(job):
    return [json.loads(l) for l in
            (job / "node0" / "vigil-job-sf" / "ledger.jsonl").read_text().splitlines()]


def metric(job, node, name):
    """`name`'s value on node `node`'s metrics page as written at its exit."""
    (page,) = (job / f"node{node}").glob("vigil_*.prom")
    for line in page.read_text().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_sigterm_to_the_standby_takes_it_out_and_the_training_runs_on(job):
    write(job / "train.py", TRAIN)
    procs = start_agents(job, 160)
    running(job, procs)
    procs[2].send_signal(signal.SIGTERM)
    res = finish(procs, [0, 1, 2])
    # The active nodes finish the training; no stop was agreed, nothing to requeue.
    assert [procs[0].returncode, procs[1].returncode] == [0, 0], \
        [res[i][1][-2000:] for i in (0, 1)]
    assert all(int((job / f"ckpt_{r}").read_text()) == 159 for r in range(2))
    ev0 = events(job / "node0")
    assert not of(ev0, "stop_triggered") and not of(ev0, "stop_agreed")
    (gone,) = of(ev0, "standby_gone")
    assert gone["node"] == 2 and gone["ready"] == 0, gone
    assert "received SIGTERM" in gone["reason"], gone
    assert "standby node 2 left the job" in res[0][1], res[0][1][-2000:]
    assert "standbys ready now: 0" in res[0][1], res[0][1][-2000:]
    (rec,) = ledger(job)
    assert rec["decision"] == "finished", rec
    assert metric(job, 0, "vigil_spares_ready") == 0.0
    # The standby itself ended as signalled, having run no ranks.
    assert procs[2].returncode == 128 + signal.SIGTERM, res[2][1][-1500:]
    assert not of(events(job / "node2"), "rank_started")


def test_a_sigterm_to_an_active_node_still_stops_the_job_at_one_step(job):
    write(job / "train.py", TRAIN)
    procs = start_agents(job, 100000)
    running(job, procs)
    # Every rank told the agent its step (so it listens for the agreed stop).
    wait_for(lambda: all((job / f"ckpt_{r}").exists() and int((job / f"ckpt_{r}").read_text()) >= 10
                         for r in range(2)), timeout=60, what="steps")
    procs[1].send_signal(signal.SIGTERM)
    res = finish(procs, [0, 1, 2])
    assert [p.returncode for p in procs] == [75, 75, 75], [r[1][-1500:] for r in res.values()]
    stopped = {(job / f"stopped_{r}").read_text() for r in range(2)}
    assert len(stopped) == 1, stopped
    assert not of(events(job / "node0"), "standby_gone")


def test_a_standby_frozen_past_the_node_timeout_is_dropped_and_leaves_when_it_wakes(job):
    write(job / "train.py", TRAIN)
    procs = start_agents(job, 100000)
    running(job, procs)
    procs[2].send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: of(events(job / "node0"), "standby_gone"), timeout=90,
                 what="node rank 0 dropping the frozen standby")
    finally:
        procs[2].send_signal(signal.SIGCONT)
    (gone,) = of(events(job / "node0"), "standby_gone")
    assert gone["node"] == 2 and gone["ready"] == 0, gone
    assert "no sign of life" in gone["reason"], gone
    # Woken, the standby reads that it is out of the job and leaves with the requeue status;
    # the active nodes' training runs on meanwhile.
    out2 = procs[2].communicate(timeout=90)
    assert procs[2].returncode == 75, out2[1][-1500:]
    assert "dropped from the job" in out2[1], out2[1][-1500:]
    assert procs[0].poll() is None and procs[1].poll() is None
    ended = of(events(job / "node2"), "cycle_ended")
    assert ended and "dropped from the job" in json.dumps(ended[-1]), ended
    # With no standby left, losing an active node ends the job to be requeued.
    procs[1].send_signal(signal.SIGKILL)
    res = finish(procs, [0, 1])
    assert procs[0].returncode == 75, res[0][1][-1500:]
    assert not of(events(job / "node0"), "promotion")


def test_a_standby_killed_is_recorded_printed_and_counted_out_of_the_spares(job):
    write(job / "train.py", TRAIN)
    procs = start_agents(job, 160)
    running(job, procs)
    procs[2].send_signal(signal.SIGKILL)
    procs[2].communicate()
    res = finish(procs, [0, 1])
    assert [procs[0].returncode, procs[1].returncode] == [0, 0], \
        [res[i][1][-2000:] for i in (0, 1)]
    (gone,) = of(events(job / "node0"), "standby_gone")
    assert gone["node"] == 2 and gone["ready"] == 0, gone
    assert "node 2" in gone["reason"] and "lost" in gone["reason"], gone
    assert "standbys ready now: 0" in res[0][1], res[0][1][-2000:]
    assert metric(job, 0, "vigil_spares_ready") == 0.0
    # Before the loss, attempt 0's verdict said one standby was ready.
    assert [(r["cycle"], r["ready"]) for r in of(events(job / "node0"), "spares")] == [(0, 1)]


def test_an_allocation_whose_node_rank_0_was_killed_is_recorded_by_a_survivor(job):
    """Item 4: with node rank 0's store, losing node rank 0 loses whoever records the allocation;
    a survivor records it once, so allocation numbers and --max-requeues count it."""
    write(job / "train.py", TRAIN)
    state = job / "state"

    def allocation(n):
        port = free_port()
        procs = []
        for i in range(3):
            d = job / f"a{n}node{i}"
            d.mkdir()
            args = ["run", "--nnodes", "3", "--node-rank", str(i), "--master-addr", "127.0.0.1",
                    "--master-port", str(port), "--nproc-per-node", "1", "--rdzv-id", "r0",
                    "--state-dir", str(state), "--max-requeues", "1", "--node-timeout", "3",
                    "--log-dir", str(d), "train.py", "100000"]
            procs.append(start_vigil(args, cwd=job, env=base_env(OUT_DIR=job, NODE_ID=str(i))))
        wait_for(lambda: all((job / f"up_0_{r}").exists() for r in range(3)), timeout=90,
                 what=f"allocation {n}'s ranks")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].communicate()
        res = finish(procs, [1, 2])
        for r in range(3):
            (job / f"up_0_{r}").unlink()
        return [procs[1].returncode, procs[2].returncode], res

    codes, res = allocation(1)
    assert sorted(codes) == [75, 75], [r[1][-1500:] for r in res.values()]
    recs = [json.loads(l) for l in (state / "ledger.jsonl").read_text().splitlines()]
    assert [(r["allocation"], r["outcome"], r["decision"]) for r in recs] == [(1, "lost", "requeue")], recs
    # The second allocation loses node rank 0 again: two lost in a row, beyond --max-requeues 1.
    codes, res = allocation(2)
    recs = [json.loads(l) for l in (state / "ledger.jsonl").read_text().splitlines()]
    assert [(r["allocation"], r["outcome"], r["decision"]) for r in recs] == \
        [(1, "lost", "requeue"), (2, "lost", "stop")], recs
    # The survivor that recorded it ends as the ledger decided; the other with 75.
    assert sorted(codes) == [1, 75], \
        (codes, [r[1][-1500:] for r in res.values()])


def test_with_the_store_outside_the_job_a_sigterm_to_the_standby_takes_it_out(job):
    """The same departure with `vigil store`: the coordinator hears of it through the store's
    lease queue, not a store of its own."""
    from test_store_service import Service, SECRET
    from test_store_takeover import TRAIN as RELEASED, finish as finish_all, start_agents as agents
    from test_store_takeover import wait_attempt
    write(job / "train.py", RELEASED)
    store = Service(job, env={"VIGIL_STORE_SECRET": SECRET})
    procs = agents(job, store.port, 3, "2:3")
    try:
        wait_attempt(job, 0, 2, timeout=60)
        wait_for(lambda: of(events(job / "node2"), "standby"), timeout=60, what="the standby")
        procs[2].send_signal(signal.SIGTERM)
        procs[2].communicate(timeout=60)
        wait_for(lambda: of(events(job / "node0"), "standby_gone"), timeout=60,
                 what="node rank 0 taking the standby out")
        write(job / "release", "")
        out = finish_all(procs)
        assert [procs[0].returncode, procs[1].returncode] == [0, 0], \
            {i: o[1][-2000:] for i, o in out.items()}
        (gone,) = of(events(job / "node0"), "standby_gone")
        assert gone["node"] == 2 and "received SIGTERM" in gone["reason"], gone
        # The training ran on: one attempt, never restarted.
        assert not (job / "seen_1_0.json").exists()
    finally:
        finish_all(procs, timeout=5)
        store.stop()

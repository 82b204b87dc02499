"""In-process restarts across 2 loopback nodes (issue 32, docs/inprocess.md "Escalation"): what
cannot be recovered in process restarts the whole job, on every node, on the `--max-restarts`
budget, and the event log says why. Real agents, real torch.distributed (gloo), real processes."""
import json
import signal
import sys
from pathlib import Path

import pytest

from harness import base_env, events, of, start_vigil, wait_for, write

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_inprocess import TRAIN, traces  # noqa: E402
from test_multinode import Nodes, free_port  # noqa: E402


def two_nodes(job, mode, *extra, per_node=None):
    """2 nodes x 2 ranks running TRAIN in `mode`, one whole restart allowed."""
    write(job / "train.py", TRAIN)
    (job / "trace").mkdir()
    return Nodes(job, 2, ["train.py", mode], nproc=2, env={"TRACE_DIR": str(job / "trace")},
                 extra=["--in-process-restarts", "2", "--max-restarts", "1", "--rdzv-id", "ipx",
                        "--workers-stop-timeout", "3", *extra], per_node=per_node)


def finished_whole(job, evs):
    """Every node restarted once, whole, and attempt 1's four ranks ended with the same state."""
    for ev in evs:
        assert [e["to_cycle"] for e in of(ev, "restart")] == [1], [e["event"] for e in ev]
        assert ev[-1]["outcome"] == "succeeded", ev[-1]
    done = [l for lines in traces(job / "trace").values() for l in lines if l["event"] == "done"]
    assert len(done) == 4 and {l["step"] for l in done} == {80}, done
    assert all(l["w"] == done[0]["w"] for l in done), done


def declined(ev, why):
    said = of(ev, "in_process_declined")
    assert len(said) == 1 and why in said[0]["reason"], said
    # Named before the attempt ends, as the reason it does.
    assert ev.index(said[0]) < ev.index(of(ev, "restart")[0])
    return said[0]["reason"]


def check_never_trained_again(ev0, ev1):
    """Generation 1 began on both nodes and never trained: node 0's ranks never all came back
    (node 1's own may have: each node records its own), and no node's ranks stepped in it."""
    for ev in (ev0, ev1):
        assert [g["generation"] for g in of(ev, "generation")] == [1]
        assert not of(ev, "generation_stepping")
    assert not of(ev0, "generation_recovered")


def test_a_survivor_on_node0_stuck_in_c_past_the_abort_timeout_restarts_every_node(job):
    """Rank 2 (node 1) is SIGKILLed at step 30 and node 1 begins generation 1; rank 0 (node 0)
    is then in a C call that never returns to Python: node 0's abort timeout restarts the job.

    Ranks 1 and 3 do not come back either: they wait in gloo's all-reduce on rank 0, which
    never closes its connections. With one timeout on both nodes, each would run out within
    a few milliseconds of the other and either could restart the job (seen in CI); node 1's
    is made longer so that node 0's is the one under test."""
    # 20 s: long enough on a loaded machine for a survivor that does come back; rank 0 never does.
    nodes = two_nodes(job, "stuck", per_node=lambda i: ["--abort-timeout", "20" if i == 0 else "300"])
    res = nodes.wait(timeout=600)
    assert [rc for rc, _, _ in res] == [0, 0], [e[-5000:] for _, _, e in res]
    ev0, ev1 = nodes.events(0), nodes.events(1)
    reason = declined(ev0, "abort timeout")
    assert "rank 0 did not come back" in reason, reason
    check_never_trained_again(ev0, ev1)
    finished_whole(job, (ev0, ev1))
    assert "rank 0 did not come back" in res[0][2]


def test_a_second_failure_on_node0_during_the_recovery_restarts_every_node(job):
    """Rank 2 (node 1) is SIGKILLed; rank 1 (node 0) dies after generation 1 was announced and
    before it came back to its wrapper."""
    nodes = two_nodes(job, "recovering")
    res = nodes.wait(timeout=600)
    assert [rc for rc, _, _ in res] == [0, 0], [e[-5000:] for _, _, e in res]
    ev0, ev1 = nodes.events(0), nodes.events(1)
    declined(ev0, "while generation 1 was being recovered")
    check_never_trained_again(ev0, ev1)
    finished_whole(job, (ev0, ev1))
    fails = [l for lines in traces(job / "trace").values() for l in lines if l["event"] == "fail_again"]
    assert [l["rank"] for l in fails] == [1]


@pytest.mark.parametrize("when", ["training", "generation"])
def test_a_lost_node_restarts_the_whole_job_on_the_same_budget(job, when):
    """3 agents, `--nnodes 2:3` (node 2 the standby), in-process restarts on: node 1's agent is
    SIGKILLed while the ranks train, or once node 1 began generation 1 (rank 2 SIGKILLed at
    step 30) and node 0 followed it. The standby takes node 1's place in a whole restart,
    counted on `--max-restarts`; no generation (or no other one) begins."""
    mode = "lost" if when == "training" else "kill"
    write(job / "train.py", TRAIN)
    (job / "trace").mkdir()
    port = free_port()
    procs = []
    for i in range(3):
        (job / f"node{i}").mkdir()
        args = ["run", "--nnodes", "2:3", "--node-rank", str(i), "--master-addr", "127.0.0.1",
                "--master-port", str(port), "--nproc-per-node", "2", "--rdzv-id", "ipl",
                "--in-process-restarts", "2", "--max-restarts", "1", "--workers-stop-timeout", "3",
                "--log-dir", str(job / f"node{i}"), "train.py", mode]
        procs.append(start_vigil(args, cwd=job, env=base_env(TRACE_DIR=str(job / "trace"))))
    try:
        def stepped(rank, step):
            for (rk, _), lines in traces(job / "trace").items():
                if rk == rank and any(l["event"] == "step" and l["step"] >= step for l in lines):
                    return True
            return False
        def followed():
            try:
                return bool(of(events(job / "node0"), "generation"))
            except (FileNotFoundError, ValueError):
                return False
        if when == "training":
            wait_for(lambda: stepped(2, 10) and stepped(0, 10), timeout=300, what="every node stepping")
        else:
            wait_for(followed, timeout=300, what="node 0 following generation 1")
        procs[1].send_signal(signal.SIGKILL)
        procs[1].communicate()
        res = [p.communicate(timeout=300) for p in (procs[0], procs[2])]
        codes = [procs[0].returncode, procs[2].returncode]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert codes == [0, 0], [r[1][-4000:] for r in res]
    ev0 = events(job / "node0")
    assert [g["generation"] for g in of(ev0, "generation")] == ([] if when == "training" else [1])
    assert not of(ev0, "in_process_declined"), "the node's loss is why, as without the flag"
    (ended,) = of(ev0, "cycle_ended", cycle=0)
    assert "node 1" in ended["reason"] and "was lost" in ended["reason"], ended
    assert [e["to_cycle"] for e in of(ev0, "restart")] == [1]
    assert ev0[-1]["outcome"] == "succeeded"
    promos = of(ev0, "promotion")
    assert [(p["lost"], p["standby"]) for p in promos] == [(1, 2)], promos
    (rec,) = [json.loads(l) for l in (job / "node0" / "vigil-job-ipl" / "ledger.jsonl").read_text().splitlines()]
    assert rec["decision"] == "finished" and rec["restarts"] == 1, rec
    done = [l for lines in traces(job / "trace").values() for l in lines if l["event"] == "done"]
    assert len(done) == 4 and {l["step"] for l in done} == {80}, done

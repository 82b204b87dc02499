"""In-process restarts of the chaos soak's own job (bench/chaos_train.py: DDP over gloo, sections,
heartbeats, should_stop, checkpoints) on 2 loopback nodes (docs/reliability.md violation 9): a
rank SIGKILLed on node 1 is replaced alone and every survivor, node 0's too, comes back to
`vigil.restartable` and trains again in generation 1. Real agents, real torch DDP, real processes."""
import json
import os
import signal
import sys
from pathlib import Path

from harness import of, require_torch, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_multinode import Nodes  # noqa: E402

require_torch()

ROOT = Path(__file__).resolve().parents[2]
CHAOS_TRAIN = ROOT / "bench" / "chaos_train.py"
TOTAL = 160
KILL_AT = 40


def records(out, rank):
    try:
        text = (out / "steps" / f"rank{rank}.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(l) for l in text.splitlines() if l.strip()]


def test_a_ddp_rank_killed_on_node1_is_replaced_and_node0_trains_again(job):
    out = job / "chaos"
    for d in ("steps", "ckpt", "ctl"):
        (out / d).mkdir(parents=True)
    env = {"CHAOS_DIR": str(out), "CHAOS_STEPS": str(TOTAL), "CHAOS_STEP_S": "0.05",
           "CHAOS_CKPT_EVERY": "25", "CHAOS_INPROCESS": "1"}
    nodes = Nodes(job, 2, [str(CHAOS_TRAIN)], nproc=2, env=env,
                  extra=["--in-process-restarts", "2", "--max-restarts", "0", "--rdzv-id", "ipddp",
                         "--workers-stop-timeout", "3", "--abort-timeout", "60"])
    try:
        def rank2_at_kill_step():
            recs = records(out, 2)
            return any(r["ev"] == "step" and r["step"] >= KILL_AT for r in recs) and recs
        recs = wait_for(rank2_at_kill_step, timeout=300, what="rank 2 stepping")
        os.kill(recs[-1]["pid"], signal.SIGKILL)
        res = nodes.wait(timeout=400)
    finally:
        nodes.kill()
    assert [rc for rc, _, _ in res] == [0, 0], [e[-4000:] for _, _, e in res]
    ev0, ev1 = nodes.events(0), nodes.events(1)
    for ev in (ev0, ev1):
        assert [g["generation"] for g in of(ev, "generation")] == [1], [e["event"] for e in ev]
        assert of(ev, "generation_recovered"), "every rank of the node came back to its wrapper"
        assert not of(ev, "restart") and not of(ev, "in_process_declined")
        assert ev[-1]["outcome"] == "succeeded", ev[-1]
    for rank in range(4):
        starts = [r for r in records(out, rank) if r["ev"] == "start"]
        assert [s.get("generation") for s in starts][-1] == 1, (rank, starts)
        assert not any("mismatch" in s for s in starts), starts
        assert any(r["ev"] == "finished" for r in records(out, rank)), rank

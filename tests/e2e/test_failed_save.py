"""A rank whose checkpoint save raised is the failure, not the ranks that wait for it (issue 35's
violation 6): real torch DDP over gloo on 2 loopback nodes x 2 ranks. At step AT rank 3 (node 1)
saves where it cannot (`torch.save` raises `RuntimeError`), and its interpreter then takes long to
go (an atexit handler that sleeps, as a process held by its communicators' teardown does), so the
other ranks, inside section "step", wait for it in DDP's all-reduce until their section timeout
runs out, long before rank 3's own heartbeat timeout would. vigil must learn from the rank that it
raised (the shim's exception hook), say so in the events, and name it, not a waiting rank."""
import sys
from pathlib import Path

from harness import of, require_torch, write

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_multinode import Nodes  # noqa: E402

require_torch()

DDP_FAILED_SAVE = r"""
import atexit, os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import vigil

TRACE = os.environ["TRACE_DIR"]
SAVER, AT = int(sys.argv[1]), 15
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(32, 32)
ddp = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 32)
step = 0
while True:
    vigil.should_stop(step)
    if step == AT and rank == SAVER:
        with open(os.path.join(TRACE, "saver"), "w") as f:
            f.write(str(os.getpid()))
        atexit.register(time.sleep, 600)
        torch.save(model.state_dict(), os.path.join(TRACE, "no-such-dir", "ckpt.pt"))
    with vigil.section("step"):
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
    vigil.heartbeat(step)
    step += 1
    time.sleep(0.02)
"""

FLAGS = ["--section-timeouts", "step=6", "--heartbeat-timeout", "120", "--initial-heartbeat-timeout", "120",
         "--max-restarts", "0"]


def test_a_rank_whose_save_raised_is_named_not_the_ranks_waiting_for_it(job):
    write(job / "train.py", DDP_FAILED_SAVE)
    (job / "trace").mkdir()
    nodes = Nodes(job, 2, ["train.py", "3"], nproc=2, env={"TRACE_DIR": str(job / "trace")},
                  extra=[*FLAGS, "--rdzv-id", "failedsave"])
    res = nodes.wait(timeout=300)
    assert all(rc != 0 for rc, _, _ in res), [e[-3000:] for _, _, e in res]
    pid = int((job / "trace" / "saver").read_text())
    ev0, ev1 = nodes.events(0), nodes.events(1)
    # What it was: the rank said it raised, with the exception.
    (raised,) = of(ev1, "rank_raised")
    assert (raised["rank"], raised["pid"]) == (3, pid), raised
    assert "RuntimeError" in raised["error"], raised
    assert not of(ev0, "rank_raised"), of(ev0, "rank_raised")
    # Who it was: the job's hang verdict names the rank that raised, on its node only.
    hangs = of(ev0, "hang") + of(ev1, "hang")
    assert [(h["rank"], h["pid"]) for h in hangs] == [(3, pid)], hangs

"""The hung rank is told from the ranks waiting for it by where their main threads are (issue 35's
violation 4, the rest): the soak's shape, real torch DDP over gloo on 2 loopback nodes x 2 ranks.
At step AT every rank leaves a barrier together; the sleeper (rank 3, node 1) opens section "step"
and sleeps at once, as bench/chaos_train.py's injected() does, and the others open theirs a few
milliseconds later and wait for it in DDP's all-reduce. Nothing in their messages tells them apart
(the others' last message even comes last): only their stacks do."""
import sys
from pathlib import Path

from harness import of, require_torch, write

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_multinode import Nodes  # noqa: E402

require_torch()

DDP_SLEEPER = r"""
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import vigil

TRACE = os.environ["TRACE_DIR"]
SLEEPER, AT = int(sys.argv[1]), 15
rank = int(os.environ["RANK"])
vigil.announce_calculation_on_request()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(32, 32)
ddp = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 32)
step = 0
while True:
    vigil.should_stop(step)
    if step == AT:
        dist.barrier()
        if rank == SLEEPER:
            with open(os.path.join(TRACE, "sleeper"), "w") as f:
                f.write(str(os.getpid()))
            with vigil.section("step"):
                time.sleep(600)
        time.sleep(0.005)
    with vigil.section("step"):
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
    vigil.heartbeat(step)
    step += 1
    time.sleep(0.02)
"""

FLAGS = ["--section-timeouts", "step=6", "--heartbeat-timeout", "6", "--initial-heartbeat-timeout", "120",
         "--max-restarts", "0"]


def test_the_ddp_sleeper_is_named_by_its_stack_not_the_ranks_waiting_in_the_all_reduce(job):
    write(job / "train.py", DDP_SLEEPER)
    (job / "trace").mkdir()
    nodes = Nodes(job, 2, ["train.py", "3"], nproc=2, env={"TRACE_DIR": str(job / "trace")},
                  extra=[*FLAGS, "--rdzv-id", "hangddp"])
    res = nodes.wait(timeout=300)
    assert all(rc != 0 for rc, _, _ in res), [e[-3000:] for _, _, e in res]
    pid = int((job / "trace" / "sleeper").read_text())
    hangs = of(nodes.events(0), "hang") + of(nodes.events(1), "hang")
    assert [(h["rank"], h["pid"]) for h in hangs] == [(3, pid)], hangs
    (h,) = hangs
    assert h["timeout"] in ("heartbeat", {"section": "step"}) and not h["stopped"], h

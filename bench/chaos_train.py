"""The chaos soak's training job (bench/chaos.py): real torch DDP over gloo, rank 0 checkpoints with
tmp+rename every CHAOS_CKPT_EVERY steps and at a stop, every rank resumes from that checkpoint,
stops at the step `vigil.should_stop` agrees, and calls `vigil.mark_finished()` at the end.

Each rank appends what it did to $CHAOS_DIR/steps/rank<R>.jsonl (start, step, saving, saved,
stopped, finished, fault), the job's own account the soak checks vigil's against. Faults that only
the rank itself can do (exit 1, exit 0 early, hang in a section) are asked for through
$CHAOS_DIR/ctl/rank<R>; the rank logs a `fault` record, then does it.

With CHAOS_INPROCESS=1 (a run under `--in-process-restarts`, docs/inprocess.md) the training loop
is a `vigil.restartable` function: a failed rank is replaced alone, the survivors keep their
model, optimizer and step, and the replacement gets them from a survivor (`gen.recover`). Every
rank logs a `start` record at each generation (`generation`, `resumed_from` the step it goes on
from), so the soak can check that nothing was lost or redone.
"""
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import vigil

out = pathlib.Path(os.environ["CHAOS_DIR"])
total = int(os.environ["CHAOS_STEPS"])
step_s = float(os.environ.get("CHAOS_STEP_S", "0.1"))
every = int(os.environ.get("CHAOS_CKPT_EVERY", "25"))
rank = int(os.environ["RANK"])
alloc = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
ckpt = out / "ckpt" / "ckpt.pt"
ctl = out / "ctl" / f"rank{rank}"
log = open(out / "steps" / f"rank{rank}.jsonl", "a", buffering=1)


def rec(ev, **kw):
    kw.update(ev=ev, t=time.time(), alloc=alloc, attempt=attempt, pid=os.getpid())
    log.write(json.dumps(kw) + "\n")


inprocess = os.environ.get("CHAOS_INPROCESS") == "1"


def load():
    """(model, optimizer, the step to go on from), from the checkpoint if there is one."""
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    return model, opt, start


def save(model, opt, step):
    if rank != 0:
        return
    rec("saving", step=step)
    with vigil.section("checkpointing"):
        tmp = ckpt.with_name("ckpt.pt.tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, ckpt)
    rec("saved", step=step)


def injected():
    try:
        want = json.loads(ctl.read_text())
    except (OSError, ValueError):
        return
    if want.get("pid") != os.getpid():
        return
    ctl.unlink()
    rec("fault", kind=want["kind"])
    if want["kind"] == "rank_exit1":
        os._exit(1)
    if want["kind"] == "rank_exit0_early":
        os._exit(0)
    if want["kind"] == "rank_section_hang":
        with vigil.section("step"):
            time.sleep(3600)


def agree(start, **kw):
    """Every rank must go on from the same step: rank 0's view is the job's."""
    agreed = torch.tensor([start])
    dist.broadcast(agreed, 0)
    extra = {} if int(agreed.item()) == start else {"mismatch": f"step {start}, rank 0 {int(agreed.item())}"}
    rec("start", resumed_from=start, node=os.environ.get("SLURMD_NODENAME"), **kw, **extra)


def steps(model, opt, start, on_step=None):
    """Trains from `start`; returns after `mark_finished`, or exits at an agreed stop."""
    ddp = DDP(model)
    x = torch.randn(8, 32)
    for step in range(start, total):
        injected()
        with vigil.section("step"):
            opt.zero_grad()
            ddp(x).pow(2).mean().backward()
            opt.step()
            time.sleep(step_s)
        if on_step:
            on_step(step + 1)
        vigil.heartbeat(step)
        rec("step", step=step)
        if vigil.should_stop(step):
            save(model, opt, step)
            rec("stopped", step=step, stop_step=vigil.stop_step())
            sys.exit(0)
        if step and step % every == 0:
            save(model, opt, step)
    vigil.mark_finished()
    rec("finished", step=total - 1)


if not inprocess:
    dist.init_process_group("gloo")
    model, opt, start = load()
    agree(start)
    steps(model, opt, start)
    dist.destroy_process_group()
    sys.exit(0)

# In-process restarts: what survives a generation lives here, in the process.
kept = None


@vigil.restartable
def train(gen):
    global kept
    dist.init_process_group("gloo")
    if kept is None:
        model, opt, start = load()
        kept = {"model": model.state_dict(), "opt": opt.state_dict(), "step": start}
    kept = gen.recover(kept)
    model = torch.nn.Linear(32, 32)
    model.load_state_dict(kept["model"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt.load_state_dict(kept["opt"])
    agree(kept["step"], generation=gen.generation, replaced=list(gen.replaced))

    def on_step(next_step):
        # The step a survivor goes on from in the next generation: after the last one it did.
        kept.update(model=model.state_dict(), opt=opt.state_dict(), step=next_step)

    steps(model, opt, kept["step"], on_step)
    dist.destroy_process_group()


train()

"""A small multi-rank training job for trying vigil locally, with or without torch.

    vigil run --nproc-per-node 4 --max-restarts 1 examples/toy_train.py --steps 20 --crash-at 5

With torch installed every step is a real gloo all_reduce across the ranks; without it the ranks
only simulate work. Every step sends a heartbeat and runs inside a "step" section through the vigil
shim. `--crash-at N` makes the last rank fail once at step N of the first attempt, to watch vigil
restart the whole job.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python-shim"))
import vigil  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--step-time", type=float, default=0.02)
p.add_argument("--crash-at", type=int, default=-1)
args = p.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

try:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
except ImportError:
    torch = dist = None

loss = 10.0
for step in range(args.steps):
    with vigil.section("step"):
        t0 = time.perf_counter()
        time.sleep(args.step_time)
        if dist is not None:
            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t)
        if attempt == 0 and step == args.crash_at and rank == world - 1:
            print(f"rank {rank}: simulated crash at step {step}", file=sys.stderr, flush=True)
            os._exit(1)
        loss *= 0.9
    vigil.heartbeat(step=step)
    vigil.step_timing(step, time.perf_counter() - t0)
    if rank == 0 and step % 5 == 0:
        print(f"attempt {attempt} step {step} loss {loss:.3f}", flush=True)

if dist is not None:
    dist.destroy_process_group()
vigil.mark_finished()
print(f"rank {rank}: done after {args.steps} steps", flush=True)

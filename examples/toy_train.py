"""A small multi-rank training job for trying vigil locally, with or without torch.

    vigil run --nproc-per-node 4 --max-restarts 1 examples/toy_train.py --steps 20 --crash-at 5

With torch installed every step is a real gloo all_reduce across the ranks; without it the ranks
only simulate work. Every step sends a heartbeat and runs inside a "step" section through the vigil
shim. `--crash-at N` makes the last rank fail once at the start of step N of the first attempt, to
watch vigil restart the whole job.

Checkpoints and resume: each rank writes its state to `<ckpt-dir>/rank<RANK>.json` (tmp file +
rename) every `--ckpt-every` steps and when `vigil.should_stop(step)` says the job's agreed stop
step is reached (then it exits 0). At start each rank loads its checkpoint and goes on from the
step after it, printing `rank R: resumed from step N` (N: the checkpoint's step) or `rank R:
starting at step 0`; so after a restart or a requeue the job continues, it does not start over.
The default `--ckpt-dir` is `toy_ckpt_<TORCHELASTIC_RUN_ID>` next to vigil's run directory (in
`--log-dir`), else in $TMPDIR: a job with an identity (`--rdzv-id`, a Slurm job id) finds its
checkpoints again in the next allocation, a one-node run without one starts afresh.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python-shim"))
import vigil  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--step-time", type=float, default=0.02)
p.add_argument("--crash-at", type=int, default=-1)
p.add_argument("--ckpt-dir", default=None, help="where each rank's checkpoint goes (see above)")
p.add_argument("--ckpt-every", type=int, default=5, help="also checkpoint every N steps (0: only on stop)")
p.add_argument(
    "--ignore-stop-rank", type=int, default=-1, help="this rank never stops when asked (to test escalation)"
)
args = p.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def default_ckpt_dir():
    run_dir = os.environ.get("VIGIL_RUN_DIR")
    base = os.path.dirname(os.path.abspath(run_dir)) if run_dir else tempfile.gettempdir()
    return os.path.join(base, "toy_ckpt_" + os.environ.get("TORCHELASTIC_RUN_ID", "none"))


ckpt_dir = args.ckpt_dir or default_ckpt_dir()
ckpt_path = os.path.join(ckpt_dir, "rank%d.json" % rank)


def save(step, loss):
    with vigil.section("checkpointing"):
        os.makedirs(ckpt_dir, exist_ok=True)
        tmp = "%s.tmp.%d" % (ckpt_path, os.getpid())
        with open(tmp, "w") as f:
            json.dump({"step": step, "loss": loss}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, ckpt_path)


def load():
    """(the step to run next, loss) from this rank's checkpoint, or (0, initial loss)."""
    try:
        with open(ckpt_path) as f:
            ck = json.load(f)
        step, loss = int(ck["step"]), float(ck["loss"])
    except FileNotFoundError:
        print(f"rank {rank}: starting at step 0", flush=True)
        return 0, 10.0
    print(f"rank {rank}: resumed from step {step}", flush=True)
    return step + 1, loss


start, loss = load()

try:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
except ImportError:
    torch = dist = None


def leave(code):
    if dist is not None:
        dist.destroy_process_group()
    sys.exit(code)


for step in range(start, args.steps):
    if attempt == 0 and step == args.crash_at and rank == world - 1:
        # At the start of the step, so every rank's last checkpoint is from before it.
        print(f"rank {rank}: simulated crash at step {step}", file=sys.stderr, flush=True)
        os._exit(1)
    with vigil.section("step"):
        t0 = time.perf_counter()
        time.sleep(args.step_time)
        if dist is not None:
            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t)
        loss *= 0.9
    vigil.heartbeat(step=step)
    vigil.step_timing(step, time.perf_counter() - t0)
    if rank == 0 and step % 5 == 0:
        print(f"attempt {attempt} step {step} loss {loss:.3f}", flush=True)
    if vigil.should_stop(step) and rank != args.ignore_stop_rank:
        save(step, loss)
        print(f"rank {rank}: stopped at step {step} ({vigil.stop_reason()}), checkpoint saved", flush=True)
        leave(0)
    if args.ckpt_every > 0 and (step + 1) % args.ckpt_every == 0:
        save(step, loss)

if start < args.steps and args.steps % max(args.ckpt_every, 1) != 0:
    save(args.steps - 1, loss)  # the periodic save did not land on the last step
vigil.mark_finished()
print(f"rank {rank}: done after {args.steps} steps", flush=True)
leave(0)

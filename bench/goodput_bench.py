#!/usr/bin/env python3
"""`vigil goodput` against the job's own accounting, on a real torch DDP job with a fault injector.

    cargo build && python3 bench/goodput_bench.py [--steps 2000] [--kill-every 20] [--seed 1]

The job (issue 33's goodput check): 2 ranks, DistributedDataParallel over gloo, steps of 50 ms,
a checkpoint every 100 steps (rank 0, in a `checkpointing` section) that every attempt resumes
from; `--steps` steps in all, then every rank exits 0. The injector SIGKILLs a random rank every
`--kill-every` seconds while the job runs. vigil runs with its default restart back-off.

The job's own accounting: each rank logs every step it finishes (attempt, step, its step time);
the kept steps are the `--steps` the job finished with (steps redone after a restart count once),
the median step time is rank 0's over every step it took, and the wall time is `vigil run`'s own,
from its start to its exit. Job goodput = kept steps x median step time / wall. The table gives
both figures, the difference in points, the restarts and their back-offs.

On a loaded machine where torch's import and gloo's start-up take most of 20 s, `--kill-after S`
kills a random rank once per attempt, S seconds after its first step, instead (attempts that make
progress, save some of it and lose the rest).
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TRAIN = r"""
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import vigil

out = os.environ["OUT_DIR"]
total = int(os.environ["TOTAL_STEPS"])
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
with open(os.path.join(out, f"pid.{rank}"), "w") as f:
    f.write(str(os.getpid()))
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = os.path.join(out, "ckpt.pt")
step = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step = state["step"]
log = open(os.path.join(out, f"steps.{rank}"), "a", buffering=1)
x = torch.randn(32, 64)
while step < total:
    t0 = time.monotonic()
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    time.sleep(max(0.0, 0.05 - (time.monotonic() - t0)))
    step += 1
    took = time.monotonic() - t0
    log.write(f"{attempt} {step} {took:.6f} {time.time():.3f}\n")
    vigil.heartbeat(step=step)
    if step % 100 == 0 and rank == 0:
        with vigil.section("checkpointing"):
            tmp = ckpt + ".tmp"
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
    if step % 100 == 0:
        dist.barrier()
dist.barrier()
dist.destroy_process_group()
"""


def vigil_bin(given=None):
    for p in (given, os.environ.get("VIGIL_BIN"), REPO / "target/release/vigil", REPO / "target/debug/vigil"):
        if p and os.access(p, os.X_OK):
            return str(Path(p).resolve())
    sys.exit("build vigil first: cargo build")


def injector(out: Path, proc, every: float, seed: int, kills: list, after: float = 0.0, max_kills: int = 0):
    """SIGKILLs a random rank while `proc` (vigil) runs: every `every` seconds; or, with `after`,
    once per attempt when it has been stepping for `after` seconds (rank 0's step log), at most
    `max_kills` times (a loaded machine whose start-up takes most of 20 s still gets attempts
    that make and lose progress)."""
    rng = random.Random(seed)
    killed = set()
    next_at = time.monotonic() + every
    while proc.poll() is None and not (max_kills and len(kills) >= max_kills):
        time.sleep(0.1)
        if after:
            first = {}
            try:
                for line in (out / "steps.0").read_text().splitlines():
                    f = line.split()
                    if len(f) == 4:
                        first.setdefault(int(f[0]), float(f[3]))
            except OSError:
                continue
            if not first:
                continue
            attempt = max(first)
            if attempt in killed or time.time() - first[attempt] < after:
                continue
            killed.add(attempt)
        elif time.monotonic() < next_at:
            continue
        else:
            next_at += every
        rank = rng.randrange(2)
        try:
            pid = int((out / f"pid.{rank}").read_text())
            os.kill(pid, signal.SIGKILL)
            kills.append((time.time(), rank))
        except (OSError, ValueError):
            pass


def run_job(vigil: str, out: Path, env: dict, total: int, kill_every: float, seed: int, timeout: float,
            after: float = 0.0, max_kills: int = 0):
    """Runs the job under vigil with the injector; returns the figures (see the module doc)."""
    (out / "train.py").write_text(TRAIN)
    env = dict(env, OUT_DIR=str(out), TOTAL_STEPS=str(total))
    cmd = [vigil, "run", "--nproc-per-node", "2", "--max-restarts", "100", "--log-dir", str(out / "logs"),
           "train.py"]
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kills = []
    th = threading.Thread(target=injector, args=(out, proc, kill_every, seed, kills, after, max_kills),
                          daemon=True)
    th.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise RuntimeError(f"the job did not end within {timeout} s:\n{stderr[-3000:]}")
    wall = time.time() - t0
    th.join(timeout=5)
    if proc.returncode != 0:
        raise RuntimeError(f"the job failed ({proc.returncode}):\n{stderr[-3000:]}")
    rows = [l.split() for l in (out / "steps.0").read_text().splitlines() if l.strip()]
    finished = max(int(r[1]) for r in rows)
    median = statistics.median(float(r[2]) for r in rows)
    g = subprocess.run([vigil, "goodput", str(out / "logs"), "--json"], cwd=out, env=env,
                       capture_output=True, text=True, timeout=120)
    if g.returncode != 0:
        raise RuntimeError(f"vigil goodput failed: {g.stderr}")
    gp = json.loads(g.stdout)
    events = [json.loads(l) for d in (out / "logs").glob("vigil_*")
              for l in (d / "events.jsonl").read_text().splitlines() if l.strip()]
    restarts = [e for e in events if e["event"] == "restart"]
    return {
        "wall_s": wall,
        "kept_steps": finished,
        "median_step_s": median,
        "job_fraction": finished * median / wall,
        "vigil_fraction": gp["goodput_fraction"],
        "vigil": gp,
        "kills": kills,
        "restarts": len(restarts),
        "restart_records": restarts,
        "attempt_steps": [(int(r[0]), int(r[1])) for r in rows],
        "backoff_s": sum(e.get("backoff_ms", 0) for e in restarts) / 1000,
        "stdout": stdout,
        "stderr": stderr,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--kill-every", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kill-after", type=float, default=0.0,
                    help="instead: kill once per attempt, this long after its first step")
    ap.add_argument("--max-kills", type=int, default=0, help="at most this many kills (0: no limit)")
    ap.add_argument("--vigil", default=None)
    args = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="goodput_bench_") as d:
        env = dict(os.environ, PYTHON_EXEC=sys.executable, TMPDIR=d)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python-shim"), env.get("PYTHONPATH")]))
        r = run_job(vigil_bin(args.vigil), Path(d), env, args.steps, args.kill_every, args.seed, 3600,
                    args.kill_after, args.max_kills)
    b = r["vigil"]["breakdown"]
    print(f"{'wall':>8} {'kills':>5} {'restarts':>8} {'back-off':>8} {'kept':>6} {'median':>8} "
          f"{'job':>7} {'vigil':>7} {'diff':>6}")
    print(f"{r['wall_s']:>7.1f}s {len(r['kills']):>5} {r['restarts']:>8} {r['backoff_s']:>7.1f}s "
          f"{r['kept_steps']:>6} {r['median_step_s']:>7.4f}s {100 * r['job_fraction']:>6.1f}% "
          f"{100 * r['vigil_fraction']:>6.1f}% {100 * (r['vigil_fraction'] - r['job_fraction']):>+6.1f}")
    print("vigil's breakdown: " + ", ".join(f"{k} {v:.1f}s" for k, v in b.items()))


if __name__ == "__main__":
    main()

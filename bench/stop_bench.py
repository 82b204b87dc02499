#!/usr/bin/env python3
"""Stopping every rank at one step: how fast the job agrees, what it costs per step, how much
time is left at the end. Prints a markdown table (docs/benchmarks.md).

    cargo build --release && python3 bench/stop_bench.py [--nodes 4] [--nproc 2] [--reps 5]

1. Trigger to every rank knowing the stop step: N agents on loopback (separate nodes), R ranks
   each, stepping every --step-ms. SIGTERM goes to one agent (node rank N-1, not the store's
   node); each agent's `stop_agreed` record and each rank's first poll that sees the step are
   timed against the moment the signal was sent. Target: 50 ms to every agent.
2. Steps of work lost: for every rank, the steps it trained after its checkpoint (it checkpoints
   at the agreed step and exits). Target: 0.
3. Slack at the allocation's end: one agent with --end-time (now + --end-s) and --stop-lead; the
   seconds between the last rank's exit and the end, against the lead asked.
4. Per-step cost, next to NeMo's approach (rank 0 catches SIGTERM, every step ends with a torch
   broadcast of the flag): `vigil.should_stop(step)` against `dist.broadcast` of one int over
   gloo among the same ranks (torch needed; the row is skipped without it).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from multinode_bench import free_port, vigil_bin  # noqa: E402

RANK = """
import json, os, sys, time, pathlib
import vigil
out = pathlib.Path(os.environ["OUT_DIR"])
rank = int(os.environ["RANK"])
step_s = float(sys.argv[1])
(out / f"up_{rank}").write_text("1")
step, learned = 0, None
while True:
    step += 1
    time.sleep(step_s)
    stop = vigil.should_stop(step)
    if learned is None and vigil.stop_step() is not None:
        learned = time.time()
    if stop:
        (out / f"done_{rank}.json").write_text(json.dumps(
            {"ckpt": step, "last": step, "learned": learned, "exit": time.time()}))
        sys.exit(0)
"""

COST = """
import os, time
import vigil
n = 20000
t = time.perf_counter()
for i in range(n):
    vigil.should_stop(i)
vig = (time.perf_counter() - t) / n
try:
    import torch, torch.distributed as dist
except ImportError:
    torch = None
bc = None
if torch is not None:
    dist.init_process_group("gloo")
    flag = torch.tensor([0])
    for _ in range(50):
        dist.broadcast(flag, 0)
    m = 2000
    t = time.perf_counter()
    for _ in range(m):
        dist.broadcast(flag, 0)
    bc = (time.perf_counter() - t) / m
    dist.destroy_process_group()
if int(os.environ["RANK"]) == 0:
    open(os.path.join(os.environ["OUT_DIR"], "cost.txt"), "w").write(f"{vig} {bc}")
"""


def env_for(d):
    shim = str(REPO / "python-shim")
    return dict(os.environ, OUT_DIR=str(d), PYTHON_EXEC=sys.executable,
                PYTHONPATH=os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")])))


def events(logs):
    (f,) = logs.glob("vigil_*/events.jsonl")
    return [json.loads(line) for line in f.read_text().splitlines()]


def agreement(nodes, nproc, step_s, vigil):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "rank.py").write_text(RANK)
        port, procs = free_port(), []
        for i in range(nodes):
            (d / f"node{i}").mkdir()
            procs.append(subprocess.Popen(
                [vigil, "run", "--nnodes", str(nodes), "--node-rank", str(i), "--master-addr", "127.0.0.1",
                 "--master-port", str(port), "--nproc-per-node", str(nproc), "--log-dir", str(d / f"node{i}"),
                 "rank.py", str(step_s)],
                cwd=d, env=env_for(d), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        world = nodes * nproc
        deadline = time.time() + 60
        while len(list(d.glob("up_*"))) < world:
            if time.time() > deadline:
                raise SystemExit("ranks did not start")
            time.sleep(0.01)
        time.sleep(1.0)  # every rank has reported a few steps
        sent = time.time()
        procs[-1].send_signal(signal.SIGTERM)
        errs = [p.communicate(timeout=120)[1] for p in procs]
        if any(p.returncode != 75 for p in procs):
            raise SystemExit("a run did not stop at a step:\n" + "\n".join(errs))
        agreed = [next(e["ts"] for e in events(d / f"node{i}") if e["event"] == "stop_agreed") for i in range(nodes)]
        done = [json.loads((d / f"done_{r}.json").read_text()) for r in range(world)]
        if len({x["ckpt"] for x in done}) != 1:
            raise SystemExit(f"ranks checkpointed at different steps: {done}")
        lost = max(x["last"] - x["ckpt"] for x in done)
        return max(agreed) - sent, max(x["learned"] for x in done) - sent, lost


def slack(end_s, lead, step_s, vigil):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "rank.py").write_text(RANK)
        end = time.time() + end_s
        p = subprocess.run([vigil, "run", "--nproc-per-node", "2", "--log-dir", str(d / "logs"), "--stop-lead",
                            str(lead), "--end-time", f"{end:.3f}", "rank.py", str(step_s)],
                           cwd=d, env=env_for(d), capture_output=True, text=True, timeout=end_s + 60)
        if p.returncode != 75:
            raise SystemExit("the end-time run did not stop at a step:\n" + p.stderr)
        last_exit = max(json.loads((d / f"done_{r}.json").read_text())["exit"] for r in range(2))
        return end - last_exit


def cost(nproc, vigil):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "cost.py").write_text(COST)
        p = subprocess.run([vigil, "run", "--nproc-per-node", str(nproc), "--log-dir", str(d / "logs"), "cost.py"],
                           cwd=d, env=env_for(d), capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise SystemExit("the cost run failed:\n" + p.stderr)
        vig, bc = (d / "cost.txt").read_text().split()
        return float(vig), (None if bc == "None" else float(bc))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--end-s", type=float, default=15.0)
    ap.add_argument("--lead", type=float, default=5.0)
    a = ap.parse_args()
    vigil = vigil_bin()
    step_s = a.step_ms / 1000
    runs = [agreement(a.nodes, a.nproc, step_s, vigil) for _ in range(a.reps)]
    agents, ranks, lost = zip(*runs)
    slacks = [slack(a.end_s, a.lead, step_s, vigil) for _ in range(max(1, a.reps // 2))]
    vig, bc = cost(a.nproc * 2, vigil)
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.1f} ms | {max(xs) * 1e3:.1f} ms"
    print(f"{a.nodes} nodes x {a.nproc} ranks on loopback, steps of {a.step_ms:.0f} ms, {a.reps} runs, {vigil}")
    print("| measure | median | max |")
    print("|---|---|---|")
    print(f"| SIGTERM on one node to the stop step agreed on every node | {ms(agents)} |")
    print(f"| SIGTERM to every rank knowing the stop step (at its next step) | {ms(ranks)} |")
    print(f"| steps of work lost (trained after the checkpoint) | {statistics.median(lost)} | {max(lost)} |")
    print(f"| seconds left at the allocation's end, --stop-lead {a.lead:g} | "
          f"{statistics.median(slacks):.2f} s | min {min(slacks):.2f} s |")
    print(f"| per step: `vigil.should_stop(step)` | {vig * 1e6:.1f} us | |")
    if bc is not None:
        print(f"| per step: NeMo's flag broadcast (`dist.broadcast`, gloo, {a.nproc * 2} ranks) | {bc * 1e6:.1f} us | |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Time from a rank's crash on one node to every rank on every node running again.

N agents (default 4) run on loopback as separate nodes with explicit flags, R ranks each (default
2). In attempt 0 the last rank of the last node crashes once every rank is up; every other rank
sleeps and is stopped. Each rank writes time.time() as its first statement, so "running" includes
starting the Python interpreter. Prints a table of medians and maxima over --reps runs.

    cargo build --release && python3 bench/multinode_bench.py [--nodes 4] [--nproc 2] [--reps 5]

Columns: the verdict reaching every agent (its `cycle_ended` record), and every rank of attempt 1
running. Target: within 1 s on 4 nodes.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RANK = """
import os, sys, time, pathlib
t = time.time()
out = pathlib.Path(os.environ["OUT_DIR"])
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
world = int(os.environ["WORLD_SIZE"])
(out / f"start_{rank}_{attempt}").write_text(repr(t))
if attempt == 0:
    if rank == world - 1:
        while len(list(out.glob("start_*_0"))) < world:
            time.sleep(0.002)
        (out / "crash").write_text(repr(time.time()))
        os._exit(1)
    time.sleep(300)
"""


def vigil_bin():
    for p in (os.environ.get("VIGIL_BIN"), REPO / "target/release/vigil", REPO / "target/debug/vigil"):
        if p and os.access(p, os.X_OK):
            return str(p)
    sys.exit("build vigil first: cargo build --release")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(nodes, nproc, vigil):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "rank.py").write_text(RANK)
        port = free_port()
        env = dict(os.environ, OUT_DIR=str(d), PYTHON_EXEC=sys.executable)
        procs = []
        for i in range(nodes):
            logs = d / f"node{i}"
            logs.mkdir()
            procs.append(subprocess.Popen(
                [vigil, "run", "--nnodes", str(nodes), "--node-rank", str(i), "--master-addr", "127.0.0.1",
                 "--master-port", str(port), "--nproc-per-node", str(nproc), "--max-restarts", "1",
                 "--log-dir", str(logs), "rank.py"],
                cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        errs = [p.communicate(timeout=120)[1] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit("a run failed:\n" + "\n".join(errs))
        crash = float((d / "crash").read_text())
        world = nodes * nproc
        restarted = max(float((d / f"start_{r}_1").read_text()) for r in range(world))
        seen = []
        for i in range(nodes):
            (ev_file,) = (d / f"node{i}").glob("vigil_*/events.jsonl")
            ev = [json.loads(line) for line in ev_file.read_text().splitlines()]
            seen.append(next(e["ts"] for e in ev if e["event"] == "cycle_ended" and e["cycle"] == 0))
        return max(seen) - crash, restarted - crash


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    vigil = vigil_bin()
    runs = [one_run(a.nodes, a.nproc, vigil) for _ in range(a.reps)]
    verdict = [r[0] for r in runs]
    running = [r[1] for r in runs]
    print(f"{a.nodes} nodes x {a.nproc} ranks on loopback, {a.reps} runs, {vigil}")
    print("| measure | median | max |")
    print("|---|---|---|")
    print(f"| crash to the verdict on every node | {statistics.median(verdict) * 1e3:.1f} ms "
          f"| {max(verdict) * 1e3:.1f} ms |")
    print(f"| crash to every rank on every node running again | {statistics.median(running) * 1e3:.1f} ms "
          f"| {max(running) * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Hot spares: time from an active agent's SIGKILL to every rank running again with the standby.

N active agents plus S standbys (default 4 + 1) on loopback, `--nnodes N:N+S`, R ranks each (default
1). Once every rank of attempt 0 is up, the agent of node rank 1 is SIGKILLed; its slot goes to a
standby. Each rank writes time.time() as its first statement, so "running" includes starting the
Python interpreter. Prints medians and maxima over --reps runs.

    cargo build --release && python3 bench/spares_bench.py [--nodes 4] [--spares 1] [--nproc 1] [--reps 5]
        [--outside] [--victim 1] [--node-timeout 30]

With --outside the job's store is `vigil store --listen` outside the job and every agent runs with
`--rdzv-conf is_host=false` (docs/store.md, "The store outside the job"); --victim 0 then kills
node rank 0's agent, the coordinator, whose work another agent takes over.

Target (issue 13): within 1 s on 4+1 agents; issue 31: node rank 0's loss with the store outside
in about the same time.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multinode_bench import free_port, vigil_bin  # noqa: E402

RANK = """
import os, time, pathlib
t = time.time()
out = pathlib.Path(os.environ["OUT_DIR"])
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
(out / f"start_{rank}_{attempt}").write_text(repr(t))
if attempt == "0":
    time.sleep(300)
"""


SECRET = "bench-secret-0123456789abcdef"


def store_service(vigil, d):
    """`vigil store --listen 127.0.0.1:0`: the process and its port."""
    p = subprocess.Popen([vigil, "store", "--listen", "127.0.0.1:0"], cwd=d, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=dict(os.environ, VIGIL_STORE_SECRET=SECRET))
    line = p.stdout.readline()
    if not line.startswith("listening on "):
        raise SystemExit(f"vigil store did not start: {line!r}")
    return p, int(line.rsplit(":", 1)[1])


def one_run(nodes, spares, nproc, vigil, outside=False, victim=1, node_timeout=30):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "rank.py").write_text(RANK)
        port = free_port()
        env = dict(os.environ, OUT_DIR=str(d), PYTHON_EXEC=sys.executable)
        extra = ["--node-timeout", str(node_timeout)]
        service = None
        if outside:
            service, port = store_service(vigil, d)
            env["VIGIL_STORE_SECRET"] = SECRET
            extra += ["--rdzv-conf", "is_host=false"]
        procs = []
        for i in range(nodes + spares):
            logs = d / f"node{i}"
            logs.mkdir()
            procs.append(subprocess.Popen(
                [vigil, "run", "--nnodes", f"{nodes}:{nodes + spares}", "--node-rank", str(i),
                 "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", str(nproc),
                 "--max-restarts", "1", "--workers-stop-timeout", "2", "--log-dir", str(logs), *extra,
                 "rank.py"],
                cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        world = nodes * nproc
        deadline = time.monotonic() + 60
        while len(list(d.glob("start_*_0"))) < world:
            if time.monotonic() > deadline:
                raise SystemExit("attempt 0 did not start")
            time.sleep(0.002)
        killed = time.time()
        procs[victim].send_signal(signal.SIGKILL)
        errs = [p.communicate(timeout=120)[1] for p in procs]
        if service:
            service.terminate()
            service.communicate(timeout=30)
        if any(p.returncode for i, p in enumerate(procs) if i != victim):
            raise SystemExit("a run failed:\n" + "\n".join(errs))
        return max(float((d / f"start_{r}_1").read_text()) for r in range(world)) - killed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--spares", type=int, default=1)
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--outside", action="store_true", help="the store outside the job (vigil store)")
    ap.add_argument("--victim", type=int, default=1, help="the node rank whose agent is killed")
    ap.add_argument("--node-timeout", type=int, default=30)
    a = ap.parse_args()
    vigil = vigil_bin()
    runs = [one_run(a.nodes, a.spares, a.nproc, vigil, a.outside, a.victim, a.node_timeout)
            for _ in range(a.reps)]
    where = "outside the job (vigil store)" if a.outside else "hosted by node rank 0"
    print(f"{a.nodes}+{a.spares} agents x {a.nproc} rank(s) on loopback, the store {where}, "
          f"--node-timeout {a.node_timeout}, {a.reps} runs, {vigil}")
    print("| measure | median | max |")
    print("|---|---|---|")
    print(f"| SIGKILL of node rank {a.victim}'s agent to every rank running again, the standby in its place "
          f"| {statistics.median(runs) * 1e3:.1f} ms | {max(runs) * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()

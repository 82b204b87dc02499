#!/usr/bin/env python3
"""Distinct section names: the agent's work per batch of 5,000 new names stays flat.

    python3 bench/sections_bench.py [--vigil target/release/vigil] [--names 20000] [--batch 5000]

One rank opens and closes `--names` sections, each under a name of its own, in batches of
`--batch`, under `--heartbeat-timeout 600 --section-timeouts step=600` (so vigil watches and waits
to calculate; `step` never closes). After each batch the rank heartbeats, sleeps 0.3 s (the agent
drains its socket) and says so; the bench samples the agent's CPU time (/proc/<pid>/stat) then.
Printed per batch: the rank's wall time to send it (the socket pushes back when the agent is
slower) and the agent's CPU seconds spent on it. Field finding 19 saw 0.7, 2.4, 5.4, 13 s for
four batches of 5,000; flat is the goal. Agent and rank share this machine's cores.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIM = REPO / "python-shim"

RANK = r"""
import os, sys, time
import vigil
names, batch, marks = int(os.environ["NAMES"]), int(os.environ["BATCH"]), os.environ["MARKS"]
vigil.heartbeat()
i = 0
while i < names:
    t0 = time.perf_counter()
    for j in range(i, min(names, i + batch)):
        n = "data-%06d" % j
        vigil.start_section(n)
        vigil.end_section(n)
    i += batch
    vigil.heartbeat()
    took = time.perf_counter() - t0
    time.sleep(0.3)
    with open(marks, "a") as f:
        f.write("%r\n" % took)
"""


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vigil", default=str(REPO / "target" / "release" / "vigil"))
    ap.add_argument("--names", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=5000)
    a = ap.parse_args()
    a.vigil = os.path.abspath(a.vigil)
    if not os.access(a.vigil, os.X_OK):
        sys.exit(f"{a.vigil} not found: run `cargo build --release -p vigil` first")
    with tempfile.TemporaryDirectory(prefix="sections_bench_") as work:
        d = Path(work)
        (d / "rank.py").write_text(RANK)
        marks = d / "marks"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM_", "VIGIL_"))}
        env.update(PYTHON_EXEC=sys.executable, NAMES=str(a.names), BATCH=str(a.batch), MARKS=str(marks),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(SHIM), env.get("PYTHONPATH")])))
        p = subprocess.Popen([a.vigil, "run", "--nproc-per-node", "1", "--calculate-timeouts", "--heartbeat-timeout", "600",
                              "--section-timeouts", "step=600", "--max-restarts", "0",
                              "--log-dir", str(d / "logs"), str(d / "rank.py")],
                             cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        cpus, seen = [], 0
        cpu_prev = 0.0
        while p.poll() is None:
            try:
                cpu = cpu_s(p.pid)
            except OSError:
                break
            n = len(marks.read_text().splitlines()) if marks.exists() else 0
            if n > seen:
                cpus.append(cpu - cpu_prev)
                cpu_prev, seen = cpu, n
            time.sleep(0.01)
        _, err = p.communicate(timeout=120)
        sends = [float(l) for l in marks.read_text().splitlines()] if marks.exists() else []
        if p.returncode != 0 or len(sends) * a.batch < a.names:
            sys.exit(f"the run failed (exit {p.returncode}, {len(sends)} batches): {err[-2000:]}")
        print(f"vigil distinct section names ({a.vigil}; {a.names} names in batches of {a.batch}, "
              f"{os.cpu_count()} CPUs shared)")
        print()
        print("| batch | names so far | rank send time | agent CPU |")
        print("|---|---|---|---|")
        for i, s in enumerate(sends):
            c = f"{cpus[i]:.2f} s" if i < len(cpus) else "-"
            print(f"| {i + 1} | {min(a.names, (i + 1) * a.batch)} | {s:.2f} s | {c} |")
        notice = [l for l in err.splitlines() if "distinct section names" in l]
        print()
        print(f"notice: {notice[0] if notice else 'none'}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Heartbeat flood: the agent's memory, CPU and hang detection while 8 ranks heartbeat flat out.

    python3 bench/heartbeat_flood_bench.py [--vigil target/release/vigil] [--seconds 60] [--flooders 8]

`--flooders` ranks call `vigil.heartbeat()` in a tight loop for `--seconds`; one more rank
heartbeats every 50 ms and goes silent 2 s before the end under `--heartbeat-timeout 2`, so its
hang falls due as the flood ends and stops the job. Each flooder counts its calls and the bytes
its socket really accepted (the shim drops a heartbeat when the agent is behind) until the SIGTERM
that stops the job. Printed: the agent's RSS 2 s after the start, at the end and its maximum
(/proc/<pid>/status), its CPU share over the flood (/proc/<pid>/stat utime+stime), heartbeats
accepted by the kernel per second and heartbeat calls per second (all flooders), and how late the
quiet rank's hang was acted on (the `hang` event's time minus its deadline, last heartbeat + the
limit the agent applied).
Agent and ranks share this machine's cores.
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
import json, os, signal, sys, time
import vigil
out = os.environ["OUT"]
lr = int(os.environ["LOCAL_RANK"])
start_at, seconds = float(os.environ["START_AT"]), float(os.environ["SECONDS"])
vigil.heartbeat()
if lr == int(os.environ["FLOODERS"]):
    while time.time() < start_at + seconds - 2:
        vigil.heartbeat()
        time.sleep(0.05)
    vigil.heartbeat()
    open(os.path.join(out, "last"), "w").write(repr(time.time()))
    time.sleep(600)

class Counting:
    __slots__ = ("s", "n")
    def __init__(self, s):
        self.s, self.n = s, 0
    def send(self, data, flags=0):
        k = self.s.send(data, flags)
        self.n += k
        return k
    def __getattr__(self, name):
        return getattr(self.s, name)

counting = Counting(vigil._sock)
vigil._sock = counting
calls = 0

def on_term(sig, frame):
    json.dump({"calls": calls, "bytes": counting.n, "seconds": time.time() - start_at},
              open(os.path.join(out, "out_%d.json" % lr), "w"))
    os._exit(0)

signal.signal(signal.SIGTERM, on_term)
while time.time() < start_at:
    vigil.heartbeat()
    time.sleep(0.01)
hb = vigil.heartbeat
while True:
    for _ in range(1000):
        hb()
    calls += 1000
"""


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vigil", default=str(REPO / "target" / "release" / "vigil"))
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--flooders", type=int, default=8)
    a = ap.parse_args()
    a.vigil = os.path.abspath(a.vigil)
    if not os.access(a.vigil, os.X_OK):
        sys.exit(f"{a.vigil} not found: run `cargo build --release -p vigil` first")
    with tempfile.TemporaryDirectory(prefix="flood_bench_") as work:
        d = Path(work)
        (d / "rank.py").write_text(RANK)
        start_at = time.time() + 2.0 + 0.2 * a.flooders
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM_", "VIGIL_"))}
        env.update(PYTHON_EXEC=sys.executable, OUT=str(d), START_AT=repr(start_at), SECONDS=str(a.seconds),
                   FLOODERS=str(a.flooders),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(SHIM), env.get("PYTHONPATH")])))
        ev_path = d / "events.jsonl"
        p = subprocess.Popen([a.vigil, "run", "--nproc-per-node", str(a.flooders + 1), "--heartbeat-timeout", "2",
                              "--max-restarts", "0", "--log-dir", str(d / "logs"), "--event-log", str(ev_path),
                              str(d / "rank.py")], cwd=d, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(max(0.0, start_at - time.time()))
        cpu0, t0 = cpu_s(p.pid), time.time()
        time.sleep(2.0)
        rss_start = rss_kb(p.pid)
        rss_max = rss_start
        rss_end, cpu1, t1 = rss_start, cpu0, t0
        while time.time() < start_at + a.seconds + 30 and p.poll() is None:
            if any(json.loads(l)["event"] == "hang" for l in ev_path.read_text().splitlines() if l.strip()):
                break
            rss_end, cpu1, t1 = rss_kb(p.pid), cpu_s(p.pid), time.time()
            rss_max = max(rss_max, rss_end)
            time.sleep(0.25)
        _, err = p.communicate(timeout=120)
        outs = [json.loads(f.read_text()) for f in sorted(d.glob("out_*.json"))]
        ev = [json.loads(l) for l in ev_path.read_text().splitlines() if l.strip()]
        hang = next((e for e in ev if e["event"] == "hang"), None)
        if hang is None or not (d / "last").exists():
            sys.exit(f"no hang detected (exit {p.returncode}): {err[-2000:]}")
        # The deadline is the last heartbeat plus the limit the agent applied (it may have
        # calculated a shorter one from the heartbeats it saw).
        late_ms = (hang["ts"] - float((d / "last").read_text())) * 1000 - hang["limit_ms"]
        if len(outs) != a.flooders:
            sys.exit(f"only {len(outs)} of {a.flooders} flooders reported: {err[-2000:]}")
        accepted = sum(o["bytes"] / 8 / o["seconds"] for o in outs)
        calls = sum(o["calls"] / o["seconds"] for o in outs)
        print(f"vigil heartbeat flood ({a.vigil}; {a.flooders} flooding ranks + 1 that hangs, {a.seconds:.0f} s, "
              f"{os.cpu_count()} CPUs shared)")
        print()
        print("| RSS at 2 s | RSS at end | RSS max | agent CPU | heartbeats accepted/s | heartbeat calls/s "
              "| hang acted on after its deadline |")
        print("|---|---|---|---|---|---|---|")
        print(f"| {rss_start / 1024:.1f} MB | {rss_end / 1024:.1f} MB | {rss_max / 1024:.1f} MB "
              f"| {(cpu1 - cpu0) / (t1 - t0):.0%} | {accepted:,.0f} | {calls:,.0f} "
              f"| {late_ms:.1f} ms |")


if __name__ == "__main__":
    main()

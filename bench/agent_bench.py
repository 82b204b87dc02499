#!/usr/bin/env python3
"""Agent benchmark: heartbeat throughput of a real `vigil run`, and hang-detection latency.

    python3 bench/agent_bench.py [--vigil target/release/vigil] [--seconds 3] [--ranks 1,4,8] [--reps 5]

Throughput: N ranks under `vigil run --heartbeat-timeout 30` call `vigil.heartbeat()` in a tight
loop for T seconds, all starting at the same instant. The shim drops a heartbeat when the socket
buffer is full (the agent is behind), so each rank counts the bytes its socket really accepted
(a thin wrapper around the shim's socket, the same `send()` the shim calls), stops after T s,
then waits until the agent has read everything (TIOCOUTQ, the unread bytes on the socket, reaches
0). Consumed/s = heartbeats accepted by all ranks / (time the last socket drained - start). The
agent's CPU time over that window (/proc/<pid>/stat utime+stime) per heartbeat is the second
figure. "dropped" > 0 means the agent was the bottleneck (the rate is its capacity); 0 means the
senders were (the rate is a lower bound). Senders and agent share this machine's cores.

Detection latency: one rank heartbeats, records the wall time of its last heartbeat, and goes
silent under `--heartbeat-timeout 1`; its SIGTERM handler writes the wall time it was terminated.
Late by = SIGTERM seen - (last heartbeat + 1 s); also timeout -> `hang` event and `hang` -> `stacks`
event. One agent, --reps cycles (each a restart). Median and max.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIM = REPO / "python-shim"

SENDER = r"""
import fcntl, json, os, struct, sys, termios, time
import vigil

class Counting:
    # Stands in for the shim's socket: counts the bytes the kernel accepted, delegates the rest.
    __slots__ = ("s", "n")
    def __init__(self, s):
        self.s, self.n = s, 0
    def send(self, data, flags=0):
        k = self.s.send(data, flags)
        self.n += k
        return k
    def sendall(self, data, flags=0):
        self.s.sendall(data, flags)
        self.n += len(data)
    def __getattr__(self, name):
        return getattr(self.s, name)

def outq(sock):
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]

start_at, seconds = float(sys.argv[1]), float(sys.argv[2])
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out_%s.json" % os.environ["RANK"])
vigil.heartbeat()
assert vigil.is_connected()
real = vigil._sock
while outq(real):  # registration and the first heartbeat are read before we start
    time.sleep(0.001)
counting = Counting(real)
vigil._sock = counting
late = time.time() - start_at
while time.time() < start_at:
    pass
hb = vigil.heartbeat
calls = 0
clock = time.time
end = start_at + seconds
while True:
    for _ in range(1000):
        hb()
    calls += 1000
    if clock() >= end:
        break
sent_end = clock()
drained_by = sent_end + 30
while outq(real) and clock() < drained_by:
    time.sleep(0.0002)
drained = clock()
json.dump({"calls": calls, "accepted_bytes": counting.n, "sent_end": sent_end, "drained": drained,
           "left": outq(real), "late": late}, open(out, "w"))
"""

SILENT = r"""
import os, signal, sys, time
import vigil
out = os.environ["OUT"]
cycle = os.environ["TORCHELASTIC_RESTART_COUNT"]
def on_term(sig, frame):
    t = time.time()
    with open(os.path.join(out, "term_" + cycle), "w") as f:
        f.write(repr(t))
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
for i in range(10):
    vigil.heartbeat(i)
    time.sleep(0.02)
vigil.heartbeat(10)
last = time.time()
with open(os.path.join(out, "last_" + cycle), "w") as f:
    f.write(repr(last))
time.sleep(600)
"""


def cpu_us(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks * 1e6 / os.sysconf("SC_CLK_TCK")


def env_for(**extra):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("PET_", "SLURM_", "VIGIL_")):
            del env[k]
    env["PYTHON_EXEC"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SHIM), env.get("PYTHONPATH")]))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def throughput(vigil, nranks, seconds, work):
    d = Path(tempfile.mkdtemp(prefix=f"tp{nranks}_", dir=work))
    (d / "sender.py").write_text(SENDER)
    start_at = time.time() + 1.5 + 0.1 * nranks
    p = subprocess.Popen(
        [vigil, "run", "--nproc-per-node", str(nranks), "--heartbeat-timeout", "30", "--log-dir", str(d),
         str(d / "sender.py"), repr(start_at), str(seconds)],
        cwd=d, env=env_for(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    # Each rank writes out_<RANK>.json next to the script.
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = cpu_us(p.pid)
    files = []
    deadline = time.time() + seconds + 60
    while time.time() < deadline and p.poll() is None:
        files = sorted(d.glob("out_*.json"))
        if len(files) == nranks:
            break
        time.sleep(0.01)
    cpu1 = cpu_us(p.pid) if p.poll() is None else float("nan")
    _, err = p.communicate(timeout=60)
    if p.returncode != 0 or len(files) != nranks:
        raise RuntimeError(f"throughput run with {nranks} ranks failed ({p.returncode}): {err[-2000:]}")
    res = [json.loads(f.read_text()) for f in files]
    msgs = sum(r["accepted_bytes"] for r in res) // 8
    calls = sum(r["calls"] for r in res)
    window = max(r["drained"] for r in res) - start_at
    return {
        "ranks": nranks,
        "calls": calls,
        "consumed": msgs,
        "dropped": 1.0 - msgs / calls if calls else 0.0,
        "rate": msgs / window,
        "cpu_us_per_msg": (cpu1 - cpu0) / msgs if msgs else float("nan"),
        "send_us": statistics.median(seconds * 1e6 / r["calls"] for r in res),
        "left": sum(r["left"] for r in res),
        "late": max(r["late"] for r in res),
    }


def latency(vigil, reps, work):
    d = Path(tempfile.mkdtemp(prefix="lat_", dir=work))
    (d / "silent.py").write_text(SILENT)
    r = subprocess.run(
        [vigil, "run", "--heartbeat-timeout", "1", "--max-restarts", str(reps - 1), "--log-dir", str(d / "logs"),
         "silent.py"],
        cwd=d, env=env_for(OUT=d), capture_output=True, text=True, timeout=30 + 10 * reps,
    )
    (run_dir,) = [p for p in (d / "logs").iterdir() if p.is_dir()]
    ev = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines() if l.strip()]
    rows = []
    for c in range(reps):
        hang = next(e for e in ev if e["event"] == "hang" and e["cycle"] == c)
        st = next(e for e in ev if e["event"] == "stacks" and e["cycle"] == c)
        due = float((d / f"last_{c}").read_text()) + 1.0
        term = float((d / f"term_{c}").read_text())
        rows.append({"hang": hang["ts"] - due, "stacks": st["ts"] - hang["ts"], "term": term - due})
    return rows, r.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vigil", default=str(REPO / "target" / "release" / "vigil"))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--ranks", default="1,4,8")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if not os.access(a.vigil, os.X_OK):
        sys.exit(f"{a.vigil} not found: run `cargo build --release -p vigil` first")
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="agent_bench_") as work:
        print(f"vigil agent benchmark ({a.vigil}; {os.cpu_count()} CPUs shared by agent and ranks)")
        print()
        print(f"Heartbeat throughput: ranks call vigil.heartbeat() in a loop for {a.seconds:.0f} s")
        hdr = f"{'ranks':>5} | {'consumed/s':>11} | {'agent CPU us/msg':>16} | {'dropped':>7} | {'shim us/call':>12} | {'heartbeats':>11}"
        print(hdr)
        print("-" * len(hdr))
        for n in [int(x) for x in a.ranks.split(",")]:
            r = throughput(a.vigil, n, a.seconds, work)
            note = "" if r["left"] == 0 else f"  ({r['left']} bytes never drained)"
            if r["late"] > 0:
                note += f"  (a rank started {r['late']:.2f}s late)"
            print(f"{n:>5} | {r['rate']:>11,.0f} | {r['cpu_us_per_msg']:>16.3f} | {r['dropped']:>6.1%} | "
                  f"{r['send_us']:>12.2f} | {r['consumed']:>11,}{note}")
        print()
        rows, rc = latency(a.vigil, a.reps, work)
        print(f"Hang detection, --heartbeat-timeout 1 ({len(rows)} hangs, one agent; job exit status {rc})")
        hdr = f"{'from the deadline (last heartbeat + 1 s) to':<44} | {'median':>8} | {'max':>8}"
        print(hdr)
        print("-" * len(hdr))
        for key, label in [("hang", "hang event logged"), ("term", "hung rank's SIGTERM handler runs (acted on)")]:
            v = [x[key] * 1000 for x in rows]
            print(f"{label:<44} | {statistics.median(v):>6.1f}ms | {max(v):>6.1f}ms")
        v = [x["stacks"] * 1000 for x in rows]
        print(f"{'(hang event to stacks captured)':<44} | {statistics.median(v):>6.1f}ms | {max(v):>6.1f}ms")
        print()
        print("NVRx for comparison (shared/notes/anchors.md): acts on a hang 0.5-4.5 s after the timeout "
              "(5 s check interval); a heartbeat costs 10-16 us.")
        print(f"(benchmark took {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()

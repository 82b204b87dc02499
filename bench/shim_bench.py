#!/usr/bin/env python3
"""Cost of the vigil Python shim, as seen from a training process.

Prints one table: per-call heartbeat cost (median and p99, microseconds, wall clock around each
call) with 1 and 4 processes sending at once, a section open+close pair, ``should_stop(step)``
with a new step every call (it sends ``Progress``) and ``should_stop()``, ``step_timing(step,
seconds)`` (straggler scores), the shim's import time
in a fresh interpreter and the RSS that importing it adds; and, when ``nvidia_resiliency_ext`` is
importable, NVRx's ``RankMonitorClient.send_heartbeat`` measured the same way.

Without ``--socket`` a Python reader process stands in for the agent and drains every
connection; with ``--socket PATH`` the senders talk to a server already listening there (e.g. a
running vigil agent).
"""

import argparse
import array
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_DIR = os.path.join(os.path.dirname(HERE), "python-shim")

READER = r"""
import os, selectors, signal, socket, sys
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path); srv.listen(64); srv.setblocking(False)
sel = selectors.DefaultSelector(); sel.register(srv, selectors.EVENT_READ)
total = 0
running = True
def stop(*_):
    global running
    running = False
signal.signal(signal.SIGTERM, stop)
print("listening", flush=True)
while running:
    for key, _ in sel.select(0.2):
        s = key.fileobj
        if s is srv:
            c, _ = srv.accept(); c.setblocking(False); sel.register(c, selectors.EVENT_READ)
            continue
        try:
            data = s.recv(1 << 20)
        except BlockingIOError:
            continue
        if not data:
            sel.unregister(s); s.close()
        total += len(data)
print(total, flush=True)
"""

# Drains every connection with cat(1): keeps up on a loaded machine, where the Python reader lags
# (free for heartbeats, which the shim drops, but messages never dropped - sections, step timings -
# then wait for it).
CAT_READER = r"""
import socket, subprocess, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1]); srv.listen(64)
print("listening", flush=True)
while True:
    c, _ = srv.accept()
    subprocess.Popen(["cat"], stdin=c.fileno(), stdout=subprocess.DEVNULL)
    c.close()
"""

SENDER = r"""
import array, os, sys, time
import vigil
mode, calls, out_path, go_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
clock = time.perf_counter_ns
if mode == "nvrx":
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    client = RankMonitorClient()
    client.init_workload_monitoring()
    call = client.send_heartbeat
elif mode == "hb":
    call = vigil.heartbeat
elif mode == "hb_step":
    step = [0]
    hb = vigil.heartbeat
    def call():
        step[0] += 1
        hb(step[0])
elif mode == "stop_step":
    step = [0]
    stop = vigil.should_stop
    def call():
        step[0] += 1
        stop(step[0])
elif mode == "step_timing":
    step = [0]
    timing = vigil.step_timing
    def call():
        step[0] += 1
        timing(step[0], 0.25)
elif mode == "stop":
    call = vigil.should_stop
elif mode == "section":
    start, end = vigil.start_section, vigil.end_section
    def call():
        start("step")
        end("step")
for _ in range(2000):
    call()
assert mode == "nvrx" or vigil.is_connected(), "shim is not connected"
t = clock(); clock(); timer_ns = clock() - t
open(out_path + ".ready", "w").close()
while not os.path.exists(go_path):
    time.sleep(0.001)
samples = array.array("q", bytes(8 * calls))
for i in range(calls):
    t0 = clock()
    call()
    samples[i] = clock() - t0
with open(out_path, "wb") as f:
    samples.tofile(f)
"""


# Bytes one call puts on the wire (registration adds 24 per process).
FRAME_BYTES = {"hb": 8, "hb_step": 16, "stop_step": 16, "step_timing": 24, "stop": 0, "section": 2 * (8 + 2 + len("step"))}


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, int(round(q / 100.0 * (len(sorted_values) - 1))))
    return sorted_values[i]


def run_senders(mode, procs, calls, socket_path, workdir, extra_env=None):
    """Per-call samples (ns) pooled over ``procs`` processes that start sending together."""
    go = os.path.join(workdir, "go-%s-%d" % (mode, procs))
    outs, children = [], []
    for i in range(procs):
        out = os.path.join(workdir, "samples-%s-%d-%d" % (mode, procs, i))
        env = dict(os.environ)
        env.update(
            PYTHONPATH=SHIM_DIR + os.pathsep + env.get("PYTHONPATH", ""),
            VIGIL_SOCKET=socket_path,
            RANK=str(i),
            LOCAL_RANK=str(i),
        )
        env.update(extra_env or {})
        children.append(
            subprocess.Popen([sys.executable, "-c", SENDER, mode, str(calls), out, go], env=env)
        )
        outs.append(out)
    deadline = time.time() + 60
    while not all(os.path.exists(o + ".ready") for o in outs):
        if any(c.poll() not in (None, 0) for c in children) or time.time() > deadline:
            for c in children:
                c.kill()
            raise RuntimeError("a sender failed to start (mode %s)" % mode)
        time.sleep(0.01)
    open(go, "w").close()
    for c in children:
        if c.wait(timeout=300) != 0:
            raise RuntimeError("a sender failed (mode %s)" % mode)
    samples = array.array("q")
    for o in outs:
        with open(o, "rb") as f:
            samples.frombytes(f.read())
    return sorted(samples)


def import_cost(workdir, runs=7):
    """(median ms of `import vigil` per -X importtime, median KiB of RSS it adds).

    Bytecode is cached first (in ``workdir``, not the source tree), as after ``pip install``.
    """
    env = dict(os.environ, PYTHONPATH=SHIM_DIR)
    env.pop("VIGIL_SOCKET", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    py = [sys.executable, "-X", "pycache_prefix=" + os.path.join(workdir, "pyc")]
    subprocess.run(py + ["-c", "import vigil"], env=env, check=True)
    times, rss = [], []
    for _ in range(runs):
        r = subprocess.run(
            py + ["-X", "importtime", "-c", "import vigil"],
            env=env, capture_output=True, text=True, check=True,
        )
        for line in r.stderr.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) == 3 and parts[2] == "vigil":
                times.append(int(parts[1]) / 1000.0)
        code = (
            "import os\n"
            "def rss():\n"
            "    for l in open('/proc/self/status'):\n"
            "        if l.startswith('VmRSS:'): return int(l.split()[1])\n"
            "a = rss(); import vigil; b = rss(); print(b - a)\n"
        )
        r = subprocess.run(py + ["-c", code], env=env, capture_output=True, text=True, check=True)
        rss.append(int(r.stdout))
    return statistics.median(times), statistics.median(rss)


def timer_overhead_ns(n=200000):
    clock = time.perf_counter_ns
    s = []
    for _ in range(n):
        t = clock()
        s.append(clock() - t)
    s.sort()
    return percentile(s, 50)


def start_reader(workdir, cat=False):
    path = os.path.join(workdir, "agent.sock")
    reader = subprocess.Popen(
        [sys.executable, "-c", CAT_READER if cat else READER, path], stdout=subprocess.PIPE, text=True
    )
    if reader.stdout.readline().strip() != "listening":
        raise RuntimeError("reader failed to start")
    return path, reader


def nvrx_row(calls, workdir):
    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        return "not installed"
    env = {}
    if not os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
        # Outside ft_launcher: start NVRx's own rank monitor server for the client to talk to.
        path = os.path.join(workdir, "nvrx_rmon.sock")
        code = (
            "import sys, time\n"
            "from nvidia_resiliency_ext.fault_tolerance import FaultToleranceConfig\n"
            "from nvidia_resiliency_ext.fault_tolerance.rank_monitor_server import RankMonitorServer\n"
            "p = RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), sys.argv[1])\n"
            "print('ready', flush=True); time.sleep(3600)\n"
        )
        server = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
        try:
            if server.stdout.readline().strip() != "ready":
                return "installed, but its rank monitor server did not start"
            env = {"FT_RANK_MONITOR_IPC_SOCKET": path, "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
            s = run_senders("nvrx", 1, calls, "", workdir, env)
        except Exception as e:  # NVRx's API differs between releases; report instead of failing
            return "installed, measurement failed: %s" % (e,)
        finally:
            server.kill()
            server.wait()
    else:
        s = run_senders("nvrx", 1, calls, "", workdir)
    return "%8.2f %8.2f" % (percentile(s, 50) / 1000.0, percentile(s, 99) / 1000.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", help="measure against a server already listening on this Unix socket")
    ap.add_argument("--cat-reader", action="store_true",
                    help="drain each connection with cat(1) instead of the Python reader (keeps up under load)")
    ap.add_argument("--calls", type=int, default=200000, help="timed calls per sending process")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = ap.parse_args()

    rows, figures, sent_bytes = [], {}, 0
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as workdir:
        reader = None
        if args.socket:
            path, where = args.socket, "server at %s" % args.socket
        elif args.cat_reader:
            path, reader = start_reader(workdir, cat=True)
            where = "cat(1) per connection"
        else:
            path, reader = start_reader(workdir)
            where = "Python reader process"
        try:
            for label, mode, procs in [
                ("heartbeat()", "hb", 1),
                ("heartbeat(step)", "hb_step", 1),
                ("heartbeat()", "hb", 4),
                ("heartbeat(step)", "hb_step", 4),
                ("section open+close", "section", 1),
                ("step_timing(step, seconds)", "step_timing", 1),
                ("should_stop(step), new step", "stop_step", 1),
                ("should_stop()", "stop", 1),
            ]:
                s = run_senders(mode, procs, args.calls, path, workdir)
                sent_bytes += procs * (24 + (2000 + args.calls) * FRAME_BYTES[mode])
                p50, p99 = percentile(s, 50) / 1000.0, percentile(s, 99) / 1000.0
                figures["%s_%dp" % (mode, procs)] = {"median_us": p50, "p99_us": p99}
                rows.append(("%s, %d proc%s" % (label, procs, "" if procs == 1 else "s"), "%8.2f %8.2f" % (p50, p99)))
        finally:
            if reader is not None and args.cat_reader:
                reader.terminate()
                reader.wait(timeout=30)
                reader = None
            elif reader is not None:
                reader.terminate()
                delivered = int(reader.communicate(timeout=30)[0].split()[-1])
                figures["reader_bytes"] = delivered
        nvrx = nvrx_row(min(args.calls, 20000), workdir)
        imp_ms, rss_kib = import_cost(workdir)
    figures.update(import_ms=imp_ms, import_rss_kib=rss_kib, timer_ns=timer_overhead_ns(), nvrx=nvrx)

    print("vigil shim cost (Python %s, %d timed calls per process, against a %s)"
          % (sys.version.split()[0], args.calls, where))
    print("%-34s %8s %8s" % ("measure", "median", "p99"))
    print("%-34s %8s %8s" % ("", "us", "us"))
    for name, val in rows:
        print("%-34s %s" % (name, val))
    print("%-34s %s" % ("NVRx RankMonitorClient.send_heartbeat", nvrx))
    print("%-34s %8.2f ms" % ("import vigil (fresh interpreter)", imp_ms))
    print("%-34s %8d KiB" % ("RSS added by import vigil", rss_kib))
    print("(per-call figures include the clock read itself: %d ns median)" % figures["timer_ns"])
    if reader is not None:
        print(
            "(the reader received %.1f%% of the %d bytes sent; the rest are heartbeats dropped "
            "while it lagged)" % (100.0 * figures["reader_bytes"] / sent_bytes, sent_bytes)
        )
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Launcher benchmark: vigil side by side with torchrun (and ft_launcher where installed).

    python3 bench/launch_bench.py [--reps 5] [--vigil target/release/vigil]

Prints a table of, per launcher, on the same fake job:
- first line: launch to the ranks' first output line (2 ranks);
- trivial job: whole wall time of a trivial 2-rank job, and its ratio to running the script once
  by hand with the same interpreter;
- agent RSS: resident memory of the launcher process(es) with 8 idle ranks;
- crash to running: from a rank's crash to every rank of the next attempt running again
  (the other ranks exit promptly on SIGTERM).
Medians over --reps runs. Timing goals live here, never in the tests.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

TRIVIAL = "print('first', flush=True)\n"
IDLE = """
import os, sys, time
open(os.path.join(os.environ["OUT"], "ready_" + os.environ["RANK"]), "w").close()
time.sleep(float(sys.argv[1]))
"""
CRASH = """
import os, sys, time
out = os.environ["OUT"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(out, "start_%s_%s" % (attempt, os.environ["RANK"])), "w") as f:
    f.write(repr(time.time()))
if attempt == "0":
    if os.environ["RANK"] == "1":
        # Wait until every rank of the first attempt runs, then crash.
        while len([p for p in os.listdir(out) if p.startswith("start_0_")]) < int(os.environ["WORLD_SIZE"]):
            time.sleep(0.005)
        with open(os.path.join(out, "crash"), "w") as f:
            f.write(repr(time.time()))
        os._exit(1)
    time.sleep(60)
"""


def launchers(vigil: str):
    out = {"vigil": [vigil, "run"]}
    try:
        import torch  # noqa: F401
        out["torchrun"] = [PY, "-m", "torch.distributed.run", "--monitor-interval", "0.1"]
    except ImportError:
        pass
    ft = shutil.which("ft_launcher")
    if ft:
        out["ft_launcher"] = [ft]
    return out


def env_for(out_dir):
    env = dict(os.environ)
    env["PYTHON_EXEC"] = PY
    env["OUT"] = str(out_dir)
    return env


def first_line(cmd, script, d):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd + ["--nproc-per-node", "2", str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, env=env_for(d), cwd=d)
    first = None
    for line in p.stdout:
        if "first" in line and first is None:
            first = time.perf_counter() - t0
    p.wait()
    return first, time.perf_counter() - t0


def by_hand(script, d):
    t0 = time.perf_counter()
    subprocess.run([PY, str(script)], stdout=subprocess.DEVNULL, cwd=d, check=True)
    return time.perf_counter() - t0


def mem_kib(pid, path, field):
    try:
        for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kib(pid):
    return mem_kib(pid, "status", "VmRSS:")


def pss_kib(pid):
    """Proportional set size: pages shared with other processes (vigil's watchdog runs the same
    binary as the agent) count once over all of them, not once per process."""
    return mem_kib(pid, "smaps_rollup", "Pss:")


def launcher_pids(root_pid):
    """The launcher and its non-rank helpers: the root and descendants that are not Python ranks."""
    pids, todo = [root_pid], [root_pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for k in map(int, kids):
            todo.append(k)
            try:
                env = Path(f"/proc/{k}/environ").read_bytes()
            except OSError:
                continue
            if b"\0RANK=" not in b"\0" + env:
                pids.append(k)
    return pids


def idle_rss(cmd, script, d):
    p = subprocess.Popen(cmd + ["--nproc-per-node", "8", str(script), "30"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=env_for(d), cwd=d)
    deadline = time.monotonic() + 60
    while len(list(Path(d).glob("ready_*"))) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    pids = launcher_pids(p.pid)
    total = (sum(rss_kib(x) for x in pids), sum(pss_kib(x) for x in pids))
    p.terminate()
    try:
        p.wait(timeout=40)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    return total[0] / 1024.0, total[1] / 1024.0


def crash_to_running(cmd, script, d, nproc=4):
    p = subprocess.run(cmd + ["--nproc-per-node", str(nproc), "--max-restarts", "1", str(script)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_for(d), cwd=d, timeout=120)
    if p.returncode != 0:
        return None
    crash = float((Path(d) / "crash").read_text())
    starts = [float((Path(d) / f"start_1_{r}").read_text()) for r in range(nproc)]
    return max(starts) - crash


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(v, unit):
    return "n/a" if v is None else f"{v:.3f} {unit}" if unit == "s" else f"{v:.1f} {unit}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--vigil", default=str(REPO / "target" / "release" / "vigil"))
    a = ap.parse_args()
    if not os.access(a.vigil, os.X_OK):
        sys.exit(f"{a.vigil} not found: run `cargo build --release` first")
    ls = launchers(a.vigil)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        scripts = {}
        for name, text in [("trivial", TRIVIAL), ("idle", IDLE), ("crash", CRASH)]:
            scripts[name] = tmp / f"{name}.py"
            scripts[name].write_text(text)
        hand = median([by_hand(scripts["trivial"], tmp) for _ in range(a.reps)])
        for name, cmd in ls.items():
            firsts, walls, rss, crash = [], [], [], []
            for i in range(a.reps):  # interleaving launchers would share caches the same way
                d = Path(tempfile.mkdtemp(dir=tmp))
                f, w = first_line(cmd, scripts["trivial"], d)
                firsts.append(f)
                walls.append(w)
                crash.append(crash_to_running(cmd, scripts["crash"], Path(tempfile.mkdtemp(dir=tmp))))
            rss.append(idle_rss(cmd, scripts["idle"], Path(tempfile.mkdtemp(dir=tmp))))
            rows[name] = (median(firsts), median(walls), rss[0], median(crash))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {a.reps} reps (medians)")
    print(f"running the trivial script once by hand: {hand:.3f} s\n")
    print("| launcher | first line (2 ranks) | trivial 2-rank job | x by hand | launcher RSS (PSS), 8 idle ranks "
          "| crash to all running |")
    print("|---|---|---|---|---|---|")
    for name, (f, w, (r, pss), c) in rows.items():
        ratio = "n/a" if w is None else f"{w / hand:.1f}x"
        print(f"| {name} | {fmt(f, 's')} | {fmt(w, 's')} | {ratio} | {fmt(r, 'MiB')} ({fmt(pss, 'MiB')}) "
              f"| {fmt(c, 's')} |")
    missing = [n for n in ("torchrun", "ft_launcher") if n not in ls]
    if missing:
        print(f"\nnot installed here: {', '.join(missing)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Crash to every rank running again, on the README's example (whose ranks call should_stop).

    cargo build --release && python3 bench/restart_bench.py [--reps 5] [--steps 20 --crash-at 5]

Runs `vigil run --nproc-per-node 4 --max-restarts 1 examples/toy_train.py --steps 20 --crash-at 5`
(the README's first command) --reps times and reads each run's event log:

- crash: the failed rank's `rank_exited` record (the agent reaped it);
- every rank running again: the last `rank_started` of attempt 1 (its processes are started);
- every rank connected again: the last `registered` of attempt 1 (its Python is up, the shim
  imported: with torch this includes importing torch).

Two settings: ranks that only simulate work (torch hidden: nothing ends the other ranks but vigil,
the setting of field finding 6, where they trained on for vigil.SIGNAL_WAIT = 10 s before), and,
when torch is installed, the README's own (every step is a gloo all_reduce, so the other ranks may
also fail on their own when their peer dies). The ranks that survive the crash hold SIGTERM for
`should_stop`; the stop after a failure sends them SIGKILL at once (docs/allocations.md#signals).
Target: 0.2 s from crash to every rank running again on one node.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "examples" / "toy_train.py"


def vigil_bin(given):
    for p in (given, os.environ.get("VIGIL_BIN"), REPO / "target/release/vigil", REPO / "target/debug/vigil"):
        if p and os.access(p, os.X_OK):
            return str(Path(p).resolve())
    sys.exit("build vigil first: cargo build --release")


def has_torch():
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def one_run(vigil, d, hide_torch, args):
    env = dict(os.environ, PYTHON_EXEC=sys.executable)
    if hide_torch:
        (d / "no_torch").mkdir()
        (d / "no_torch" / "torch.py").write_text("raise ImportError('hidden by restart_bench')\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(d / "no_torch"), env.get("PYTHONPATH")]))
    r = subprocess.run(
        [vigil, "run", "--nproc-per-node", "4", "--max-restarts", "1", "--log-dir", str(d / "logs"), str(TOY),
         "--steps", str(args.steps), "--step-time", str(args.step_time), "--crash-at", str(args.crash_at)],
        cwd=d, env=env, capture_output=True, text=True, timeout=600,
    )
    if r.returncode != 0:
        sys.exit(f"the run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    (run_dir,) = [p for p in (d / "logs").iterdir() if p.name.startswith("vigil_")]
    ev = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines() if l.strip()]
    crash = next(e["ts"] for e in ev if e["event"] == "rank_exited" and e["expected"] is False)
    started = max(e["ts"] for e in ev if e["event"] == "rank_started" and e["cycle"] == 1)
    registered = max(e["ts"] for e in ev if e["event"] == "registered" and e["cycle"] == 1)
    stop = next(e for e in ev if e["event"] == "stop" and e["cycle"] == 0)
    killed_by_vigil = sum(
        1 for e in ev if e["event"] == "rank_exited" and e["cycle"] == 0 and e.get("signal") == 9)
    return started - crash, registered - crash, len(stop.get("killed", [])), killed_by_vigil


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-time", type=float, default=0.02)
    ap.add_argument("--crash-at", type=int, default=5)
    ap.add_argument("--vigil", default=None)
    a = ap.parse_args()
    vigil = vigil_bin(a.vigil)
    settings = [("ranks only simulate work (torch hidden)", True)]
    if has_torch():
        settings.append(("gloo all_reduce every step (torch)", False))
    print(f"vigil: {vigil}; toy_train.py --steps {a.steps} --step-time {a.step_time} --crash-at {a.crash_at}; "
          f"4 ranks; {a.reps} runs each\n")
    print("| setting | crash to every rank running again (median / max) | crash to every rank connected again "
          "(median / max) | ranks sent SIGKILL at once | ranks that died of SIGKILL |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, hide in settings:
            runs = []
            for i in range(a.reps):
                d = Path(tmp) / f"{int(hide)}_{i}"
                d.mkdir()
                runs.append(one_run(vigil, d, hide, a))
            started = [r[0] for r in runs]
            registered = [r[1] for r in runs]
            print(f"| {name} | {statistics.median(started) * 1000:.0f} ms / {max(started) * 1000:.0f} ms "
                  f"| {statistics.median(registered) * 1000:.0f} ms / {max(registered) * 1000:.0f} ms "
                  f"| {'/'.join(str(r[2]) for r in runs)} | {'/'.join(str(r[3]) for r in runs)} |")
    print("\nTarget: crash to every rank running again within 0.2 s on one node.")


if __name__ == "__main__":
    main()

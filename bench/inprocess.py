#!/usr/bin/env python3
"""In-process restarts against whole restarts and torchrun (issue 32, docs/inprocess.md).

    python3 bench/inprocess.py [--vigil target/debug/vigil] [--ranks 2,4] [--duration 200]
                               [--kill-every 45] [--modes inprocess,whole,torchrun]

The job: N ranks of real torch (gloo), a 50 ms step (an all-reduce and a sleep), a checkpoint
every 100 steps (rank 0 writes the step and the weights; a restarted job resumes from it). The
bench SIGKILLs a random rank every --kill-every seconds, for --duration seconds, then the ranks
agree to finish. Each mode runs the same script:

- inprocess: `vigil run --in-process-restarts 1000`, the function under `vigil.restartable`,
  a replaced rank receives its state from a survivor (`gen.recover`);
- whole: `vigil run --max-restarts 1000`: every rank restarts and resumes from the checkpoint;
- torchrun: `torchrun --max-restarts 1000`, the same (when torchrun is installed).

Per mode: failures, failure -> every rank stepping again (median and max; each rank writes the
wall time of every step; one machine, one clock), steps redone (the highest step before the kill
minus the step training went on from), and goodput (the job's last step x the median failure-free
step time / the job's wall time from its first step to its exit). A second table says where the
rest went: the recoveries, the job's exit after its last step (the ranks' interpreter shutdown),
the slower steps in between; the goodput with the exit left out; and, in process, the agents'
own figures (`generation_recovered`, `generation_stepping`).
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

JOB = r'''
import json, os, time
import torch, torch.distributed as dist
import vigil

TRACE, CKPT = os.environ["BENCH_TRACE"], os.environ["BENCH_CKPT"]
END = float(os.environ["BENCH_END"])
INPROC = os.environ["BENCH_MODE"] == "inprocess"
rank = int(os.environ["RANK"])
out = open(os.path.join(TRACE, "%d_%d.jsonl" % (rank, os.getpid())), "a", buffering=1)
state = None


def load():
    try:
        with open(CKPT) as f:
            c = json.load(f)
        return {"step": c["step"], "w": torch.tensor(c["w"])}
    except (FileNotFoundError, ValueError):
        return {"step": 0, "w": torch.zeros(1024)}


def train(gen=None):
    global state
    dist.init_process_group("gloo")
    if state is None:
        state = load()
    if gen is not None:
        state = gen.recover(state)
    while True:
        s = state["step"]
        g = torch.full((1024,), float(s % 5 + rank))
        dist.all_reduce(g)
        done = torch.tensor([1.0 if time.time() > END else 0.0])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        state["w"] += g * 1e-3
        state["step"] = s + 1
        out.write(json.dumps({"s": s + 1, "t": time.time()}) + "\n")
        vigil.heartbeat(s + 1)
        if rank == 0 and state["step"] % 100 == 0:
            tmp = CKPT + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"step": state["step"], "w": state["w"].tolist()}, f)
            os.replace(tmp, CKPT)
        if done.item():
            break
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()


(vigil.restartable(train) if INPROC else train)()
vigil.mark_finished()
'''


def read_trace(d):
    """{(rank, pid): [(step, t)]} and every (rank, pid)'s first line time."""
    out = {}
    for p in Path(d).glob("*.jsonl"):
        rank, pid = map(int, p.stem.split("_"))
        rows = []
        for line in p.read_text().splitlines():
            try:
                j = json.loads(line)
                rows.append((j["s"], j["t"]))
            except ValueError:
                pass
        out[(rank, pid)] = rows
    return out


def live_pids(trace_dir, nproc):
    """The newest process of each rank (from its trace file), if alive."""
    pids = {}
    for p in Path(trace_dir).glob("*.jsonl"):
        rank, pid = map(int, p.stem.split("_"))
        if p.stat().st_mtime >= pids.get(rank, (0, 0))[1]:
            pids[rank] = (pid, p.stat().st_mtime)
    alive = {}
    for rank, (pid, _) in pids.items():
        try:
            os.kill(pid, 0)
            alive[rank] = pid
        except ProcessLookupError:
            pass
    return alive if len(alive) == nproc else {}


def redone_at(rows, tk, after):
    """The steps done twice because of the kill at `tk`: for each rank, from its first step after
    the kill back to the highest it had written before (any of its processes). Per rank: the
    survivors finish a step's collectives together but write it a few ms apart, so one may
    write step N before the kill and another after it without doing N twice."""
    redone = 0
    for rank, (first, _) in after.items():
        before = max((s for s, t, r in rows if r == rank and t <= tk), default=0)
        redone = max(redone, before - (first - 1))
    return redone


def analyse(trace, kills, nproc, ended):
    rows = [(s, t, rank) for (rank, _), r in trace.items() for s, t in r]
    if not rows:
        return None
    first_t = min(t for _, t, _ in rows)
    last_t = max(t for _, t, _ in rows)
    last_step = max(s for s, _, _ in rows)
    recov, redone = [], []
    for tk in kills:
        after = {}
        for s, t, rank in rows:
            if t > tk and (rank not in after or t < after[rank][1]):
                after[rank] = (s, t)
        if len(after) < nproc:
            continue
        recov.append(max(t for _, t in after.values()) - tk)
        redone.append(redone_at(rows, tk, after))
    # Failure-free step time: the median gap between one rank's consecutive steps.
    gaps = []
    for r in trace.values():
        r = sorted(r)
        gaps += [b[1] - a[1] for a, b in zip(r, r[1:]) if b[0] == a[0] + 1]
    step_t = statistics.median(gaps) if gaps else 0.05
    # Up to the job's exit: a job that stalls after a failure loses that time too.
    wall = max(last_t, ended) - first_t
    goodput = min(1.0, last_step * step_t / wall) if wall > 0 else 0.0
    # Where the rest of the wall went: the recoveries (kill -> every rank stepping), the job's
    # exit after its last step, and the slower steps in between (a warm process importing
    # beside the ranks, the machine's other load).
    exit_s = max(0.0, ended - last_t)
    lost = max(0.0, wall - last_step * step_t)
    # The same without the job's exit (torch's interpreter shutdown, 1-3.5 s here, alike in every
    # mode and no failure's cost).
    run = last_t - first_t
    goodput_run = min(1.0, last_step * step_t / run) if run > 0 else 0.0
    return {"recov": recov, "redone": redone, "goodput": goodput, "goodput_run": goodput_run,
            "steps": last_step,
            "wall": wall, "lost": lost, "lost_recov": sum(recov), "exit": exit_s}


def agent_times(logs):
    """From the agent's event log: per generation, the seconds from the failure to every rank
    back in its function (`generation_recovered`) and to every rank stepping
    (`generation_stepping`)."""
    back, stepping = [], []
    for f in Path(logs).glob("*/events.jsonl"):
        for line in f.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "generation_recovered":
                back.append(e["seconds"])
            elif e.get("event") == "generation_stepping":
                stepping.append(e["seconds"])
    return back, stepping


def run_mode(mode, nproc, args, work):
    trace = work / "trace"
    trace.mkdir(parents=True)
    ckpt = work / "ckpt.json"
    (work / "job.py").write_text(JOB)
    # The job ends --duration seconds after its ranks first step (set once the first step is seen).
    env = dict(os.environ)
    env.update(BENCH_TRACE=str(trace), BENCH_CKPT=str(ckpt), BENCH_MODE=mode,
               BENCH_END=str(time.time() + 3600), PYTHONPATH=str(REPO / "python-shim"))
    for k in list(env):
        if k.startswith(("VIGIL_", "PET_", "SLURM_")):
            del env[k]
    if mode == "torchrun":
        cmd = ["torchrun", "--nproc-per-node", str(nproc), "--max-restarts", "1000", "job.py"]
    else:
        flag = ["--in-process-restarts", "1000", "--max-restarts", "1000"] if mode == "inprocess" else ["--max-restarts", "1000"]
        cmd = [args.vigil, "run", "--nproc-per-node", str(nproc), *flag, "--log-dir", "logs", "job.py"]
    (work / "logs").mkdir()
    # The end is fixed before the start: startup counts against goodput in every mode alike.
    end = time.time() + args.duration
    env["BENCH_END"] = str(end)
    p = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=open(work / "err.log", "w"))
    kills = []
    next_kill = time.time() + args.kill_every
    rng = random.Random(args.seed)
    while p.poll() is None:
        now = time.time()
        if now >= next_kill and now < end - 5:
            pids = live_pids(trace, nproc)
            if pids:
                rank = rng.randrange(nproc)
                try:
                    os.kill(pids[rank], signal.SIGKILL)
                    kills.append(time.time())
                except ProcessLookupError:
                    pass
                next_kill = now + args.kill_every
        if now > end + 600:
            p.kill()
            break
        time.sleep(0.1)
    res = analyse(read_trace(trace), kills, nproc, time.time())
    if res is not None:
        res["kills"] = len(kills)
        res["rc"] = p.returncode
        res["back"], res["stepping"] = agent_times(work / "logs")
    return res


def fmt(xs, f="%.2f"):
    if not xs:
        return "-"
    return (f + " / " + f) % (statistics.median(xs), max(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vigil", default=str(REPO / "target" / "debug" / "vigil"))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--duration", type=float, default=200.0, help="seconds each job runs")
    ap.add_argument("--kill-every", type=float, default=45.0, help="seconds between kills")
    ap.add_argument("--modes", default="inprocess,whole,torchrun")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m != "torchrun" or shutil.which("torchrun")]
    rows = []
    for nproc in [int(r) for r in args.ranks.split(",")]:
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix="vigil-inproc-bench-") as d:
                r = run_mode(mode, nproc, args, Path(d))
            rows.append((nproc, mode, r))
            print(f"done: {nproc} ranks, {mode}: {r}", file=sys.stderr, flush=True)
    print(f"\n{args.duration:.0f} s per job, a random rank SIGKILLed every {args.kill_every:.0f} s, "
          "gloo, 50 ms steps, checkpoint every 100 steps\n")
    print("| ranks | mode | failures | failure -> every rank stepping (s, median / max) | steps redone (median / max) | goodput | exit |")
    print("|---|---|---|---|---|---|---|")
    for nproc, mode, r in rows:
        if r is None:
            print(f"| {nproc} | {mode} | - | no step ran | - | - | - |")
            continue
        print(f"| {nproc} | {mode} | {r['kills']} | {fmt(r['recov'])} | {fmt(r['redone'], '%d')} | "
              f"{100 * r['goodput']:.1f}% | {r['rc']} |")
    print("\nWhere the wall time that is not goodput went (seconds), and the agents' own figures "
          "(in process: failure -> every rank back in its function / stepping, median / max):\n")
    print("| ranks | mode | wall | not goodput | in recoveries | job's exit | the rest (redone and slower steps) | goodput, exit left out | back in function | stepping (agent) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for nproc, mode, r in rows:
        if r is None:
            continue
        rest = max(0.0, r["lost"] - r["lost_recov"] - r["exit"])
        print(f"| {nproc} | {mode} | {r['wall']:.1f} | {r['lost']:.1f} | {r['lost_recov']:.1f} | "
              f"{r['exit']:.1f} | {rest:.1f} | {100 * r['goodput_run']:.1f}% | {fmt(r['back'])} | "
              f"{fmt(r['stepping'])} |")


if __name__ == "__main__":
    main()

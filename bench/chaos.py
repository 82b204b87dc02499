"""Chaos soak on the real local Slurm cluster (tests/slurm/cluster.sh): real torch DDP jobs under
`srun vigil run`, a seeded injector picking faults from bench/chaos_core.CATALOG at random times,
invariants checked over what each job and vigil wrote, one table.

    python3 bench/chaos.py --minutes M --seed S --lock [--nodes N] [--kinds K,...] [--out FILE] [--workdir DIR]

Runs jobs one after another until M minutes have passed (a job started before then runs to its
end). Each job is one run: its plan (spare or not, faults and their times) comes from the seed and
the run's index alone (chaos_core.plan_run), so `--seed S --first-run I --runs 1` replays run I;
`--kinds` draws the faults from those kinds alone. A run with the store outside the job (`plan["outside"]`,
head_sigkill's runs) has `vigil store` started here, beside the cluster, for the run's length; store_junk
and store_flood aim at it there, and its refusal lines are their trace. Runs as root (ckpt_full and logs_full mount
a tmpfs on the run's directory; slurmd_kill starts the killed slurmd again).
The cluster is shared: each run holds /tmp/vigil-slurm.lock (flock) from the cluster check to the
job's cleanup and lets it go between runs. A cluster that is down is started (and stopped at the
end). The last line is exactly `chaos: F faults, S survived, V violations`; exit status 0 only
when V is 0. The table also goes to --out (default <workdir>/chaos-<seed>.md).
"""
import argparse
import fcntl
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
import chaos_core as core  # noqa: E402
from slurm.slurmlib import (SLURM_CONF, SLURM_DIR, TERMINAL_STATES, cluster, sbatch,  # noqa: E402
                            show_job, slurm_cmd, SlurmError)

SHIM = str(ROOT / "python-shim")
NPROC = 2
NODE_TIMEOUT = 10
MAX_REQUEUES = 6
MAX_RESTARTS = 12
IN_PROCESS_RESTARTS = 4
# ckpt_full, logs_full: the run's checkpoint / log directory is a tmpfs this large, full for
# FULL_S seconds.
SMALL_TMPFS = "32m"
FULL_S = 20
# slurmd_kill: a node's slurmd is down this long, well within the cluster's SlurmdTimeout (60 s).
SLURMD_DOWN_S = 15
# The store outside the job: the job's and the service's secret (fixed, as a service's is).
STORE_SECRET = "chaos-soak-store-outside-the-job-0123456789"


def log(msg):
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def vigil_bin():
    return os.environ.get("VIGIL_BIN") or str(ROOT / "target" / "debug" / "vigil")


class Lock:
    """flock on the shared cluster's lock file, held for one run."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def ensure_cluster(state):
    if cluster("status").returncode == 0:
        return
    log("cluster down: starting it")
    cluster("stop")
    p = cluster("start")
    if p.returncode != 0:
        raise SystemExit(f"chaos: cannot start the Slurm cluster:\n{p.stdout}")
    state["started"] = True


def procs_of(run_id):
    """{pid: (comm, environ dict)} of every process carrying this run's CHAOS_RUN."""
    want = f"CHAOS_RUN={run_id}".encode()
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
            if want not in env:
                continue
            stat = (p / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            comm = (p / "comm").read_text().strip()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        d = dict(kv.decode(errors="replace").partition("=")[::2] for kv in env if b"=" in kv)
        out[int(p.name)] = (comm, d, ppid)
    return out


def read_jsonl(path):
    out = []
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line cut by a SIGKILL mid-write
    return out


def steps_of(d):
    return {int(f.stem[4:]): read_jsonl(f) for f in (d / "steps").glob("rank*.jsonl")}


def events_of(d):
    ev = []
    for f in (d / "logs").glob("*/events.jsonl"):
        ev += read_jsonl(f)
    return sorted(ev, key=lambda e: e.get("ts", 0))


class Run:
    def __init__(self, args, plan, root, t_soak):
        self.args, self.plan, self.t_soak = args, plan, t_soak
        self.id = f"{args.seed}-{plan['index']}-{os.getpid()}"
        self.d = root / f"run-{plan['index']}"
        self.applied, self.timers, self.restore_limit = [], [], None
        self.slurmd_down, self.mounted = [], []
        self.nodes = args.nodes if plan["spare"] else args.nodes - 1
        self.store = None

    def start_store(self):
        """The store outside the job: `vigil store` beside the cluster, not in the Slurm job (it
        carries no CHAOS_RUN, so it is no process of the job), its lines in store.out."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_")}
        env["VIGIL_STORE_SECRET"] = STORE_SECRET
        self.store_out = open(self.d / "store.out", "w")
        self.store = subprocess.Popen([vigil_bin(), "store", "--listen", "127.0.0.1:0"], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=self.store_out)
        first = self.store.stdout.readline()
        if not first.startswith("listening on 127.0.0.1:"):
            raise SlurmError(f"vigil store did not start: {first!r}, see {self.d / 'store.out'}")
        self.store_port = int(first.rsplit(":", 1)[1])
        self.store_lines = []  # [(unix time read, line)]: its refusals are store faults' trace
        self.store_out.write(first)
        self.store_out.flush()
        self.store_reader = threading.Thread(target=self._copy_store_lines, daemon=True)
        self.store_reader.start()

    def _copy_store_lines(self):
        for line in self.store.stdout:
            self.store_lines.append((time.time(), line.rstrip("\n")))
            self.store_out.write(line)
            self.store_out.flush()

    def stop_store(self):
        """Stops the store after the job; what went wrong with it, or None. It must have served
        the whole run and leave on SIGTERM with status 0."""
        if self.store is None:
            return None
        died = self.store.poll()
        if died is None:
            self.store.send_signal(signal.SIGTERM)
        try:
            rc = self.store.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.store.kill()
            rc = "hung on SIGTERM (killed)"
        if getattr(self, "store_reader", None):
            self.store_reader.join(timeout=5)
        self.store_out.close()
        self.store = None
        if died is not None:
            return f"vigil store exited {died} during the run"
        return None if rc == 0 else f"vigil store exit status {rc} on SIGTERM"

    def submit(self):
        d = self.d
        for sub in ("steps", "ctl", "ckpt", "logs", "state"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for kind, sub in (("ckpt_full", "ckpt"), ("logs_full", "logs")):
            if any(f["kind"] == kind for f in self.plan["faults"]):
                # A file system of its own, so that filling it fills nothing else (root only).
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_TMPFS}", f"chaos-{sub}", str(d / sub)],
                               check=True, capture_output=True)
                self.mounted.append(d / sub)
        env = {"CHAOS_RUN": self.id, "CHAOS_DIR": d, "CHAOS_STEPS": self.args.steps, "PYTHONPATH": SHIM,
               "PYTHON_EXEC": sys.executable}
        if self.plan.get("inprocess"):
            env["CHAOS_INPROCESS"] = 1  # the restartable job (bench/chaos_train.py)
        exports = " ".join(f"{k}={v}" for k, v in env.items())
        spare = "--spare-nodes 1" if self.plan["spare"] else ""
        if self.plan.get("inprocess"):
            spare += f" --in-process-restarts {IN_PROCESS_RESTARTS}"
        if self.plan.get("outside"):
            # Every agent, node rank 0's included, only the store's client (docs/slurm.md).
            self.start_store()
            exports += f" VIGIL_STORE_SECRET={STORE_SECRET}"
            spare += f" --rdzv-conf is_host=false --master-addr 127.0.0.1 --master-port {self.store_port}"
        self.job = sbatch(
            f"""#!/bin/bash
#SBATCH -N {self.nodes} --ntasks-per-node=1 --open-mode=append -p low --time=30
export {exports}
srun {vigil_bin()} run --nproc-per-node {NPROC} --max-restarts {MAX_RESTARTS} --max-requeues {MAX_REQUEUES} \\
    --workers-stop-timeout 5 --heartbeat-timeout 15 --initial-heartbeat-timeout 240 \\
    --section-timeouts step=15 --node-timeout {NODE_TIMEOUT} --stop-lead 40 {spare} \\
    --log-dir {d}/logs --state-dir {d}/state {HERE}/chaos_train.py
""", d)
        log(f"run {self.plan['index']}: job {self.job} on {self.nodes} nodes, spare={self.plan['spare']}, "
            f"in-process={self.plan.get('inprocess')}, store outside={self.plan.get('outside')}, "
            f"faults {[(f['at'], f['kind']) for f in self.plan['faults']]}")

    def state(self):
        try:
            return show_job(self.job)
        except (SlurmError, IndexError):
            return {"JobState": "UNKNOWN"}

    def live_ranks(self):
        """{rank: pid} of ranks alive now (latest start record per rank whose pid lives)."""
        procs = procs_of(self.id)
        out = {}
        for rank, recs in steps_of(self.d).items():
            starts = [r for r in recs if r["ev"] == "start"]
            if starts and starts[-1]["pid"] in procs:
                out[rank] = starts[-1]["pid"]
        return out, procs

    def agents(self, procs):
        """(active {host: pid}, standby {host: pid}): agents with live ranks are active."""
        agent = Path(vigil_bin()).name[:15]  # the kernel's comm keeps 15 characters
        agents = {pid: env.get("SLURMD_NODENAME") for pid, (comm, env, _) in procs.items() if comm == agent}
        busy = {ppid for pid, (comm, env, ppid) in procs.items() if "RANK" in env and comm != agent}
        active = {h: p for p, h in agents.items() if p in busy}
        standby = {h: p for p, h in agents.items() if p not in busy}
        return active, standby

    def at(self, t_first, fault):
        return t_first + fault["at"]

    def inject(self, fault):
        kind, pick = fault["kind"], fault["pick"]
        target, _ = core.CATALOG[kind]
        now = time.time()
        rec = {"kind": kind, "t": now, "at_s": now - self.t_soak}
        if target == "rank":
            ranks, procs = self.live_ranks()
            if not ranks:
                return None
            rank = sorted(ranks)[int(pick * len(ranks))]
            pid = ranks[rank]
            rec.update(rank=rank, pid=pid)
            if kind in ("rank_exit1", "rank_exit0_early", "rank_section_hang"):
                (self.d / "ctl" / f"rank{rank}").write_text(json.dumps({"kind": kind, "pid": pid}))
                rec["via_ctl"] = True
            else:
                sig = {"rank_sigkill": signal.SIGKILL, "rank_sigsegv": signal.SIGSEGV,
                       "rank_sigstop": signal.SIGSTOP, "inprocess_kill": signal.SIGKILL}[kind]
                os.kill(pid, sig)
            return rec
        if target == "head":
            # Node rank 0's agent, while a standby that can take its slot lives (not frozen).
            _, procs = self.live_ranks()
            _, standby = self.agents(procs)
            agent = Path(vigil_bin()).name[:15]
            head = [(pid, env.get("SLURMD_NODENAME")) for pid, (comm, env, _) in procs.items()
                    if comm == agent and env.get("SLURM_NODEID") == "0"]
            ready = [h for h, p in standby.items() if not _stopped(p) and h not in {n for _, n in head}]
            if len(head) != 1 or not ready:
                return None
            pid, host = head[0]
            rec.update(host=host, agent_pid=pid, standby=sorted(ready))
            os.kill(pid, signal.SIGKILL)
            return rec
        if target in ("active", "standby"):
            _, procs = self.live_ranks()
            active, standby = self.agents(procs)
            pool = active if target == "active" else standby
            if not pool or (target == "active" and not active):
                return None
            host = sorted(pool)[int(pick * len(pool))]
            pid = pool[host]
            rec.update(host=host, agent_pid=pid)
            sig = {"sigkill": signal.SIGKILL, "sigstop": signal.SIGSTOP, "sigterm": signal.SIGTERM}[kind.split("_")[1]]
            os.kill(pid, sig)
            if sig == signal.SIGSTOP:
                t = threading.Timer(NODE_TIMEOUT + 8, lambda: _cont(pid))
                t.start()
                self.timers.append(t)
            return rec
        if target == "job":
            st = self.state()
            if st.get("JobState") != "RUNNING":
                return None
            if kind == "scancel_usr1":
                slurm_cmd("scancel", "--signal=USR1", self.job)
            elif kind == "scontrol_requeue":
                slurm_cmd("scontrol", "requeue", self.job)
            elif kind == "preempt":
                # Every node, exclusive: it cannot run beside the job on a node the job leaves free.
                sbatch(f"#!/bin/bash\n#SBATCH -N {self.args.nodes} -p high --exclusive\nsleep 1\n", self.d / "high")
            elif kind == "time_limit":
                run_s = _secs(st.get("RunTime", "0"))
                limit = run_s // 60 + 2
                slurm_cmd("scontrol", "update", f"JobId={self.job}", f"TimeLimit={limit}")
                self.restore_limit = int(st.get("Restarts", "0"))
                started = time.mktime(time.strptime(st["StartTime"], "%Y-%m-%dT%H:%M:%S"))
                # vigil must stop the job once the end is within its --stop-lead (40 s).
                rec.update(limit_min=limit, alloc=self.restore_limit, due_t=started + limit * 60 - 40)
            return rec
        if target == "slurmd":
            nodes = self.job_nodes()
            if not nodes:
                return None
            node = nodes[int(pick * len(nodes))]
            pidfile = SLURM_DIR / "run" / f"slurmd-{node}.pid"
            pid = int(pidfile.read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
            rec.update(host=node, slurmd_pid=pid)
            t = threading.Timer(SLURMD_DOWN_S, lambda: _start_slurmd(node))
            t.start()
            self.timers.append(t)
            self.slurmd_down.append(node)
            return rec
        if target in ("ckpt", "logs"):
            # A file of its own: a second fault while the first holds the space fills nothing more,
            # and the first one's timer frees only its own.
            fill = self.d / target / f"fill-{now:.3f}"
            with open(fill, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * (1 << 16))
                        f.flush()
                except OSError:
                    pass
            rec.update(freed_t=time.time() + FULL_S)
            t = threading.Timer(FULL_S, lambda: fill.unlink(missing_ok=True))
            t.start()
            self.timers.append(t)
            return rec
        if target == "store":
            addr = self.store_addr()
            if addr is None:
                return None
            host, port = addr
            if kind == "store_junk":
                with socket.create_connection((host, port), timeout=5) as s:
                    s.sendall(random.Random(pick).randbytes(512))
                    s.settimeout(3)
                    try:
                        while s.recv(4096):
                            pass
                    except OSError:
                        pass
            else:
                socks = []
                for _ in range(300):
                    try:
                        socks.append(socket.create_connection((host, port), timeout=2))
                    except OSError:
                        break
                time.sleep(1)
                for s in socks:
                    s.close()
                rec["connections"] = len(socks)
            rec["store"] = f"{host}:{port}"
            return rec
        return None

    def job_nodes(self):
        """The nodes the job runs on now (Slurm's NodeList, expanded)."""
        nl = self.state().get("NodeList", "")
        if not nl or nl == "(null)":
            return []
        p = slurm_cmd("scontrol", "show", "hostnames", nl, check=False)
        return sorted(p.stdout.split())

    def store_addr(self):
        if self.store is not None:
            return "127.0.0.1", self.store_port  # the store outside the job
        for e in reversed(events_of(self.d)):
            if e["event"] == "nodes" and e.get("node_rank") == 0 and e.get("store"):
                h, _, p = e["store"].rpartition(":")
                return h, int(p)
        return None

    def first_step(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for recs in steps_of(self.d).values():
                for r in recs:
                    if r["ev"] == "step":
                        return r["t"]
            if self.state().get("JobState") in TERMINAL_STATES:
                return None
            time.sleep(1)
        return None

    def drive(self, run_timeout):
        self.submit()
        t_end = time.time() + run_timeout
        t_first = self.first_step(300)
        pending_faults = list(self.plan["faults"]) if t_first else []
        pending_since = None
        while True:
            st = self.state()
            js = st.get("JobState")
            if js in TERMINAL_STATES:
                break
            if time.time() > t_end:
                log(f"run {self.plan['index']}: job {self.job} still {js} after {run_timeout}s: cancelling")
                slurm_cmd("scancel", self.job, check=False)
                self.ended = False
                break
            if js == "PENDING":
                pending_since = pending_since or time.time()
                if time.time() - pending_since > 240:
                    log(f"run {self.plan['index']}: job {self.job} pending 240s ({st.get('Reason')}): cancelling")
                    slurm_cmd("scancel", self.job, check=False)
                    self.ended = False
                    self.pending_reason = st.get("Reason")
                    break
            else:
                pending_since = None
            if self.restore_limit is not None and int(st.get("Restarts", "0")) > self.restore_limit:
                slurm_cmd("scontrol", "update", f"JobId={self.job}", "TimeLimit=30", check=False)
                self.restore_limit = None
            if pending_faults and time.time() >= t_first + pending_faults[0]["at"]:
                f = pending_faults[0]
                try:
                    rec = self.inject(f)
                except (OSError, SlurmError, KeyError, ValueError) as e:
                    log(f"run {self.plan['index']}: {f['kind']} could not be injected: {e}")
                    rec, f = None, dict(f, at=-1e9)  # given up at once below
                if rec is not None or time.time() > t_first + f["at"] + 20:
                    pending_faults.pop(0)
                    if rec is not None:
                        log(f"run {self.plan['index']}: injected {rec}")
                        self.applied.append(rec)
                    else:
                        log(f"run {self.plan['index']}: {f['kind']} had no target: skipped")
            time.sleep(0.5)
        self.final, self.final_t = self.state(), time.time()
        for t in self.timers:
            t.cancel()
        for node in self.slurmd_down:
            _start_slurmd(node)  # a no-op when its timer did it
        for m in self.mounted:
            for fill in m.glob("fill-*"):
                fill.unlink(missing_ok=True)
        for pid in [r["agent_pid"] for r in self.applied if r["kind"].endswith("sigstop") and "agent_pid" in r]:
            _cont(pid)
        return self.final

    def leftovers(self):
        deadline = time.time() + 20  # Slurm's KillWait is 5 s; generous on a shared machine
        while time.time() < deadline:
            left = procs_of(self.id)
            if not left:
                return []
            time.sleep(0.5)
        left = procs_of(self.id)
        for pid in left:
            _kill(pid)
        return [f"{pid} {comm} on {env.get('SLURMD_NODENAME')}" for pid, (comm, env, _) in left.items()]

    def collect(self):
        steps = steps_of(self.d)
        # Faults asked of a rank count only once the rank did them (its own `fault` record).
        faults = []
        for f in self.applied:
            if f.get("via_ctl"):
                done = [r for r in steps.get(f["rank"], []) if r["ev"] == "fault" and r["pid"] == f["pid"]]
                if not done:
                    continue
                f = dict(f, t=done[0]["t"])
            if f["kind"] == "ckpt_full":
                # Only a save begun while it was full fails; with none, the fault was not exercised.
                failed = core.failed_save(steps.get(0, []), f["t"], f["freed_t"])
                f = dict(f, save_pid=failed[0], save_step=failed[1]) if failed else dict(f, superseded=True)
            if f["kind"] == "logs_full" and self.final_t < f["freed_t"]:
                f = dict(f, superseded=True)  # the job ended while it was full: nothing after to check
            if "due_t" in f:
                # A shortened time limit only counts once the allocation lived to its stop lead
                # (another fault may have ended it first).
                last = max((r["t"] for r in steps.get(0, []) if r.get("alloc") == f["alloc"]), default=0)
                f = dict(f, superseded=last < f["due_t"] - 1)
            faults.append(f)
        gp = subprocess.run([vigil_bin(), "goodput", str(self.d), "--json"], capture_output=True, text=True)
        goodput = json.loads(gp.stdout) if gp.returncode == 0 and gp.stdout.strip() else None
        return {
            "steps": steps, "events": events_of(self.d), "ledger": read_jsonl(self.d / "state" / "ledger.jsonl"),
            "goodput": goodput, "slurm": self.final, "faults": faults, "max_requeues": MAX_REQUEUES,
            "ended": getattr(self, "ended", True) and self.final.get("JobState") in TERMINAL_STATES,
            "store_lines": list(getattr(self, "store_lines", [])),
        }


def _secs(s):
    days, _, hms = s.rpartition("-")
    parts = [int(x) for x in hms.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def _start_slurmd(node):
    """Starts node `node`'s slurmd again, unless it runs (cluster.sh's own command line)."""
    pidfile = SLURM_DIR / "run" / f"slurmd-{node}.pid"
    try:
        os.kill(int(pidfile.read_text().split()[0]), 0)
        return
    except (OSError, ValueError):
        pass
    subprocess.run(["/usr/sbin/slurmd", "-f", str(SLURM_CONF), "-N", node], check=False, capture_output=True)


def _stopped(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return True  # gone


def _cont(pid):
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--nodes", type=int, default=int(os.environ.get("VIGIL_SLURM_NODES", "3")))
    ap.add_argument("--steps", type=int, default=900, help="steps of each job (0.1 s each at least)")
    ap.add_argument("--first-run", type=int, default=0, help="index of the first run (replay)")
    ap.add_argument("--runs", type=int, default=0, help="stop after this many runs (0: minutes only)")
    ap.add_argument("--run-timeout", type=float, default=900)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--lock", nargs="?", default="/tmp/vigil-slurm.lock", const="/tmp/vigil-slurm.lock",
                    help="the shared cluster's lock file (always held; --lock alone names the default)")
    ap.add_argument("--kinds", help="draw faults only from these kinds (comma-separated), to exercise a few")
    ap.add_argument("--gp-tolerance", type=float, default=0.10)
    args = ap.parse_args(argv)
    if args.nodes < 2:
        ap.error("--nodes must be at least 2 (a job without a spare runs on nodes - 1)")
    kinds = args.kinds.split(",") if args.kinds else None
    if kinds and set(kinds) - set(core.CATALOG):
        ap.error(f"--kinds: unknown {sorted(set(kinds) - set(core.CATALOG))}; the catalog: {', '.join(core.CATALOG)}")
    if not Path(vigil_bin()).exists():
        ap.error(f"no vigil binary at {vigil_bin()}: run `cargo build` or set VIGIL_BIN")
    root = args.workdir or Path(tempfile.mkdtemp(prefix=f"vigil-chaos-{args.seed}-"))
    root.mkdir(parents=True, exist_ok=True)
    out = args.out or root / f"chaos-{args.seed}.md"
    t_soak = time.time()
    deadline = t_soak + args.minutes * 60
    cl, results, index = {"started": False}, [], args.first_run
    log(f"seed {args.seed}, {args.minutes} min, work dir {root}")
    try:
        while time.time() < deadline and (not args.runs or index - args.first_run < args.runs):
            plan = core.plan_run(args.seed, index, kinds)
            run = Run(args, plan, root, t_soak)
            with Lock(args.lock):
                ensure_cluster(cl)
                try:
                    final = run.drive(args.run_timeout)
                except (SlurmError, subprocess.TimeoutExpired) as e:
                    # The harness's trouble with Slurm, not vigil's: say so and go on to the next run.
                    log(f"run {index}: harness error, run not counted: {e}")
                    run.leftovers()
                    cluster("stop")
                    index += 1
                    continue
                finally:
                    left = run.leftovers()
                    store_trouble = run.stop_store()
                    slurm_cmd("scancel", "-p", "high", check=False)
                    for m in run.mounted:
                        if m.name == "ckpt":
                            subprocess.run(["umount", "-l", str(m)], check=False)
            data = run.collect()
            for m in run.mounted:
                if m.name == "logs":
                    # Keep what the job wrote there, off the tmpfs.
                    kept = m.with_name("logs.kept")
                    shutil.copytree(m, kept, symlinks=True)
                    subprocess.run(["umount", "-l", str(m)], check=False)
                    shutil.copytree(kept, m, symlinks=True, dirs_exist_ok=True)
                    shutil.rmtree(kept)
            data["leftovers"] = left
            data["gp_tolerance"] = args.gp_tolerance
            viol = core.check_run(data)
            if store_trouble:
                viol.append(("the store outside the job serves the whole run", store_trouble))
            if getattr(run, "pending_reason", None):
                viol.append(("the job ends", f"requeued job pending for ever: {run.pending_reason}"))
            at = time.time() - t_soak
            led = data["ledger"]
            res = {
                "seed": args.seed, "index": index, "faults": data["faults"],
                "survived": bool(led) and led[-1].get("decision") == "finished" and data["ended"],
                "violations": [(a, b, at) for a, b in viol],
                "requeues": int(final.get("Restarts", "0") or 0),
                "goodput": data["goodput"]["goodput_fraction"] if data["goodput"] else None,
                "end": (led[-1].get("decision") if led else "-") + f"/{final.get('JobState')}",
            }
            results.append(res)
            log(f"run {index}: {res['end']}, {len(data['faults'])} faults, violations {viol}")
            (root / f"run-{index}" / "result.json").write_text(json.dumps(res, default=str, indent=1))
            index += 1
            out.write_text(core.table(results) + "\n")
    finally:
        if cl["started"]:
            with Lock(args.lock):
                cluster("stop")
    text = core.table(results)
    out.write_text(text + "\n")
    print(f"runs in {root}; table in {out}; {math.ceil((time.time() - t_soak) / 60)} min")
    print(text)
    return 0 if not any(r["violations"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

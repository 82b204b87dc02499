"""The Slurm mechanisms vigil's allocation handling builds on (issue 10), shown with plain bash jobs,
no vigil: time-limit warnings, preemption with a grace time, requeue with ExcNodeList, step-only
signals, suspend/resume, the job's end time, and --no-requeue. tests/slurm/README.md lists the facts.
"""
import subprocess
import sys
import time
from pathlib import Path

from .slurmlib import TERMINAL_STATES, sbatch, show_job, slurm_cmd, slurm_env, wait_for_path, wait_job

# A step task that logs every signal it gets (with the time), writes its pid, and runs until
# {dir}/stop_<run> exists or for at most $RUN_S seconds. Python, not bash: bash's traps lost one of
# a SIGTERM+SIGCONT pair now and then.
TASK = r"""
import os, signal, time
d, run, node = "@DIR@", os.environ.get("SLURM_RESTART_COUNT", "0"), os.environ["SLURM_NODEID"]
log = open(f"{d}/task_{run}_{node}.log", "a", buffering=1)
log.write(f"node {os.environ['SLURMD_NODENAME']} pid {os.getpid()}\n")


def on(sig, frame):
    log.write(f"got {signal.Signals(sig).name[3:]} {time.time()}\n")


for s in ("TERM", "INT", "HUP", "CONT", "USR1", "USR2", "TSTP"):
    signal.signal(getattr(signal, "SIG" + s), on)
end = time.time() + float(os.environ.get("RUN_S", "120"))
while time.time() < end and not os.path.exists(f"{d}/stop_{run}"):
    time.sleep(0.1)
log.write("end\n")
"""


def write_task(d: Path) -> Path:
    """Writes the task; returns a bash script that runs it (what `srun bash` takes)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "task.py").write_text(TASK.replace("@DIR@", str(d)))
    p = d / "task.sh"
    p.write_text(f"#!/bin/bash\nexec {sys.executable} {d}/task.py\n")
    return p


def log(d: Path, node_id: int, run: int = 0) -> list:
    f = d / f"task_{run}_{node_id}.log"
    return f.read_text().splitlines() if f.exists() else []


def got(lines: list, sig: str) -> list:
    """The times at which the task logged signal `sig`."""
    return [float(x.split()[2]) for x in lines if x.startswith(f"got {sig} ")]


def output(d: Path, job_id: int) -> str:
    f = d / f"slurm-{job_id}.out"
    return f.read_text() if f.exists() else "(no output)"


def wait_until(cond, timeout=60.0, what="condition"):
    """Polls an external daemon's effect (Slurm has no notification); the bound is a failure."""
    deadline = time.monotonic() + timeout
    while not (v := cond()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.1)
    return v


def proc_state(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("State:"):
            return line.split()[1]
    return "?"


def task_pid(d: Path, node_id: int) -> int:
    wait_for_path(d / f"task_0_{node_id}.log")
    return int(wait_until(lambda: (log(d, node_id) or [""])[0].partition(" pid ")[2], 30, "pid"))


def end_time(job_id: int) -> int:
    p = subprocess.run(
        ["squeue", "-h", "-j", str(job_id), "-o", "%e"],
        env=slurm_env(SLURM_TIME_FORMAT="%s"), capture_output=True, text=True, timeout=60, check=True,
    )
    return int(p.stdout.strip())


def test_signal_before_the_time_limit_reaches_the_step_tasks_not_the_batch_shell(slurm_cluster, tmp_path):
    task = write_task(tmp_path)
    job_id = sbatch(
        f"""#!/bin/bash
#SBATCH -N 2 --time=1 --signal=TERM@50
trap 'echo batch got TERM' TERM
srun bash {task} & wait $!
echo "srun rc=$?"
""",
        tmp_path,
    )
    wait_for_path(tmp_path / "task_0_0.log")
    end = end_time(job_id)
    # The task ignores TERM; slurmctld checks the time every 30 s, so the warning arrives 20-50 s
    # before the end, then the limit's SIGTERM, then SIGKILL after KillWait.
    info = wait_job(job_id, timeout=150)
    assert info["JobState"] == "TIMEOUT", info
    warned = 0
    for node_id in (0, 1):
        lines = log(tmp_path, node_id)
        terms = got(lines, "TERM")
        # Killed by the limit, never ending on its own.
        assert "end" not in lines, lines
        if len(terms) >= 2:
            # The warning, then the limit's own SIGTERM (SIGKILL follows after KillWait).
            # slurmctld looks every 30 s: the warning comes up to 30 s before or after the asked
            # 50 s (seen: 36-58 s).
            lead = end - terms[0]
            assert 15 <= lead <= 82 and terms[1] >= end - 1, f"warning {lead:.1f}s before the end {end}: {lines}"
            warned += 1
    # Once in CI (a loaded 2-core machine) one task logged only the limit's SIGCONT, no SIGTERM at
    # all; a warning must still reach at least one of the two nodes' tasks.
    assert warned >= 1, [log(tmp_path, n) for n in (0, 1)]
    out = output(tmp_path, job_id)
    assert "DUE TO TIME LIMIT" in out, out
    assert "batch got TERM" not in out.split("CANCELLED")[0], out


def test_end_time_from_squeue_and_scontrol_update_timelimit(slurm_cluster, tmp_path):
    task = write_task(tmp_path)
    job_id = sbatch(f"#!/bin/bash\n#SBATCH -N 1 --time=5\nenv | sort > {tmp_path}/batch.env\nsrun bash {task}\n", tmp_path)
    wait_for_path(tmp_path / "task_0_0.log")
    start = int(subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%S"], env=slurm_env(SLURM_TIME_FORMAT="%s"),
                               capture_output=True, text=True, check=True).stdout)
    assert end_time(job_id) == start + 5 * 60
    slurm_cmd("scontrol", "update", f"JobId={job_id}", "TimeLimit=7")
    assert end_time(job_id) == start + 7 * 60
    # Slurm 22.05 does not set SLURM_JOB_END_TIME (23.02 does).
    assert "SLURM_JOB_END_TIME=" not in wait_for_path(tmp_path / "batch.env").read_text()
    (tmp_path / "stop_0").touch()
    assert wait_job(job_id)["JobState"] == "COMPLETED"


def test_preemption_sends_sigterm_waits_the_grace_and_requeues(slurm_cluster, tmp_path):
    # Once in a full CI run (2026-11-23) a preempted task logged Slurm's SIGCONT and no SIGTERM at
    # all; alone it passed. So a run where some task saw no SIGTERM is tried once more, in a fresh
    # directory, and the second run must show every fact.
    try:
        preemption_facts(tmp_path / "try1")
    except NoTermSeen:
        preemption_facts(tmp_path / "try2", retry=False)


class NoTermSeen(AssertionError):
    pass


def preemption_facts(tmp_path, retry=True):
    low = tmp_path / "low"
    task = write_task(low)
    low_id = sbatch(
        f"""#!/bin/bash
#SBATCH -N 3 -p low --open-mode=append
echo "run ${{SLURM_RESTART_COUNT:-0}}"
[ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ] && touch {low}/stop_1
srun bash {task}
""",
        low,
    )
    wait_for_path(low / "task_0_2.log")
    # --exclusive: the high job needs a whole node, so it cannot share one with the low job.
    high_id = sbatch("#!/bin/bash\n#SBATCH -N 1 -p high --exclusive\nsleep 1\n", tmp_path / "high")
    t_submit = time.time()
    info = wait_job(high_id, timeout=120)
    assert info["JobState"] == "COMPLETED", info
    info = wait_job(low_id, timeout=120)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info
    for node_id in range(3):
        lines = log(low, node_id)
        terms = got(lines, "TERM")
        if retry and not terms:
            raise NoTermSeen(lines)
        # SIGTERM (and SIGCONT) at once; after GraceTime (20 s, checked periodically) the requeue's
        # SIGCONT and SIGTERM, then SIGKILL after KillWait: the task ignores SIGTERM, so it never
        # reaches its end.
        assert len(terms) >= 2 and terms[0] - t_submit < 15 and terms[1] - terms[0] >= 20, lines
        assert got(lines, "CONT") and "end" not in lines, lines
        assert log(low, node_id, run=1)[-1] == "end"
    assert output(low, low_id).count("run ") == 2


def test_requeue_from_a_step_task_then_exclude_a_node(slurm_cluster, tmp_path):
    task = write_task(tmp_path)
    (tmp_path / "requeue.sh").write_text(
        f"""#!/bin/bash
r=${{SLURM_RESTART_COUNT:-0}}
if [ $r = 0 ] && [ $SLURM_NODEID = 0 ]; then
    out={tmp_path}/requeue.txt
    trap "echo got TERM >> $out" TERM
    scontrol update JobId=$SLURM_JOB_ID ExcNodeList=n2 >> $out 2>&1; echo "update-running rc=$?" >> $out
    scontrol requeue $SLURM_JOB_ID >> $out 2>&1; echo "requeue rc=$?" >> $out
    # The requeue's SIGTERM reaches every process of the step, scontrol too: it must ignore it.
    (trap '' TERM; scontrol update JobId=$SLURM_JOB_ID ExcNodeList=n2 >> $out 2>&1); echo "update-after rc=$?" >> $out
fi
[ $r = 1 ] && touch {tmp_path}/stop_1
exec bash {task}
"""
    )
    job_id = sbatch(f"#!/bin/bash\n#SBATCH -N 2\nsrun bash {tmp_path}/requeue.sh\n", tmp_path)
    info = wait_job(job_id, timeout=120)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info
    lines = (tmp_path / "requeue.txt").read_text().splitlines()
    # After the requeue the job is COMPLETING: the task had until KillWait's SIGKILL to exclude n2.
    assert [x for x in lines if x != "got TERM"] == [f"Job is no longer pending execution for job {job_id}", "update-running rc=1",
                     "requeue rc=0", "update-after rc=0"], lines
    assert info["ExcNodeList"] == "n2" and info["NodeList"] == "n[1,3]", info
    assert [log(tmp_path, i, run=1)[0].split()[1] for i in (0, 1)] == ["n1", "n3"]


def test_scancel_signal_reaches_step_tasks_but_full_also_reaches_srun(slurm_cluster, tmp_path):
    task = write_task(tmp_path)
    job_id = sbatch(
        f"""#!/bin/bash
#SBATCH -N 2
trap 'echo batch got TERM' TERM
srun bash {task} & wait $!
echo "srun rc=$?"
wait
""",
        tmp_path,
    )
    wait_for_path(tmp_path / "task_0_1.log")
    slurm_cmd("scancel", "--signal=TERM", job_id)
    for node_id in (0, 1):
        wait_until(lambda: got(log(tmp_path, node_id), "TERM"), 30, f"TERM on node {node_id}")
    # Step-only: the tasks live on and the batch shell got nothing.
    assert show_job(job_id)["JobState"] == "RUNNING"
    assert "batch got TERM" not in output(tmp_path, job_id)
    # --full signals the batch shell and its children too: srun takes SIGTERM as "kill the step".
    slurm_cmd("scancel", "--signal=TERM", "--full", job_id)
    info = wait_job(job_id, timeout=60)
    out = output(tmp_path, job_id)
    assert "batch got TERM" in out and "srun: forcing job termination" in out, out
    assert "task 0: Killed" in out and all("end" not in log(tmp_path, i) for i in (0, 1)), out
    assert info["JobState"] in TERMINAL_STATES


def test_suspend_stops_and_resume_continues_the_tasks(slurm_cluster, tmp_path):
    task = write_task(tmp_path)
    job_id = sbatch(f"#!/bin/bash\n#SBATCH -N 1\nsrun bash {task}\n", tmp_path)
    pid = task_pid(tmp_path, 0)
    slurm_cmd("scontrol", "suspend", job_id)
    # SIGTSTP first, SIGSTOP a moment later (the task traps TSTP, so only SIGSTOP stops it).
    wait_until(lambda: proc_state(pid) == "T", 30, "task stopped")
    assert show_job(job_id)["JobState"] == "SUSPENDED"
    slurm_cmd("scontrol", "resume", job_id)
    wait_until(lambda: proc_state(pid) in "SR", 30, "task continued")
    lines = wait_until(lambda: got(log(tmp_path, 0), "CONT") and log(tmp_path, 0), 30, "SIGCONT")
    assert got(lines, "TSTP")[0] < got(lines, "CONT")[-1] and not got(lines, "TERM"), lines
    (tmp_path / "stop_0").touch()
    info = wait_job(job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", info


def test_no_requeue_job_refuses_scontrol_requeue(slurm_cluster, tmp_path):
    task = write_task(tmp_path)
    job_id = sbatch(f"#!/bin/bash\n#SBATCH -N 1 --no-requeue\nsrun bash {task}\n", tmp_path)
    wait_for_path(tmp_path / "task_0_0.log")
    assert show_job(job_id)["Requeue"] == "0"
    p = slurm_cmd("scontrol", "requeue", job_id, check=False)
    assert p.returncode == 1
    assert p.stderr.strip() == f"Requested operation is presently disabled for job {job_id}", p.stderr
    (tmp_path / "stop_0").touch()
    assert wait_job(job_id)["JobState"] == "COMPLETED"


def test_a_preempted_job_that_ends_within_the_grace_is_requeued_only_by_itself(slurm_cluster, tmp_path):
    # Job A's task exits 0 on SIGTERM; job B's task runs `scontrol requeue` first. Both are in 'low'
    # and preempted by one exclusive 'high' job over all nodes.
    jobs = {}
    for name, requeue in (("a", False), ("b", True)):
        d = tmp_path / name
        d.mkdir()
        (d / "task.py").write_text(
            f"""
import os, signal, subprocess, sys, time
if os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
    open("{d}/rerun", "w").close()
    sys.exit(0)


def on_term(sig, frame):
    if {requeue}:
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]])
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
open("{d}/started", "w").close()
time.sleep(120)
"""
        )
        jobs[name] = sbatch(f"#!/bin/bash\n#SBATCH -N 1 -p low\nsrun {sys.executable} {d}/task.py\n", d)
        wait_for_path(d / "started")
    high = sbatch("#!/bin/bash\n#SBATCH -N 3 -p high --exclusive\nsleep 1\n", tmp_path / "high")
    assert wait_job(high, timeout=120)["JobState"] == "COMPLETED"
    a = wait_job(jobs["a"], timeout=120)
    assert a["JobState"] == "COMPLETED" and a["Restarts"] == "0", a  # ended in the grace: done
    b = wait_job(jobs["b"], timeout=120)
    assert b["JobState"] == "COMPLETED" and b["Restarts"] == "1", b
    assert (tmp_path / "b" / "rerun").exists() and not (tmp_path / "a" / "rerun").exists()

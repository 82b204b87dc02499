"""Issue 12 on the real Slurm cluster: `vigil launch RECIPE` submits a real 2-node job running
`srun vigil run`; `vigil status` shows it RUNNING then COMPLETED, `vigil logs` shows the ranks'
output, `vigil cancel` ends a running one, an unknown partition is refused with the real `sinfo`
list and nothing is submitted, an interactive launch's attach.sh runs a command inside the
allocation, and a secret's value is in no file vigil wrote.

The ranks of these jobs say they are up (a marker file and a line of output), then wait for a
`release` file the test writes, so every state is observed while it holds, not raced.
"""
import os
import re
import subprocess
import time
from pathlib import Path

from harness import REPO, base_env, run_vigil

from .slurmlib import SLURM_CONF, show_job, slurm_cmd, wait_job

RANK = r"""
import os, sys, time, pathlib
out = pathlib.Path(sys.argv[1])
rank = int(os.environ["RANK"])
print(f"rank {rank} ready on {os.environ.get('SLURMD_NODENAME')} hf_token_len={len(os.environ.get('HF_TOKEN', ''))}", flush=True)
print(f"rank {rank} says hello on stderr", file=sys.stderr, flush=True)
(out / f"started_{rank}").write_text(str(os.getpid()))
while not (out / "release").exists():
    time.sleep(0.1)
print(f"rank {rank} done", flush=True)
"""

SECRET = "hf_Zq8vN3secretvalue0xDEADBEEF"


def env_for(tmp_path, **extra):
    return base_env(VIGIL_HOME=tmp_path / "home", SLURM_CONF=SLURM_CONF, **extra)


def vigil(tmp_path, *args, env=None, timeout=120):
    return run_vigil(list(args), cwd=tmp_path, env=env or env_for(tmp_path), timeout=timeout)


def poll(pred, timeout, what):
    """Polls a condition on external daemons (no notification interface); the bound is a failure."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def launch(tmp_path, *extra, env=None):
    """Launches examples/recipes/toy.toml with the waiting rank script; returns (id, job id, dir)."""
    (tmp_path / "rank.py").write_text(RANK)
    p = vigil(
        tmp_path, "launch", str(REPO / "examples" / "recipes" / "toy.toml"),
        "--script", "rank.py", "--set", "vigil.workers_stop_timeout=2", *extra, "--", str(tmp_path),
        env=env,
    )
    assert p.returncode == 0, p.stderr
    m = re.fullmatch(
        r"Experiment Status for (toy_\d{8}-\d{6})\n\nTask 0: toy\n- Status: (PENDING|RUNNING|CONFIGURING)\n"
        r"- Executor: SlurmExecutor on debug\n- Job id: (\d+)\n- Local Directory: (.+)\n",
        p.stdout,
    )
    assert m, p.stdout
    exp_id, job_id, exp_dir = m.group(1), m.group(3), Path(m.group(4))
    assert exp_dir == tmp_path / "home" / "experiments" / "toy" / exp_id
    return exp_id, job_id, exp_dir


def status_of(tmp_path, exp):
    p = vigil(tmp_path, "status", exp)
    assert p.returncode == 0, p.stderr
    m = re.search(r"^- Status: (\S+)", p.stdout, re.M)
    assert m, p.stdout
    return m.group(1), p.stdout


def all_started(tmp_path, n=4):
    return all((tmp_path / f"started_{r}").exists() for r in range(n))


def test_launch_status_logs_list_and_no_secret_written(slurm_cluster, tmp_path):
    env = env_for(tmp_path, HF_TOKEN=SECRET)
    exp, job, d = launch(tmp_path, "--set", 'secrets=["HF_TOKEN"]', env=env)
    poll(lambda: all_started(tmp_path), 120, "all four ranks to start")
    state, out = status_of(tmp_path, exp)
    assert state == "RUNNING" and "Exit code" not in out, out
    node_list = show_job(int(job))["NodeList"]
    assert f"- Job id: {job}\n" in out and f"- Nodes: {node_list}\n" in out, out
    nodes = slurm_cmd("scontrol", "show", "hostnames", node_list).stdout.split()
    assert len(nodes) == 2

    # The ranks' own output, by global rank (rank 3 is node 1's local rank 1).
    p = vigil(tmp_path, "logs", exp, "--rank", "3")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"rank 3 ready on {nodes[1]} hf_token_len={len(SECRET)}\n"), p.stdout
    assert "rank 3 says hello on stderr" in p.stderr
    p = vigil(tmp_path, "list")
    assert p.returncode == 0 and re.search(rf"^{exp}\s+{job}\s+RUNNING\s+{d}$", p.stdout, re.M), p.stdout

    # `logs -f` follows the job's log until the job ends.
    follow = subprocess.Popen(
        [os.environ.get("VIGIL_BIN") or str(REPO / "target" / "debug" / "vigil"), "logs", "-f"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    (tmp_path / "release").write_text("")
    info = wait_job(int(job), timeout=120)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", info
    followed, ferr = follow.communicate(timeout=60)
    assert follow.returncode == 0, ferr
    for r in range(4):
        assert f"rank {r} done" in followed, followed

    state, out = status_of(tmp_path, exp)
    assert state == "COMPLETED" and "- Exit code: 0:0" in out, out
    # vigil's own view, from the records under the experiment directory.
    assert re.search(r"^vigil: 1 allocation, 0 in-job restarts, 0 requeues$", out, re.M), out
    # By directory and by name (its latest launch), as by id.
    assert status_of(tmp_path, str(d)) == (state, out)
    assert status_of(tmp_path, "toy") == (state, out)
    p = vigil(tmp_path, "logs", exp)
    assert p.returncode == 0
    for r in range(4):
        assert f"]:rank {r} ready on {nodes[r // 2]}" in p.stdout, p.stdout
    assert p.stdout == (d / f"{job}.log").read_text()

    # The experiment directory holds the recipe, the script, the log and vigil's records.
    assert (d / "recipe.toml").exists() and (d / "sbatch.sh").exists()
    assert len(list((d / "runs").glob("vigil_*/events.jsonl"))) == 2
    assert (d / "state" / "ledger.jsonl").exists()
    assert 'secrets = ["HF_TOKEN"]' in (d / "recipe.toml").read_text()

    # The secret reached the ranks (its length above), and its value is in no file written.
    written = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert len(written) > 10
    for f in written:
        assert SECRET.encode() not in f.read_bytes(), f


def test_cancel_ends_a_running_job(slurm_cluster, tmp_path):
    exp, job, d = launch(tmp_path)
    poll(lambda: all_started(tmp_path), 120, "all four ranks to start")
    # The agents are the ranks' parents.
    agents = {int(Path(f"/proc/{(tmp_path / f'started_{r}').read_text()}/stat").read_text().rsplit(")", 1)[1].split()[1])
              for r in range(4)}
    assert len(agents) == 2 and all(b"vigil" in Path(f"/proc/{a}/cmdline").read_bytes() for a in agents)
    p = vigil(tmp_path, "cancel", exp)
    assert p.returncode == 0 and p.stdout == f"cancelled job {job} (experiment {exp})\n", (p.stdout, p.stderr)
    info = wait_job(int(job), timeout=120)
    assert info["JobState"] == "CANCELLED", info
    # It stays cancelled once both agents are gone: vigil took scancel's SIGTERM for a stop
    # and requeued the job before `vigil cancel` marked it Requeue=0 first.
    for a in agents:
        poll(lambda: not Path(f"/proc/{a}").exists(), 60, f"agent {a} to be gone")
    info = show_job(int(job))
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", info
    state, out = status_of(tmp_path, exp)
    assert state == "CANCELLED" and re.search(r"^vigil: 1 allocation, .*, 0 requeues$", out, re.M), out
    p = vigil(tmp_path, "cancel", exp)
    assert p.returncode == 0 and "already ended: CANCELLED" in p.stdout, p.stdout


def test_unknown_partition_is_refused_with_sinfos_list(slurm_cluster, tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    before = slurm_cmd("squeue", "-h", "-t", "all", "-o", "%i").stdout.split()
    p = vigil(
        tmp_path, "launch", str(REPO / "examples" / "recipes" / "toy.toml"), "--script", "rank.py",
        "--partition", "general", "--name", "nopart",
    )
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    real = []
    for part in slurm_cmd("sinfo", "-h", "-o", "%R").stdout.split():
        if part not in real:
            real.append(part)
    assert set(real) == {"debug", "urgent", "low", "high"}
    assert p.stderr == (
        f"vigil launch: error: partition `general` does not exist here; sinfo lists: {', '.join(real)}; "
        "give one of them with --partition or `partition = ...` (nothing was submitted)\n"
    )
    assert slurm_cmd("squeue", "-h", "-t", "all", "-o", "%i").stdout.split() == before
    assert slurm_cmd("squeue", "-h", "-t", "all", "-n", "nopart").stdout.strip() == ""
    assert not (tmp_path / "home" / "experiments" / "nopart").exists()


def test_interactive_allocation_and_attach(slurm_cluster, tmp_path):
    p = vigil(tmp_path, "launch", "--interactive", "--name", "dbg", "--nodes", "2", "--nproc-per-node", "1",
              "-p", "debug", "-t", "00:10:00")
    assert p.returncode == 0, p.stderr
    job = re.search(r"^- Job id: (\d+)$", p.stdout, re.M).group(1)
    d = Path(re.search(r"^- Local Directory: (.+)$", p.stdout, re.M).group(1))
    attach = d / "attach.sh"
    assert f"- Attach: bash {attach}" in p.stdout
    assert subprocess.run(["bash", "-n", str(attach)]).returncode == 0
    info = wait_job(int(job), timeout=120, states={"RUNNING"})
    first = slurm_cmd("scontrol", "show", "hostnames", info["NodeList"]).stdout.split()[0]

    # attach.sh runs a command inside the allocation, on its first node; again after it ended
    # (a dropped connection): the allocation is still there.
    for _ in range(2):
        r = subprocess.run(
            ["bash", str(attach), "bash", "-c", 'echo "inside $SLURM_JOB_ID on $SLURMD_NODENAME"'],
            env=env_for(tmp_path), capture_output=True, text=True, timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"inside {job} on {first}\n", (r.stdout, r.stderr)
    r = vigil(tmp_path, "attach", "dbg", "--", "printenv", "SLURM_JOB_ID")
    assert r.returncode == 0 and r.stdout == f"{job}\n", (r.stdout, r.stderr)
    state, out = status_of(tmp_path, "dbg")
    assert state == "RUNNING" and f"- Attach: bash {attach}" in out, out

    assert vigil(tmp_path, "cancel", "dbg").returncode == 0
    assert wait_job(int(job), timeout=120)["JobState"] == "CANCELLED"
    r = subprocess.run(["bash", str(attach), "true"], env=env_for(tmp_path), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "the allocation has ended" in r.stderr, r.stderr

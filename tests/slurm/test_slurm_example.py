"""Field finding 21 (issue 25): the complete Slurm example of docs/slurm.md runs as written.

The test submits examples/slurm/train.sbatch itself, changing only what a test must (sbatch's
--nodes/--time/--output on the command line; JOB_DIR, NPROC, STOP_LEAD and VIGIL through the
environment the script reads). The container is simulated as in test_lifecycle_blame.py: the
srun'd vigil runs with a PATH without Slurm's client, so it must take the end time from the script
and leave the requeue to it. The job runs examples/toy_train.py on 2 nodes, is stopped at one step
ahead of its 1-minute limit, requeued by the script, resumes from its checkpoint and finishes.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

from harness import REPO, vigil_bin

from .slurmlib import slurm_env, wait_job
from .test_lifecycle_blame import no_slurm_path

EXAMPLE = REPO / "examples" / "slurm" / "train.sbatch"
TOY = REPO / "examples" / "toy_train.py"
NPROC = 2


def fake_container_vigil(d: Path) -> Path:
    """vigil as a container runs it: no Slurm client on PATH (FAKE: no pyxis on the test cluster).
    Without scontrol vigil cannot look up node rank 0's NodeAddr, and the test cluster's node names
    are no host names (in a real container they resolve): hence --master-addr."""
    wrapper = d / "vigil-in-FAKE-container"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"PATH='{no_slurm_path(d)}'; export PATH\n"
        'cmd="$1"; shift\n'
        f"exec '{vigil_bin()}' \"$cmd\" --master-addr 127.0.0.1 \"$@\"\n"
    )
    wrapper.chmod(0o755)
    return wrapper


def submit_example(d: Path, env: dict, sbatch_args: list, train: list) -> int:
    p = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={d}", f"--output={d}/slurm-%j.out", *sbatch_args,
         str(EXAMPLE), *train],
        env=slurm_env(**env), capture_output=True, text=True, timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return int(p.stdout.strip().split(";")[0])


def test_the_example_batch_script_stops_before_the_limit_requeues_and_finishes(slurm_cluster, tmp_path):
    job_dir = tmp_path / "shared"
    steps, world = 1000, 2 * NPROC  # 50 s of steps: more than a 1-minute allocation less its 20 s lead
    env = {"JOB_DIR": job_dir, "NPROC": NPROC, "STOP_LEAD": 20, "VIGIL": fake_container_vigil(tmp_path),
           "PYTHON_EXEC": sys.executable, "IMAGE": ""}  # IMAGE: no pyxis here
    job_id = submit_example(
        tmp_path, env, ["--nodes=2", "--time=1"],
        [str(TOY), "--steps", str(steps), "--step-time", "0.05", "--ckpt-every", "0",
         "--ckpt-dir", str(job_dir / "ckpt")],
    )
    info = wait_job(job_id, timeout=420)
    out_file = tmp_path / f"slurm-{job_id}.out"
    out = out_file.read_text() if out_file.exists() else "(no output)"
    allocations = int(info["Restarts"]) + 1
    assert info["JobState"] == "COMPLETED" and allocations >= 2, f"{info}\n{out}"
    assert "DUE TO TIME LIMIT" not in out, out  # stopped ahead of the limit every time
    assert out.count("[vigil] node 1 of 2;") == allocations, out  # two nodes, one agent each
    # The script's lines reached vigil: the end time, the requeue file, the store's secret.
    assert out.count("Slurm's commands are not on PATH here") == allocations, out
    assert "the end time is SLURM_JOB_END_TIME's" in out, out
    assert out.count("the batch script requeues Slurm job") == allocations - 1, out
    assert "VIGIL_STORE_SECRET is not set" not in out, out
    assert "could not requeue" not in out and "cannot learn when" not in out, out

    # The ledger in the shared state directory: stopped at the end time, requeued, finished.
    ledger = job_dir / f"state-{job_id}" / "ledger.jsonl"
    assert ledger.exists(), f"no ledger at {ledger}\n{out}"
    records = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    assert [r["decision"] for r in records] == ["requeue"] * (allocations - 1) + ["finished"], records
    assert all(r["stop_trigger"] in ("end-time", "time-limit") for r in records[:-1]), records

    # The ranks' own lines: every rank stopped at one agreed step and resumed after it.
    stops = re.findall(r"rank (\d+): stopped at step (\d+)", out)
    resumes = re.findall(r"rank (\d+): resumed from step (\d+)", out)
    for a in range(allocations - 1):
        stopped = stops[a * world:(a + 1) * world]
        assert sorted(int(r) for r, _ in stopped) == list(range(world)), stops
        (s,) = {int(step) for _, step in stopped}
        resumed = resumes[a * world:(a + 1) * world]
        assert sorted(int(r) for r, _ in resumed) == list(range(world)), resumes
        assert {int(step) for _, step in resumed} == {s}, (s, resumes)
    assert sorted(int(r) for r in re.findall(rf"rank (\d+): done after {steps} steps", out)) == list(range(world)), out
    assert not (job_dir / f"requeue.{job_id}").exists()
    assert (job_dir / "logs").is_dir() and any((job_dir / "logs").iterdir())



# --- the script's own logic, without a cluster (the pyxis variant cannot run on the test cluster) --

ECHO_ARGS = 'for a in "$@"; do echo "$a"; done\nexit 75'  # a node's vigil stopped for the time limit
ASK_REQUEUE = 'echo requeue > "$VIGIL_REQUEUE_FILE"\nexit 75'  # node rank 0 asks the script to requeue


def run_script(d: Path, srun_body: str, env: dict, *args) -> subprocess.CompletedProcess:
    """Runs the example with FAKE srun/squeue/scontrol on PATH: srun runs `srun_body`; scontrol
    records its arguments in JOB_DIR/scontrol.log."""
    b = d / "FAKE-slurm-bin"
    b.mkdir(exist_ok=True)
    (b / "srun").write_text(f"#!/bin/sh\n{srun_body}\n")
    (b / "squeue").write_text("#!/bin/sh\necho 1795551234\n")
    (b / "scontrol").write_text('#!/bin/sh\necho "scontrol $*" >> "$JOB_DIR/scontrol.log"\n')
    for f in b.iterdir():
        f.chmod(0o755)
    base = {"PATH": f"{b}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_SUBMIT_DIR": str(d),
            "SLURM_JOB_PARTITION": "debug", "JOB_DIR": str(d / "shared")}
    work = d / "work"  # the job's working directory (sbatch --chdir), not the submit directory
    work.mkdir(exist_ok=True)
    return subprocess.run(["bash", str(EXAMPLE), *args], env={**base, **env}, cwd=work,
                          capture_output=True, text=True, timeout=60)


def scontrol_calls(d: Path) -> str:
    f = d / "shared" / "scontrol.log"
    return f.read_text() if f.exists() else ""


def test_the_example_runs_vigil_in_the_image_through_pyxis_when_image_is_set(tmp_path):
    p = run_script(tmp_path, ECHO_ARGS, {"IMAGE": "nvcr.io#nvidia/pytorch:25.01-py3"}, "train.py", "--lr", "1")
    shared, work = tmp_path / "shared", tmp_path / "work"
    args = p.stdout.splitlines()
    assert p.returncode == 75, p  # srun's status: nobody asked for a requeue
    assert args[:4] == ["--kill-on-bad-exit=0", "--container-image=nvcr.io#nvidia/pytorch:25.01-py3",
                        f"--container-mounts={shared}:{shared},{work}:{work}",
                        f"--container-workdir={work}"], args
    assert args[4:6] == ["vigil", "run"] and args[-3:] == ["train.py", "--lr", "1"], args
    assert f"--state-dir\n{shared}/state-42\n" in p.stdout and "--stop-lead\n480\n" in p.stdout, args
    assert "requeue" not in scontrol_calls(tmp_path), p


def test_the_example_without_an_image_runs_vigil_on_the_node_and_requeues_only_on_request(tmp_path):
    p = run_script(tmp_path, ECHO_ARGS, {"IMAGE": ""}, "train.py")
    assert p.returncode == 75 and "--container" not in p.stdout, p
    assert p.stdout.splitlines()[:3] == ["--kill-on-bad-exit=0", "vigil", "run"], p
    assert "requeue" not in scontrol_calls(tmp_path), p
    p = run_script(tmp_path, ASK_REQUEUE, {"IMAGE": ""}, "train.py")
    assert p.returncode == 0 and "scontrol requeue 42" in scontrol_calls(tmp_path), p


def test_the_example_without_a_training_command_says_how_to_call_it(tmp_path):
    p = run_script(tmp_path, ECHO_ARGS, {})
    assert p.returncode == 2 and "usage: sbatch train.sbatch TRAIN.py [ARGS...]" in p.stderr, p
    assert p.stdout == "", p  # srun never ran

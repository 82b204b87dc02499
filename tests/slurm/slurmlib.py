"""Helpers for tests against the real local Slurm cluster of tests/slurm/cluster.sh.

slurmctld is an external daemon with no notification interface, so waiting on a job's state polls
`scontrol show job -o`; every bound is a generous failure limit, never a timing goal.
"""
import os
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLUSTER_SH = HERE / "cluster.sh"
SLURM_DIR = Path(os.environ.get("VIGIL_SLURM_DIR", "/tmp/vigil-slurm"))
SLURM_CONF = SLURM_DIR / "etc" / "slurm.conf"
NUM_NODES = int(os.environ.get("VIGIL_SLURM_NODES", "3"))

TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
     "BOOT_FAIL", "DEADLINE"}
)


class SlurmError(RuntimeError):
    pass


def slurm_env(**extra) -> dict:
    """The environment for Slurm commands: this cluster's config, no SLURM_* leaking in from an
    enclosing job (sbatch would take SLURM_JOB_ID and friends for options)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(SLURM_CONF)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def slurm_cmd(*args, timeout=60, check=True) -> subprocess.CompletedProcess:
    """Runs one Slurm client command (sbatch, scontrol, squeue, ...) against the test cluster."""
    p = subprocess.run(
        [str(a) for a in args], env=slurm_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and p.returncode != 0:
        raise SlurmError(f"{' '.join(map(str, args))} exited {p.returncode}: {p.stderr.strip()}")
    return p


def cluster(action: str, timeout=300) -> subprocess.CompletedProcess:
    """Runs `cluster.sh start|stop|status`; output captured, never raises on a non-zero exit."""
    return subprocess.run(
        ["bash", str(CLUSTER_SH), action],
        env=slurm_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def sbatch(script_text: str, workdir: Path, extra_args=()) -> int:
    """Writes the batch script into workdir and submits it from there; returns the job id.

    Without -o/-e in the script or extra_args, the job's output goes to workdir/slurm-<id>.out.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    n = len(list(workdir.glob("job*.sbatch")))
    script = workdir / f"job{n}.sbatch"
    script.write_text(script_text)
    script.chmod(0o755)
    p = slurm_cmd("sbatch", "--parsable", f"--chdir={workdir}", *extra_args, script)
    # --parsable prints "<id>" or "<id>;<cluster>"
    return int(p.stdout.strip().split(";")[0])


def parse_show_job(line: str) -> dict:
    """Parses one line of `scontrol show job -o` (or `show node -o`) into {field: value}.

    Fields are space-separated Key=Value pairs, but a few values contain spaces (Command, OS,
    Reason with text, ...), so a token without '=' belongs to the previous value."""
    fields = {}
    key = None
    for tok in line.strip().split(" "):
        if not tok:
            continue
        k, eq, v = tok.partition("=")
        if eq and k and " " not in k:
            key = k
            fields[key] = v
        elif key is not None:
            fields[key] += " " + tok
    return fields


def show_job(job_id: int) -> dict:
    """`scontrol show job -o <id>` as a dict; with accounting off, known for MinJobAge seconds."""
    p = slurm_cmd("scontrol", "show", "job", "-o", str(job_id))
    line = p.stdout.strip().splitlines()[0]
    return parse_show_job(line)


def job_state(job_id: int) -> str:
    """The job's base state (JobState), e.g. PENDING, RUNNING, COMPLETED."""
    return show_job(job_id)["JobState"]


def wait_job(job_id: int, timeout: float = 120.0, states=TERMINAL_STATES) -> dict:
    """Waits until the job reaches one of `states` (default: any terminal state) and returns its
    `scontrol show job -o` fields (JobState, ExitCode, Restarts, NodeList, ...).

    Polls every 0.2 s: slurmctld offers no notification. The timeout is a failure bound."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = show_job(job_id)
        if last["JobState"] in states:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"job {job_id} not in {sorted(states)} after {timeout}s: "
                f"JobState={last.get('JobState')} Reason={last.get('Reason')}"
            )
        time.sleep(0.2)


def wait_for_path(path: Path, timeout: float = 120.0) -> Path:
    """Waits until a job's process has created `path` (all nodes share this filesystem)."""
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{path} not created within {timeout}s")
        time.sleep(0.1)
    return Path(path)


def read_env_file(path: Path) -> dict:
    """Reads `env | sort` output into a dict (the continuation lines of multi-line values are
    not told apart: fine for SLURM_* and other one-line variables)."""
    env = {}
    for line in Path(path).read_text().splitlines():
        k, eq, v = line.partition("=")
        if eq and k.replace("_", "").isalnum():
            env[k] = v
    return env

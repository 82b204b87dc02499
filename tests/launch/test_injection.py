"""A recipe renders into a shell script: nothing it holds may run as a command (field finding 15).
Each rendered script is run with bash against FAKE Slurm commands on PATH (sbatch, srun,
scontrol, squeue, sinfo: they record their arguments and run nothing), and a marker file shows
whether anything from the recipe ran. `[vigil]` values are checked at launch by vigil run's own
parser and checks, before anything is submitted.
"""
import os
import subprocess
from pathlib import Path

import pytest

from harness import base_env, run_vigil

FAKE_SLURM = {
    # srun records its arguments and the environment variable the test names; runs nothing.
    "srun": '#!/bin/bash\nprintf "%s\\n" "$@" > "$FAKE_DIR/srun.args"\n'
            'printf "%s" "${FAKE_SHOW:+${!FAKE_SHOW}}" > "$FAKE_DIR/srun.env"\n',
    "sbatch": '#!/bin/bash\ntouch "$FAKE_DIR/sbatch.called"\necho 4242\n',
    "scontrol": '#!/bin/bash\nexit 0\n',
    "squeue": '#!/bin/bash\necho PENDING\n',
    "sinfo": '#!/bin/bash\necho debug\n',
    # An interactive allocation's script ends in `exec sleep infinity`.
    "sleep": '#!/bin/bash\nexit 0\n',
}


def fake_slurm(job: Path) -> Path:
    d = job / "FAKE-slurm-bin"
    d.mkdir(exist_ok=True)
    for name, text in FAKE_SLURM.items():
        p = d / name
        p.write_text(text)
        p.chmod(0o755)
    return d


def env_for(job, **extra):
    bin_dir = fake_slurm(job)
    return base_env(
        VIGIL_HOME=job / "home", FAKE_DIR=job, PATH=f"{bin_dir}:{os.environ['PATH']}", **extra
    )


def run_script(text: str, job: Path, **extra) -> subprocess.CompletedProcess:
    """The rendered batch script, run by bash in `job` as Slurm would, FAKE Slurm on PATH."""
    f = job / "rendered.sh"
    f.write_text(text)
    env = env_for(job, SLURM_JOB_ID="7", SLURM_NNODES="1", **extra)
    return subprocess.run(["bash", str(f)], cwd=job, env=env, capture_output=True, text=True, timeout=60)


def refused(p):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vigil launch: error: "), p.stderr
    return lines[0]


def newline_recipe(job: Path, where: str) -> Path:
    """A recipe whose workdir (a real directory) or whose own file name holds a newline followed by
    a command: before the fix that line was a command of the batch script."""
    (job / "t.py").write_text("")
    if where == "workdir":
        wd = job / "w\ntouch MARKER #"
        wd.mkdir()
        (wd / "t.py").write_text("")
        r = job / "r.toml"
        # TOML: a basic string holds a newline as \n.
        r.write_text(
            'name = "a"\nnproc_per_node = 1\nscript = "t.py"\nworkdir = "'
            + str(wd).replace("\\", "\\\\").replace("\n", "\\n") + '"\n'
        )
        return r
    r = job / "r\ntouch MARKER #.toml"
    r.write_text('name = "b"\nnproc_per_node = 1\nscript = "t.py"\n')
    return r


@pytest.mark.parametrize("where,want", [("workdir", "workdir"), ("name", "file name")])
def test_a_newline_in_workdir_or_the_recipe_name_is_refused_and_runs_nothing(job, where, want):
    r = newline_recipe(job, where)
    p = run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job))
    if p.returncode == 0:
        run_script(p.stdout, job)
    assert not (job / "MARKER").exists(), f"the rendered script ran a command from the recipe:\n{p.stdout}"
    line = refused(p)
    assert want in line and "control character" in line, line
    assert "\x1b" not in line
    # Nothing is submitted either.
    refused(run_vigil(["launch", str(r)], cwd=job, env=env_for(job)))
    assert not (job / "sbatch.called").exists()


@pytest.mark.parametrize("interactive", [False, True])
def test_a_command_in_the_experiment_home_stays_text(job, interactive):
    # $VIGIL_HOME is the user's, but it is written into the script like the recipe's values.
    home = job / "h$(touch MARKER)`touch MARKER`"
    (job / "t.py").write_text("")
    r = job / "r.toml"
    r.write_text('name = "a"\nnproc_per_node = 1\nscript = "t.py"\n')
    args = ["launch", str(r), "--dry-run"] + (["--interactive"] if interactive else [])
    env = env_for(job)
    env["VIGIL_HOME"] = str(home)
    p = run_vigil(args, cwd=job, env=env)
    assert p.returncode == 0, p.stderr
    out = run_script(p.stdout, job)
    assert out.returncode == 0, out.stderr
    assert not (job / "MARKER").exists(), f"a command in VIGIL_HOME ran:\n{p.stdout}"
    if interactive:
        assert f"attach with bash {home}/experiments/a/" in out.stdout, out.stdout


def test_env_values_are_data_but_plain_variables_still_expand(job):
    (job / "t.py").write_text("")
    r = job / "r.toml"
    payload = "$(touch MARKER_ENV)`touch MARKER_BQ`${X:-$(touch MARKER_DEFAULT)}"
    r.write_text(
        'name = "a"\nnproc_per_node = 1\nscript = "t.py"\n'
        "[env]\n"
        f"EVIL = '{payload}'\n"
        "LIB = '/opt/lib:${LD_LIBRARY_PATH:-}'\n"
    )
    p = run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job))
    assert p.returncode == 0, p.stderr
    out = run_script(p.stdout, job, FAKE_SHOW="EVIL")
    assert out.returncode == 0, out.stderr
    for m in ("MARKER_ENV", "MARKER_BQ", "MARKER_DEFAULT"):
        assert not (job / m).exists(), f"{m}: an env value ran as a command:\n{p.stdout}"
    assert (job / "srun.env").read_text() == payload, "the value reaches the job as written"
    out = run_script(p.stdout, job, FAKE_SHOW="LIB", LD_LIBRARY_PATH="/host/lib")
    assert (job / "srun.env").read_text() == "/opt/lib:/host/lib", "a documented ${VAR:-} still expands"


def test_vigil_values_are_checked_by_vigil_runs_own_parser_at_launch(job):
    (job / "t.py").write_text("")
    r = job / "r.toml"
    cases = [
        ('max_restarts = "abc"', "--max-restarts"),
        ('rdzv_backend = "etcd"', '--rdzv-backend "etcd" is not supported'),
        ('safety_factor = 0.5', "--safety-factor"),
    ]
    for setting, want in cases:
        r.write_text(f'name = "a"\nnproc_per_node = 1\nscript = "t.py"\n[vigil]\n{setting}\n')
        for extra in (["--dry-run"], []):
            line = refused(run_vigil(["launch", str(r), *extra], cwd=job, env=env_for(job)))
            assert want in line and "vigil run would refuse this job" in line, (setting, line)
            assert "nothing was submitted" in line
        assert not (job / "sbatch.called").exists(), setting
        assert not (job / "home" / "experiments").exists() or not any((job / "home" / "experiments").rglob("sbatch.sh"))
    # A good value still passes, through --set as well.
    r.write_text('name = "a"\nnproc_per_node = 1\nscript = "t.py"\n[vigil]\nmax_restarts = 2\n')
    p = run_vigil(["launch", str(r), "--dry-run", "--set", "vigil.stop_lead=30"], cwd=job, env=env_for(job))
    assert p.returncode == 0 and "--max-restarts 2 --stop-lead 30" in p.stdout, p.stderr
    line = refused(run_vigil(["launch", str(r), "--dry-run", "--set", "vigil.stop_lead=-3"], cwd=job, env=env_for(job)))
    assert "--stop-lead" in line, line


def test_a_missing_log_dir_and_cache_dir_are_created_by_launch(job):
    (job / "t.py").write_text("")
    r = job / "r.toml"
    r.write_text(
        'name = "a"\nnproc_per_node = 1\nscript = "t.py"\nlog_dir = "out/logs"\ncache_dir = "out/cache"\n'
    )
    p = run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job))
    assert p.returncode == 0, p.stderr
    assert not (job / "out").exists(), "a dry run makes nothing"
    p = run_vigil(["launch", str(r)], cwd=job, env=env_for(job))
    assert p.returncode == 0, p.stderr
    assert (job / "out" / "logs").is_dir() and (job / "out" / "cache").is_dir()
    assert (job / "sbatch.called").exists()
    # data_dir is the job's input: still refused when missing.
    r.write_text('name = "a"\nnproc_per_node = 1\nscript = "t.py"\ndata_dir = "nodata"\n')
    assert "data_dir" in refused(run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job)))

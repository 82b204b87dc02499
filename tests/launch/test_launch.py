"""`vigil launch` without a Slurm cluster: the rendered scripts (golden files, `bash -n`), the
BCP command line, the checks that refuse a recipe before anything is submitted, and secrets never
written. The real binary every time; the Slurm side is tests/slurm/test_launch.py.

Golden files hold `@TMP@` for the test's directory, `@STAMP@` for the experiment's timestamp and
`@VIGIL@` for the binary's path, `@REPO@` for the repository; VIGIL_UPDATE_GOLDEN=1 rewrites them (review the diff).
"""
import os
import re
import subprocess
from pathlib import Path

from harness import REPO, base_env, run_vigil, vigil_bin

GOLDEN = Path(__file__).resolve().parent / "golden"
EXAMPLES = REPO / "examples" / "recipes"


def env_for(job, **extra):
    return base_env(VIGIL_HOME=job / "home", **extra)


def normalize(text, job):
    text = text.replace(os.path.realpath(vigil_bin()), "@VIGIL@").replace(str(job), "@TMP@")
    text = text.replace(str(REPO), "@REPO@")
    return re.sub(r"_\d{8}-\d{6}", "_@STAMP@", text)


def check_golden(name, text, job):
    got = normalize(text, job)
    path = GOLDEN / name
    if os.environ.get("VIGIL_UPDATE_GOLDEN") == "1":
        path.write_text(got)
    assert got == path.read_text(), f"{name} differs from the golden file:\n{got}"


def bash_n(text, job):
    f = job / "check.sh"
    f.write_text(text)
    p = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def refused(p):
    """A refusal: status 2, one line on stderr naming the problem, nothing on stdout."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vigil launch: error: "), p.stderr
    assert "panicked" not in p.stderr and "RUST_BACKTRACE" not in p.stderr
    return lines[0]


def test_plain_recipe_renders_the_golden_script(job):
    (job / "examples").mkdir()
    (job / "examples" / "toy_train.py").write_text("print('hi')\n")
    p = run_vigil(["launch", str(EXAMPLES / "toy.toml"), "--dry-run"], cwd=job, env=env_for(job))
    assert p.returncode == 0, p.stderr
    check_golden("toy.sbatch", p.stdout, job)
    bash_n(p.stdout, job)
    assert not (job / "home").exists(), "a dry run makes no experiment directory"


def container_job(job):
    for d in ("work", "logs", "cache", "data"):
        (job / d).mkdir(exist_ok=True)
    (job / "work" / "pretrain").mkdir()
    (job / "work" / "pretrain" / "llama3p1_2b_pt.py").write_text("")
    (job / "work" / "nemo-demo.sqsh").write_text("")
    return [
        "launch", str(EXAMPLES / "nemo-llama3-2b.toml"),
        "--image", str(job / "work" / "nemo-demo.sqsh"),
        "--set", f"workdir={job / 'work'}",
        "--set", f"log_dir={job / 'logs'}",
        "--set", f"cache_dir={job / 'cache'}",
        "--set", f"data_dir={job / 'data'}",
        "--set", "mounts=['/etc/hosts:/etc/hosts:ro']",
    ]


def test_container_recipe_renders_pyxis_flags_and_auto_mounts(job):
    secret = "hf_s3cr3t_value_never_written"
    p = run_vigil(
        container_job(job) + ["--dry-run"], cwd=job, env=env_for(job, HF_TOKEN=secret, WANDB_API_KEY="wb_zz")
    )
    assert p.returncode == 0, p.stderr
    check_golden("nemo-container.sbatch", p.stdout, job)
    bash_n(p.stdout, job)
    assert secret not in p.stdout and "wb_zz" not in p.stdout
    assert "--container-env=HF_TOKEN,WANDB_API_KEY" in p.stdout


def test_flags_override_the_recipe(job):
    (job / "examples").mkdir()
    (job / "examples" / "toy_train.py").write_text("")
    p = run_vigil(
        ["launch", str(EXAMPLES / "toy.toml"), "--dry-run", "--nodes", "3", "-p", "low",
         "--set", "vigil.max_restarts=4", "--set", "env.FOO=bar baz", "--", "--steps", "7"],
        cwd=job, env=env_for(job),
    )
    assert p.returncode == 0, p.stderr
    assert "#SBATCH --nodes=3\n" in p.stdout and "#SBATCH --partition=low\n" in p.stdout
    assert "--max-restarts 4 --workers-stop-timeout 5" in p.stdout
    assert 'export FOO="bar baz"' in p.stdout
    srun = p.stdout.split("\n# vigil could not requeue")[0]
    assert srun.rstrip().endswith("examples/toy_train.py --steps 7")


def test_interactive_dry_run_holds_the_allocation(job):
    p = run_vigil(
        ["launch", "--interactive", "--dry-run", "--name", "dbg", "--nodes", "2", "--nproc-per-node", "1"],
        cwd=job, env=env_for(job),
    )
    assert p.returncode == 0, p.stderr
    check_golden("interactive.sbatch", p.stdout, job)
    bash_n(p.stdout, job)


def test_bcp_dry_run_prints_the_ngc_line(job):
    p = run_vigil(
        ["launch", str(EXAMPLES / "bcp.toml"), "--executor", "bcp", "--dry-run"], cwd=job, env=env_for(job)
    )
    assert p.returncode == 0, p.stderr
    check_golden("bcp.txt", p.stdout, job)
    bash_n(p.stdout, job)
    # vigil gets the time limit too, so it checkpoints before BCP's hard stop.
    assert "--total-runtime 10h" in p.stdout and "run --time-limit 10:00:00" in p.stdout
    p = run_vigil(["launch", str(EXAMPLES / "bcp.toml"), "--executor", "bcp"], cwd=job, env=env_for(job))
    assert "add --dry-run" in refused(p)


def test_unknown_keys_name_the_file_the_key_and_the_nearest(job):
    r = job / "r.toml"
    r.write_text('name = "a"\nnproc_per_nod = 2\nscript = "t.py"\n')
    line = refused(run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job)))
    assert line == (
        f"vigil launch: error: {r}: unknown key `nproc_per_nod`; did you mean `nproc_per_node`? "
        "(docs/launch.md lists the keys)"
    )
    r.write_text('name = "a"\nnproc_per_node = 2\nscript = "t.py"\n[vigil]\nmax_restart = 3\n')
    line = refused(run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job)))
    assert "unknown key `vigil.max_restart`" in line and "did you mean `vigil.max_restarts`?" in line
    # The [vigil] table is checked against the binary's own vigil run options.
    r.write_text('name = "a"\nnproc_per_node = 2\nscript = "t.py"\n[vigil]\nsection_timeouts = "step=60"\n')
    (job / "t.py").write_text("")
    p = run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job))
    assert p.returncode == 0 and "--section-timeouts step=60" in p.stdout, p.stderr


def test_incomplete_or_wrong_recipes_are_refused_before_anything(job):
    (job / "t.py").write_text("")
    cases = [
        ('nproc_per_node = 1\nscript = "t.py"\n', "no `name`"),
        ('name = "a"\nnproc_per_node = 1\n', "no `script`"),
        ('name = "a"\nscript = "t.py"\n', "no `nproc_per_node`"),
        ('name = "a"\nnproc_per_node = 1\nscript = "missing.py"\n', "script " + str(job / "missing.py") + " does not exist"),
        ('name = "a"\nnproc_per_node = 1\nscript = "t.py"\nimage = "nope.sqsh"\n', "image " + str(job / "nope.sqsh") + " does not exist"),
        ('name = "a"\nnproc_per_node = 1\nscript = "t.py"\ntime = "soon"\n', "HH:MM:SS"),
        ('name = "a"\nscript = "t.py"\ncluster = "hcc-a3"\n', "did you mean `hcc-a3m`?"),
        ('name = "a"\nnproc_per_node = 1\nscript = "t.py"\n[vigil]\nlog_dir = "x"\n', "set by vigil launch itself"),
        ('name = "a"\nnproc_per_node = 1\nscript = "t.py"\nmounts = ["/a:/b"]\n', "needs a container `image`"),
        ('name = "a"\nnodes = "two"\n', "invalid type"),
        ('name = \n', "not valid TOML (line 1)"),
    ]
    for text, want in cases:
        r = job / "r.toml"
        r.write_text(text)
        line = refused(run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job)))
        assert want in line, (text, line)
    line = refused(run_vigil(["launch", str(job / "absent.toml")], cwd=job, env=env_for(job)))
    assert "cannot read the recipe" in line
    line = refused(run_vigil(["launch", "--set", "nodes"], cwd=job, env=env_for(job)))
    assert "give KEY=VALUE" in line


def test_a_missing_secret_is_refused_and_nothing_is_made(job):
    (job / "t.py").write_text("")
    r = job / "r.toml"
    r.write_text('name = "a"\nnproc_per_node = 1\nscript = "t.py"\nsecrets = ["HF_TOKEN"]\n')
    env = env_for(job)
    env.pop("HF_TOKEN", None)
    line = refused(run_vigil(["launch", str(r)], cwd=job, env=env))
    assert "secret HF_TOKEN is not set" in line
    assert not (job / "home").exists()
    r.write_text('name = "a"\nnproc_per_node = 1\nscript = "t.py"\nsecrets = ["HF_TOKEN"]\nenv = { HF_TOKEN = "x" }\n')
    assert "both a secret and in `env`" in refused(run_vigil(["launch", str(r)], cwd=job, env=env))


def test_status_logs_cancel_attach_without_experiments(job):
    for cmd in (["status"], ["logs"], ["cancel"], ["attach", "nope"]):
        p = run_vigil(cmd, cwd=job, env=env_for(job))
        assert p.returncode == 2 and p.stdout == "", (cmd, p)
        assert p.stderr.strip().splitlines() == [p.stderr.strip()]
        assert f"vigil {cmd[0]}: error: no experiment" in p.stderr, p.stderr
    p = run_vigil(["list"], cwd=job, env=env_for(job))
    assert p.returncode == 0 and "no experiments yet" in p.stdout


def test_a_bad_flag_is_one_line_pointing_at_launch_help(job):
    p = run_vigil(["launch", "--bogus"], cwd=job, env=env_for(job))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "vigil: error: unexpected argument '--bogus' found; see `vigil launch --help`\n"


def test_a_flags_error_names_the_flag_not_the_file(job):
    (job / "t.py").write_text("")
    r = job / "my.toml"
    r.write_text('name = "a"\nnproc_per_node = 1\nscript = "t.py"\n')
    for flags, want in [
        (["-t", "soon"], "-t/--time: time = \"soon\""),
        (["--time", "soon"], "-t/--time: time = \"soon\""),
        (["--nodes", "0"], "--nodes: nodes = 0"),
        (["-p", "a b"], "-p/--partition: partition"),
        (["--set", "time=soon"], "--set time: time = \"soon\""),
        (["--set", "vigil.max_restart=3"], "--set vigil.max_restart: unknown key `vigil.max_restart`"),
        (["--set", "nodez=3"], "--set nodez: unknown key `nodez`"),
        (["--set", "nodes=abc"], "--set nodes: invalid type"),
        (["--set", "vigil.max_restarts=abc"], "--set vigil.max_restarts: vigil run would refuse this job"),
    ]:
        line = refused(run_vigil(["launch", str(r), "--dry-run"] + flags, cwd=job, env=env_for(job)))
        assert line.startswith("vigil launch: error: " + want), (flags, line)
        assert "my.toml" not in line, (flags, line)
    # The file's own mistakes still name the file.
    r.write_text('name = "a"\nnproc_per_node = 1\nscript = "t.py"\ntime = "soon"\n')
    line = refused(run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job)))
    assert line.startswith(f"vigil launch: error: {r}: time = "), line


def test_durations_as_vigil_run_takes_them_render_in_slurm_form(job):
    (job / "t.py").write_text("")
    r = job / "my.toml"
    for given, want in [("4h", "04:00:00"), ("90m", "01:30:00"), ("1d", "1-00:00:00"),
                        ("1h30m", "01:30:00"), ("04:00:00", "04:00:00"), ("2-12", "2-12:00:00")]:
        r.write_text(f'name = "a"\nnproc_per_node = 1\nscript = "t.py"\ntime = "{given}"\n')
        p = run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job))
        assert p.returncode == 0, (given, p.stderr)
        assert f"#SBATCH --time={want}\n" in p.stdout, (given, p.stdout)
        r.write_text('name = "a"\nnproc_per_node = 1\nscript = "t.py"\n')
        p = run_vigil(["launch", str(r), "--dry-run", "-t", given], cwd=job, env=env_for(job))
        assert p.returncode == 0, (given, p.stderr)
        assert f"#SBATCH --time={want}\n" in p.stdout, (given, p.stdout)


def test_a_vigil_bin_the_image_may_not_hold_is_warned_about_not_refused(job):
    args = container_job(job) + ["--dry-run"]
    env = env_for(job, HF_TOKEN="x", WANDB_API_KEY="y")
    p = run_vigil(args + ["--set", "vigil_bin=/opt/nowhere/vigil"], cwd=job, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vigil launch: warning: vigil_bin /opt/nowhere/vigil"), p.stderr
    assert "docs/install.md" in lines[0] and "/opt/nowhere:/opt/nowhere:ro" in lines[0], lines[0]
    assert "/opt/nowhere/vigil run" in p.stdout
    # A mounted directory, the image's own `vigil` on PATH, or the default (the running binary,
    # mounted): no warning.
    for bin_ in [str(job / "work" / "vigil"), "vigil"]:
        p = run_vigil(args + ["--set", f"vigil_bin={bin_}"], cwd=job, env=env)
        assert p.returncode == 0 and p.stderr == "", (bin_, p.stderr)
    p = run_vigil(args, cwd=job, env=env)
    assert p.returncode == 0 and p.stderr == "", p.stderr


STORE_RECIPE = 'name = "outside"\nnodes = 2\nnproc_per_node = 1\nscript = "t.py"\nstore = "login1:29400"\nstore_secret_file = "store secret"\n[vigil]\nrdzv_conf = "join_timeout=900"\n'


def test_a_store_outside_the_job_renders_the_golden_script(job):
    (job / "t.py").write_text("")
    (job / "store secret").write_text("s" * 32 + "\n")
    r = job / "r.toml"
    r.write_text(STORE_RECIPE)
    p = run_vigil(["launch", str(r), "--dry-run"], cwd=job, env=env_for(job))
    assert p.returncode == 0, p.stderr
    check_golden("store-outside.sbatch", p.stdout, job)
    bash_n(p.stdout, job)
    assert "s" * 32 not in p.stdout, "the secret is read at run time, never written"
    # --store wins over the recipe's, as every named flag.
    p = run_vigil(["launch", str(r), "--dry-run", "--store", "10.0.0.5:7000"], cwd=job, env=env_for(job))
    assert p.returncode == 0, p.stderr
    assert "--master-addr 10.0.0.5 --master-port 7000 --rdzv-conf join_timeout=900,is_host=false" in p.stdout


def test_a_bad_store_or_a_missing_secret_file_is_refused_before_submitting(job):
    """With FAKE Slurm commands on PATH: nothing reaches sbatch, no experiment is made."""
    (job / "t.py").write_text("")
    (job / "secret").write_text("s" * 32 + "\n")
    bin_dir = job / "FAKE-slurm-bin"
    bin_dir.mkdir()
    for name in ("sbatch", "sinfo", "squeue", "scontrol"):
        f = bin_dir / name
        f.write_text(f'#!/bin/bash\ntouch "{job}/{name}.called"\necho 4242\n')
        f.chmod(0o755)
    env = env_for(job, PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = job / "r.toml"
    base = 'name = "a"\nnproc_per_node = 1\nscript = "t.py"\n'
    for store, want in [
        ("login1", "r.toml: store = \"login1\" has no port"),
        ("login1:0", "is not 1-65535"),
        ("login1:70000", "is not 1-65535"),
        ("a b:1", "is not a host name"),
    ]:
        r.write_text(f'{base}store = "{store}"\nstore_secret_file = "secret"\n')
        assert want in refused(run_vigil(["launch", str(r)], cwd=job, env=env)), store
    r.write_text(base + 'store_secret_file = "secret"\n')
    line = refused(run_vigil(["launch", str(r), "--store", "h:"], cwd=job, env=env))
    assert line.startswith("vigil launch: error: --store: store = \"h:\""), line
    r.write_text(base + 'store = "h:1"\nstore_secret_file = "absent"\n')
    line = refused(run_vigil(["launch", str(r)], cwd=job, env=env))
    assert f"store_secret_file {job / 'absent'} cannot be read" in line, line
    r.write_text(base + 'store = "h:1"\n')
    assert "store needs store_secret_file" in refused(run_vigil(["launch", str(r)], cwd=job, env=env))
    assert not (job / "sbatch.called").exists()
    assert not (job / "home" / "experiments").exists() or not any((job / "home" / "experiments").iterdir())
    # The same recipe with a readable file is submitted (to the FAKE sbatch).
    r.write_text(base + 'store = "h:1"\nstore_secret_file = "secret"\n')
    p = run_vigil(["launch", str(r)], cwd=job, env=env)
    assert p.returncode == 0, p.stderr
    assert (job / "sbatch.called").exists()
    script = next((job / "home" / "experiments").rglob("sbatch.sh")).read_text()
    assert re.search(r'^export VIGIL_STORE_SECRET="\$\(cat \'?' + re.escape(str(job / "secret")) + r'\'?\)"$', script, re.M), script
    assert "s" * 32 not in script

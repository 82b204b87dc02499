"""Bad flag values end the run with one line on stderr that names the flag and the fix: exit 2, no
rank started, no panic or backtrace.

Found by attack (fault-findings 3 and 9): `--workers-stop-timeout 1e30` panicked with a backtrace
(exit 134), and `--nproc-per-node 100000` forked thousands of ranks for minutes before failing on
"Too many open files".
"""
import resource

import pytest

from harness import base_env, run_dirs, run_vigil, write

# Writes a marker as soon as a rank runs: a refused line must never get that far.
SCRIPT = """
import os
open(os.path.join(os.environ["OUT_DIR"], "started_" + os.environ["RANK"]), "w").close()
print("ran", os.environ["RANK"])
"""

SECONDS_FLAGS = [
    "--monitor-interval", "--join-timeout", "--node-timeout", "--workers-stop-timeout", "--term-timeout", "--shutdown-timeout",
    "--restart-backoff", "--restart-backoff-max", "--restart-backoff-reset",
    "--initial-heartbeat-timeout", "--heartbeat-timeout", "--out-of-section-timeout", "--stack-dump-timeout",
]
COUNT_FLAGS = ["--max-restarts", "--warmup-steps", "--node-rank", "--master-port"]
BAD_NUMBERS = ["-1", "1e30", "inf", "-inf", "nan", "abc", "99999999999999999999999"]

CASES = (
    [([f, v], f) for f in SECONDS_FLAGS for v in BAD_NUMBERS]
    + [([f, v], f) for f in COUNT_FLAGS for v in BAD_NUMBERS + ["1.5"]]
    + [(["--safety-factor", v], "--safety-factor") for v in BAD_NUMBERS + ["0", "0.5"]]
    + [(["--nproc-per-node", v], "--nproc-per-node") for v in BAD_NUMBERS + ["0", "1.5", "100000"]]
    + [(["--nnodes", v], "--nnodes") for v in ["-1", "1e30", "inf", "nan", "abc", "0", "99999999999999999999"]]
    + [
        (["--workers_stop_timeout=1e30"], "--workers-stop-timeout"),
        (["--rdzv-conf", "join_timeout=1e30"], "join_timeout"),
        (["--rdzv-conf", "join_timeout=nan"], "join_timeout"),
        (["--section-timeouts", "step=1e30"], "--section-timeouts"),
        (["--section-timeouts", "step=inf"], "--section-timeouts"),
        (["--rdzv-endpoint", "localhost:99999"], "--rdzv-endpoint"),
        (["--rdzv-endpoint", "localhost:-1"], "--rdzv-endpoint"),
        (["--start-method", "thread"], "--start-method"),
    ]
)


def assert_refused(job, r, flag):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    (line,) = lines
    assert line.startswith("vigil: error:"), line
    assert flag in line, line
    assert any(w in line for w in ("give", "raise", "possible values")), f"the line names no fix: {line}"
    assert "panicked" not in r.stderr and "backtrace" not in r.stderr.lower()
    assert not list(job.glob("started_*")), "a rank was started"
    assert "ran " not in r.stdout


@pytest.mark.parametrize("args,flag", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_value_is_one_line_naming_the_flag(job, args, flag):
    write(job / "t.py", SCRIPT)
    r = run_vigil(["run", "--log-dir", "logs", *args, "t.py"], cwd=job, env=base_env(OUT_DIR=job), timeout=60)
    assert_refused(job, r, flag)


@pytest.mark.parametrize("var,value,flag", [
    ("PET_MAX_RESTARTS", "1e30", "--max-restarts"),
    ("PET_NPROC_PER_NODE", "100000", "--nproc-per-node"),
    ("PET_MONITOR_INTERVAL", "nan", "--monitor-interval"),
    ("PET_NODE_RANK", "-1", "--node-rank"),
])
def test_bad_value_from_the_environment(job, var, value, flag):
    write(job / "t.py", SCRIPT)
    r = run_vigil(["run", "t.py"], cwd=job, env=base_env(OUT_DIR=job, **{var: value}), timeout=60)
    assert_refused(job, r, flag)


def test_too_many_ranks_for_this_node_says_why(job):
    write(job / "t.py", SCRIPT)
    r = run_vigil(["run", "--nproc-per-node", "100000", "t.py"], cwd=job, env=base_env(OUT_DIR=job), timeout=60)
    assert_refused(job, r, "--nproc-per-node 100000")
    assert "CPUs" in r.stderr and "give at most" in r.stderr


def test_ranks_beyond_the_open_file_limit_are_refused(job):
    write(job / "t.py", SCRIPT)

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    # 128 descriptors leave room for (128 - 64) / 8 = 8 ranks; 10 would run out mid-start.
    r = run_vigil(["run", "--nproc-per-node", "10", "t.py"], cwd=job, env=base_env(OUT_DIR=job), timeout=60,
                  preexec_fn=low_limit)
    assert_refused(job, r, "--nproc-per-node 10")
    assert "open-file limit (128)" in r.stderr and "ulimit -n" in r.stderr
    # The same limit runs as many ranks as it allows.
    ok = run_vigil(["run", "--nproc-per-node", "8", "t.py"], cwd=job, env=base_env(OUT_DIR=job), timeout=120,
                   preexec_fn=low_limit)
    assert ok.returncode == 0, ok.stderr
    assert len(list(job.glob("started_*"))) == 8


@pytest.mark.parametrize("form", [[], ["--no-python"], ["--run-path"]])
def test_a_directory_as_the_script(job, form):
    (job / "adir").mkdir()
    r = run_vigil(["run", *form, "adir"], cwd=job, env=base_env(OUT_DIR=job), timeout=60)
    assert_refused(job, r, "adir")
    assert "is a directory" in r.stderr


def test_unicode_paths_work(job):
    d = job / "dïr 日本"
    d.mkdir()
    write(d / "trâin_データ.py", SCRIPT + "import sys\nprint('args', sys.argv[1:])\n")
    logs = job / "lögs ✓"
    r = run_vigil(["run", "--nproc-per-node", "2", "--log-dir", str(logs), str(d / "trâin_データ.py"), "ärg", "引数"],
                  cwd=job, env=base_env(OUT_DIR=job), timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(l for l in r.stdout.splitlines() if "args" in l) == [
        "[default0]:args ['ärg', '引数']", "[default1]:args ['ärg', '引数']"]
    (rd,) = run_dirs(logs)
    assert (rd / "attempt_0" / "1" / "stdout.log").read_text().startswith("ran 1\n")


def test_no_subcommand_or_an_unknown_one(job):
    r = run_vigil([], cwd=job)
    assert r.returncode == 2 and "Usage: vigil <COMMAND>" in r.stderr, r.stderr
    r = run_vigil(["bogus"], cwd=job)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "'bogus'" in line and "`vigil --help`" in line, line

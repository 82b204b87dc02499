"""Every file vigil reads is bounded (field finding 18): /dev/zero, a FIFO with no writer, or a
10 GB (sparse) file given where vigil reads a file gets one line and exit 2, quickly and with
memory flat (peak RSS well below what reading it would take). Each vigil runs under RLIMIT_AS
(2 GiB of address space), never unbounded on a shared machine: before the fix,
`--timeouts-file /dev/zero` grew to 23 GB, `--ft-cfg-path` on a FIFO waited forever.
"""
import os
import signal
import subprocess
import sys

import pytest

from harness import base_env, vigil_bin

AS_LIMIT = 2 << 30
RSS_LIMIT_KIB = 256 << 10  # "memory flat": far below what reading any of these whole would take
BOUND = 30  # seconds: generous; the goal (well under a second) is not a pass/fail criterion

# Runs the command under RLIMIT_AS and writes its peak RSS (KiB) to argv[1].
WRAP = r"""
import resource, subprocess, sys
lim = int(sys.argv[2])
rc = subprocess.run(sys.argv[3:], preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (lim, lim))).returncode
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc if rc >= 0 else 128 - rc)
"""


def hostile(job, kind):
    """A path of the given kind: a link to /dev/zero, a FIFO nobody writes, a 10 GB sparse file."""
    p = job / f"hostile-{kind}"
    if kind == "zero":
        p.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(p)
    else:
        with open(p, "wb") as f:
            f.truncate(10 << 30)
    return p


def run_bounded(args, cwd, env=None):
    rss = cwd / "peak-rss"
    cmd = [sys.executable, "-c", WRAP, str(rss), str(AS_LIMIT), vigil_bin(), *map(str, args)]
    p = subprocess.Popen(cmd, cwd=cwd, env=env or base_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"vigil {' '.join(map(str, args))} still ran after {BOUND}s")
    peak = int(rss.read_text())
    assert peak < RSS_LIMIT_KIB, f"vigil {args[0]} grew to {peak} KiB"
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def one_line_exit_2(p, prefix, *want):
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith(prefix), lines[0]
    for w in want:
        assert w in lines[0], lines[0]
    return lines[0]


KINDS = ["zero", "fifo", "sparse"]
WHY = {"zero": "character device", "fifo": "FIFO", "sparse": "larger than"}


@pytest.mark.parametrize("kind", KINDS)
def test_timeouts_file(job, kind):
    f = hostile(job, kind)
    # A script that exists, so that nothing else stops the run first.
    (job / "t.py").write_text("")
    p = run_bounded(["run", "--nproc-per-node", "1", "--timeouts-file", f, "t.py"], cwd=job)
    one_line_exit_2(p, "vigil: error: --timeouts-file", WHY[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_ft_cfg_path(job, kind):
    f = hostile(job, kind)
    p = run_bounded(["run", "--nproc-per-node", "1", "--ft-cfg-path", f, "t.py"], cwd=job)
    one_line_exit_2(p, "vigil: error: cannot read the ft_launcher config", WHY[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_recipe(job, kind):
    f = hostile(job, kind)
    p = run_bounded(["launch", f, "--dry-run"], cwd=job, env=base_env(VIGIL_HOME=job / "home"))
    one_line_exit_2(p, "vigil launch: error: cannot read the recipe", WHY[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_ledger(job, kind):
    state = job / "state"
    state.mkdir()
    f = hostile(job, kind)
    os.rename(f, state / "ledger.jsonl")
    p = run_bounded(["ledger", state], cwd=job)
    why = {"zero": "character device", "fifo": "FIFO", "sparse": "longer than"}[kind]
    one_line_exit_2(p, "vigil ledger: error: cannot read", why)


def test_report_on_a_huge_event_log(job):
    # `vigil report` looks only at regular files (a FIFO or a link is not a record file); a huge
    # one is read streaming, each line bounded, and skipped with a note.
    run = job / "logs" / "vigil_x"
    run.mkdir(parents=True)
    os.rename(hostile(job, "sparse"), run / "events.jsonl")
    p = run_bounded(["report", job / "logs"], cwd=job)
    one_line_exit_2(p, "vigil report: error:", "no vigil records", "longer than")


def test_an_infiniband_counter_linked_to_dev_zero(job):
    port = job / "ib" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "counters" / "link_downed").symlink_to("/dev/zero")
    (port / "counters" / "symbol_error").write_text("0\n")
    p = run_bounded(["health", "--ib-root", job / "ib", "--json"], cwd=job)
    # Healthy or not is the health check's verdict (docs/health.md); here: it ends, not killed.
    assert p.returncode in (0, 1), (p.returncode, p.stderr[-2000:])
    assert "\"name\":\"ib_ports\"" in p.stdout, p.stdout

"""Output a user reads first points to what to read next (field finding 23): a failed rank's line
and the root-cause block name its log files, and a hang is called a hang, not a failure."""
import os

from harness import run_dirs, run_vigil, write

CRASH = "import os, sys\nprint('boom on rank', os.environ['RANK'], file=sys.stderr)\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n"

HANG = """
import os, time, vigil
vigil.heartbeat()
if os.environ["RANK"] == "1":
    time.sleep(600)
for _ in range(400):
    vigil.heartbeat(); time.sleep(0.05)
"""


def test_a_failed_ranks_line_and_the_root_cause_name_its_logs(job):
    write(job / "t.py", CRASH)
    r = run_vigil(["run", "--nproc-per-node", "2", "--log-dir", str(job / "logs"), "t.py"], cwd=job)
    assert r.returncode == 1, r.stderr  # as torchrun: 1 for a failed job
    (run,) = run_dirs(job / "logs")
    stderr_log = run / "attempt_0" / "1" / "stderr.log"
    assert "boom on rank 1" in stderr_log.read_text()
    line = next(l for l in r.stderr.splitlines() if "rank 1 (pid" in l and "failed" in l)
    assert f"its output: {stderr_log}" in line, line
    root = r.stderr.split("Root Cause")[1]
    assert f"logs      : {stderr_log.parent}/" in root, root


def test_a_hang_is_called_a_hang_and_names_where_its_stacks_go(job):
    write(job / "t.py", HANG)
    r = run_vigil(["run", "--nproc-per-node", "2", "--heartbeat-timeout", "3", "--log-dir", str(job / "logs"),
                   "t.py"], cwd=job, timeout=120)
    assert r.returncode != 0, r.stderr
    (run,) = run_dirs(job / "logs")
    hung = next(l for l in r.stderr.splitlines() if "is hung" in l)
    assert str(run / "attempt_0" / "1" / "stacks.txt") in hung, hung
    stops = [l for l in r.stderr.splitlines() if "stopping" in l and "rank(s)" in l]
    assert stops and all("after a rank hung" in l for l in stops), stops
    assert not any("after a rank failed" in l for l in r.stderr.splitlines()), r.stderr

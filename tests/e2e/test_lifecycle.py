"""The promise of docs/allocations.md outside Slurm: a wrapper that runs `vigil run` again on 75
never loops forever. What cannot work is refused before any rank starts (exit 2, one line that
names the fix): an end that leaves no time before the stop lead, a state directory that cannot be
written (without it requeues cannot be counted). A lead longer than half the allocation is
capped, and said once; allocations stopped before their ranks reported a step count as no
progress, so the wrapper's loop ends.
"""
import json
import os
import shutil
import subprocess

import pytest

from harness import base_env, run_vigil, vigil_bin, write

# Writes started_<rank> first: a refused run must not have started any rank.
STARTS = """
import os, pathlib
pathlib.Path(os.environ["OUT_DIR"], "started_" + os.environ["RANK"]).write_text("1")
"""

# Steps every 20 ms, reporting each step; checkpoints and exits 0 when asked.
STEPPING = """
import json, os, pathlib, sys, time
import vigil
out = pathlib.Path(os.environ["OUT_DIR"])
step = 0
while True:
    step += 1
    time.sleep(0.02)
    if vigil.should_stop(step):
        (out / "ckpt.json").write_text(json.dumps({"step": step, "asked": vigil.stop_step()}))
        sys.exit(0)
"""

# Never reports a step (no shim at all): it only waits, as a job stuck before its first step.
NO_STEP = """
import time
while True:
    time.sleep(0.05)
"""


def vigil_run(job, *args, script="starts.py", timeout=120):
    return run_vigil(["run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"), *args, script],
                     cwd=job, env=base_env(OUT_DIR=job), timeout=timeout)


def refused(job, r, *says):
    """Exit 2, one line that says `says`, and no rank was started."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vigil: error: "), r.stderr
    for s in says:
        assert s in lines[0], (s, lines[0])
    assert not list(job.glob("started_*")), "a rank was started"


def test_a_time_limit_not_longer_than_the_default_lead_is_refused_before_any_rank_starts(job):
    write(job / "starts.py", STARTS)
    r = vigil_run(job, "--time-limit", "40s")
    refused(job, r, "--time-limit 40s is not longer than the stop lead (60s", "--stop-lead 10")


@pytest.mark.parametrize("past", ["1000", "2020-01-01T00:00:00Z"])
def test_an_end_time_in_the_past_is_refused_before_any_rank_starts(job, past):
    write(job / "starts.py", STARTS)
    r = vigil_run(job, "--end-time", past)
    refused(job, r, f"--end-time {past}: that time has passed", "give a time in the future")


def test_a_state_dir_that_is_a_file_is_refused_before_any_rank_starts(job):
    write(job / "starts.py", STARTS)
    state = write(job / "state", "not a directory\n")
    r = vigil_run(job, "--rdzv-id", "j1", "--max-requeues", "1", "--state-dir", str(state))
    refused(job, r, f"state directory {state} is not a directory", "give --state-dir")
    assert state.read_text() == "not a directory\n", "the file was not touched"


def in_a_private_mount(job, mount_opts, setup=""):
    """The argv prefix that runs a command with a tmpfs mounted (`mount_opts`) at job/mnt, in a
    mount namespace of its own (nothing leaks to the machine), after the shell `setup` ($0 is the
    mount point); needs root and unshare."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to mount a read-only or full filesystem")
    if subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("unshare -m is not permitted here")
    mnt = job / "mnt"
    mnt.mkdir()
    script = f'mount -t tmpfs -o {mount_opts} vigil-test "$0" && {setup} exec "$@"'
    return mnt, ["unshare", "-m", "sh", "-c", script, str(mnt)]


def run_in(prefix, job, *args):
    return subprocess.run([*prefix, vigil_bin(), "run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"),
                           *args, "starts.py"],
                          cwd=job, env=base_env(OUT_DIR=job), capture_output=True, text=True, timeout=120)


def test_a_read_only_state_dir_is_refused_before_any_rank_starts(job):
    write(job / "starts.py", STARTS)
    mnt, prefix = in_a_private_mount(job, "ro,size=1m")
    r = run_in(prefix, job, "--rdzv-id", "j2", "--max-requeues", "1", "--state-dir", str(mnt / "state"))
    refused(job, r, f"state directory {mnt / 'state'} cannot be created", "Read-only file system",
            "give --state-dir")


def test_a_read_only_cycle_info_dir_is_refused_before_any_rank_starts(job):
    """Field finding 47: a read-only --cycle-info-dir got a note and exit 0; it is refused up
    front, as the state directory is."""
    write(job / "starts.py", STARTS)
    mnt, prefix = in_a_private_mount(job, "ro,size=1m")
    r = run_in(prefix, job, "--cycle-info-dir", str(mnt / "ci"))
    refused(job, r, f"--cycle-info-dir {mnt / 'ci'} cannot be created", "Read-only file system",
            "give a writable directory or leave the flag out")
    ro = mnt
    r = run_in(prefix, job, "--cycle-info-dir", str(ro))
    refused(job, r, f"--cycle-info-dir {ro} cannot be written", "Read-only file system")


def test_a_full_state_dir_is_refused_before_any_rank_starts(job):
    write(job / "starts.py", STARTS)
    fill = 'mkdir "$0/state" && { head -c 1048576 /dev/zero > "$0/fill" 2>/dev/null; true; } &&'
    mnt, prefix = in_a_private_mount(job, "size=64k", fill)
    r = run_in(prefix, job, "--rdzv-id", "j3", "--state-dir", str(mnt / "state"))
    refused(job, r, f"state directory {mnt / 'state'} cannot be written", "No space left on device")


def test_a_lead_past_half_the_allocation_is_capped_and_said_once(job):
    write(job / "stepping.py", STEPPING)
    # 6 s allocation, --stop-lead 4: the ranks would have 2 s; capped at 3 s, they have 3.
    r = vigil_run(job, "--time-limit", "6s", "--stop-lead", "4", script="stepping.py")
    assert r.returncode == 75, r.stderr
    capped = [l for l in r.stderr.splitlines() if "capped at 3s" in l]
    assert len(capped) == 1, r.stderr
    assert "stop lead of 4s would leave less than half of the allocation (6s" in capped[0], capped
    assert "they have 3s" in r.stderr, r.stderr
    ck = json.loads((job / "ckpt.json").read_text())
    assert ck["step"] > 0 and ck["step"] == ck["asked"], ck


def test_stops_before_a_first_step_end_a_wrapper_loop_as_no_progress(job):
    """`while vigil run ...; [ $? -eq 75 ]` on a job whose ranks never report a step: three
    allocations (--max-no-progress 3), then vigil says stop; the console names the time limit."""
    write(job / "nostep.py", NO_STEP)
    statuses, errs = [], []
    for _ in range(6):
        r = vigil_run(job, "--rdzv-id", "loop", "--state-dir", str(job / "state"), "--time-limit", "3s",
                      "--stop-lead", "1", script="nostep.py")
        statuses.append(r.returncode)
        errs.append(r.stderr)
        if r.returncode != 75:
            break
    assert statuses == [75, 75, 1], (statuses, errs[-1])
    assert "no rank reported a step to vigil.should_stop(step) in the last 3 allocations" in errs[-1], errs[-1]
    for e in errs:
        assert "stopping 1 rank(s) for the allocation's time limit" in e, e
        assert "on a signal to the agent" not in e, e
    recs = [json.loads(l) for l in (job / "state" / "ledger.jsonl").read_text().splitlines()]
    assert [(r["allocation"], r["outcome"], r["decision"]) for r in recs] == [
        (1, "stopped", "requeue"), (2, "stopped", "requeue"), (3, "stopped", "stop")], recs


# Fills the filesystem of FILL (until it is full), then fails.
FILLS_THEN_FAILS = """
import os, sys
fd = os.open(os.environ["FILL"], os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError:
    pass
sys.exit(3)
"""


def test_a_state_dir_that_fills_up_during_the_run_ends_the_loop_instead_of_an_uncounted_requeue(job):
    write(job / "fills.py", FILLS_THEN_FAILS)
    mnt, prefix = in_a_private_mount(job, "size=256k")
    r = subprocess.run([*prefix, vigil_bin(), "run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"),
                        "--rdzv-id", "j4", "--max-requeues", "5", "--state-dir", str(mnt / "state"), "fills.py"],
                       cwd=job, env=base_env(OUT_DIR=job, FILL=mnt / "fill"), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode not in (0, 75), r.stderr  # the failure's own status: do not run again
    assert "this allocation is not recorded" in r.stderr, r.stderr
    assert "not requeued: failed, 1 in a row (--max-requeues 5), but the ledger in" in r.stderr, r.stderr


# Node 1's rank runs ahead to step 40; node 0's rank then fails at step 1.
AHEAD_THEN_FAIL = """
import os, pathlib, sys, time
import vigil
out = pathlib.Path(os.environ["OUT_DIR"])
if os.environ["GROUP_RANK"] == "1":
    for step in range(41):
        vigil.should_stop(step)
    (out / "ahead").write_text("1")
    while True:
        time.sleep(0.05)
while not (out / "ahead").exists():
    time.sleep(0.02)
vigil.should_stop(1)
sys.exit(3)
"""


def test_the_ledger_keeps_the_highest_step_of_any_node_not_only_node_rank_0s(job):
    """The highest step in the ledger is the job's: node 1's ranks reached step 40 while node rank
    0's reached 1 when the job failed, and the next allocation's no-progress rule needs the 40."""
    from test_multinode import free_port

    write(job / "ahead.py", AHEAD_THEN_FAIL)
    port = free_port()
    procs = [subprocess.Popen(
        [vigil_bin(), "run", "--nnodes", "2", "--node-rank", str(i), "--master-addr", "127.0.0.1",
         "--master-port", str(port), "--nproc-per-node", "1", "--rdzv-id", "ahead",
         "--max-requeues", "3", "--state-dir", str(job / "state"), "--log-dir", str(job / f"node{i}"),
         "ahead.py"],
        cwd=job, env=base_env(OUT_DIR=job), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert procs[0].returncode == 75, outs[0][1]
    recs = [json.loads(l) for l in (job / "state" / "ledger.jsonl").read_text().splitlines()]
    assert len(recs) == 1 and recs[0]["outcome"] == "failed", recs
    assert recs[0]["highest_step"] == 40, recs

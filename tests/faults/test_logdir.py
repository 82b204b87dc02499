"""The log directory fills up, turns read-only or is deleted while the job runs.

Found by attack (fault-findings 10): rank logs were silently cut when the log disk filled, and the
stack-dump message then wrongly said the rank had not imported the shim. Training must go on, the
agent says once what it could not write and where, and nothing panics. Every test runs the real
binary; the full and read-only disks are real tmpfs mounts (root only).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from harness import base_env, of, pid_alive, read_events, run_dirs, start_vigil, wait_for, write  # noqa: E402


@pytest.fixture
def mounts():
    """Mounts tmpfs file systems for one test and unmounts them, newest first, afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small or read-only tmpfs needs root")
    done = []

    def mount(target: Path, *opts):
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(opts), "tmpfs", str(target)], check=True)
        done.append(target)
        return target

    yield mount
    for t in reversed(done):
        subprocess.run(["umount", "-l", str(t)], check=False)


# Rank 0 fills the log disk and then goes on printing and heartbeating until told to finish;
# rank 1 heartbeats until the disk is full, then hangs (its stacks cannot be written).
# The attempt after the hang's restart prints a line and ends.
FILL_THEN_HANG = """
import os, sys, time
import vigil
out = os.environ["OUT_DIR"]
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
if attempt != "0":
    print("attempt 1 of rank", rank, "goes on", flush=True)
    sys.exit(0)
if rank == "0":
    chunk = b"y" * 1023 + b"\\n"
    for _ in range(4 * 1024):  # 4 MiB: twice the disk
        os.write(1, chunk)
    open(os.path.join(out, "filled"), "w").close()
    i = 0
    while not os.path.exists(os.path.join(out, "finish")):
        vigil.heartbeat(i)
        i += 1
        time.sleep(0.05)
    sys.exit(0)
i = 0
while not os.path.exists(os.path.join(out, "filled")):
    vigil.heartbeat(i)
    i += 1
    time.sleep(0.05)
time.sleep(600)
"""


def test_full_log_disk_costs_the_logs_once_not_the_job_and_the_stacks_message_names_the_disk(job, mounts):
    small = mounts(job / "small", "size=2m")
    write(job / "t.py", FILL_THEN_HANG)
    ev_path = job / "events.jsonl"  # elsewhere, so the test can follow the job
    p = start_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--heartbeat-timeout", "2",
                     "--stack-dump-timeout", "2", "--log-dir", str(small), "--event-log", str(ev_path), "t.py"],
                    cwd=job, env=base_env(OUT_DIR=job))
    try:
        wait_for(lambda: of(read_events(ev_path), "cycle_start", cycle=1), timeout=90,
                 what="the hang of rank 1 and the restart, on a full disk")
        (job / "finish").touch()
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    ev = read_events(ev_path)
    assert ev[-1]["event"] == "result" and ev[-1]["outcome"] == "succeeded", ev[-1]
    hang = of(ev, "hang", cycle=0)
    assert len(hang) == 1 and hang[0]["local_rank"] == 1, hang
    assert "panicked" not in err and "RUST_BACKTRACE" not in err
    # Said once, naming the file and the cause.
    cannot = [l for l in err.splitlines() if "cannot write the rank log" in l]
    assert len(cannot) == 1, err
    assert str(small) in cannot[0] and "No space left on device" in cannot[0], cannot
    # The stacks could not be written: the message says so and does not blame the shim.
    stacks = [l for l in err.splitlines() if "rank 1 stacks captured" in l]
    assert len(stacks) == 1, err
    assert "not imported the vigil shim" not in stacks[0], stacks
    assert "log directory cannot be written" in stacks[0] and "No space left on device" in stacks[0], stacks
    # Training went on: the attempt after the restart ran and was shown on the console.
    assert "[default0]:attempt 1 of rank 0 goes on" in out.splitlines()
    # What fitted is in the log, whole as written, up to the full disk.
    (rd,) = run_dirs(small)
    data = (rd / "attempt_0" / "0" / "stdout.log").read_bytes()
    assert 0 < len(data) < 4 << 20 and data.startswith(b"y" * 1023 + b"\n")


# Attempt 0 fails once the test has made the log directory read-only; attempt 1 must still run.
FAIL_WHEN_TOLD = """
import os, sys, time
out = os.environ["OUT_DIR"]
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
print("attempt", attempt, "of rank", rank, flush=True)
if attempt == "0":
    open(os.path.join(out, "started_" + rank), "w").close()
    while not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.05)
    print("after the change", flush=True)
    sys.exit(1 if rank == "0" else 0)
"""


def test_read_only_log_dir_mid_run_keeps_the_job_going_and_is_said_once(job, mounts):
    write(job / "t.py", FAIL_WHEN_TOLD)
    logs = job / "logs"
    p = start_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", "logs", "t.py"],
                    cwd=job, env=base_env(OUT_DIR=job))
    try:
        wait_for(lambda: (job / "started_0").exists() and (job / "started_1").exists(), what="attempt 0 running")
        (rd,) = run_dirs(logs)
        # The run directory becomes a read-only file system: what is open stays writable, nothing
        # new can be created there.
        mounts(rd, "ro", "size=1m")
        (job / "go").touch()
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert "panicked" not in err
    cannot = [l for l in err.splitlines() if "cannot create the rank logs" in l]
    assert len(cannot) == 1, err
    assert str(rd / "attempt_1") in cannot[0] and "Read-only file system" in cannot[0], cannot
    lines = out.splitlines()
    assert "[default0]:attempt 1 of rank 0" in lines and "[default1]:attempt 1 of rank 1" in lines
    assert "all ranks finished successfully" in err


def test_log_dir_deleted_mid_run_keeps_the_job_going_and_the_stacks_message_names_the_cause(job):
    write(job / "t.py", """
import os, sys, time
import vigil
out = os.environ["OUT_DIR"]
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    print("attempt 1 goes on", flush=True)
    sys.exit(0)
i = 0
while not os.path.exists(os.path.join(out, "deleted")):
    vigil.heartbeat(i)
    i += 1
    time.sleep(0.05)
print("printing into a deleted log", flush=True)
time.sleep(600)
""")
    logs = job / "logs"
    ev_path = job / "events.jsonl"
    p = start_vigil(["run", "--max-restarts", "1", "--heartbeat-timeout", "2", "--stack-dump-timeout", "2",
                     "--log-dir", "logs", "--event-log", str(ev_path), "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    try:
        wait_for(lambda: of(read_events(ev_path), "registered"), what="the rank registered")
        (rd,) = run_dirs(logs)
        shutil.rmtree(rd)
        (job / "deleted").touch()
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert "panicked" not in err
    stacks = [l for l in err.splitlines() if "rank 0 stacks captured" in l]
    assert len(stacks) == 1, err
    assert "not imported the vigil shim" not in stacks[0], stacks
    assert "log directory cannot be written" in stacks[0] and "No such file or directory" in stacks[0], stacks
    assert "[default0]:attempt 1 goes on" in out.splitlines()
    ev = read_events(ev_path)
    assert ev[-1]["outcome"] == "succeeded"
    pid = of(ev, "rank_started", cycle=0)[0]["pid"]
    assert not pid_alive(pid)

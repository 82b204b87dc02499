"""A log directory that fills up while the job runs costs neither the event log nor its records
(docs/reliability.md, violation 8 and seed 7's lost fault): the records made while it is full are
held back and written, in order and with their own times, once space is freed; the log goes on,
and every line of it is whole JSON.

Real parts: the real binary, two real ranks, a real tmpfs filled by `dd` until it is full. Needs
root to mount the tmpfs; skipped, saying so, without it."""
import json
import os
import subprocess
import time

import pytest

from harness import base_env, run_dirs, run_vigil, vigil_bin, wait_for, write

# Rank 1 fails at once while `fail` exists and `steady` does not (each failure is a restart, with
# its records); once `steady` exists, every rank says so and waits for `release`.
TRAIN = """
import os, pathlib, sys, time
out = pathlib.Path(os.environ["OUT_DIR"])
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
(out / f"started_{attempt}_{rank}").write_text("1")
while not (out / "release").exists():
    if (out / "steady").exists():
        (out / f"steady_{attempt}_{rank}").write_text("1")
    elif rank == 1 and (out / "fail").exists():
        sys.exit(1)
    time.sleep(0.05)
"""

NOTE = "cannot write the event log"


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs, unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (run the tests as root)")
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def fill(d):
    """Writes zeros to `d/fill` until the file system is full."""
    r = subprocess.run(["dd", "if=/dev/zero", f"of={d / 'fill'}", "bs=4k"],
                       capture_output=True, text=True)
    assert "No space left" in r.stderr, r.stderr


def steady_attempt(out):
    """The attempt both ranks reported steady in, or None."""
    by = {}
    for p in out.glob("steady_*"):
        _, attempt, rank = p.name.split("_")
        by.setdefault(int(attempt), set()).add(int(rank))
    return next((a for a, ranks in by.items() if ranks == {0, 1}), None)


def test_a_full_log_dir_holds_records_back_and_writes_them_once_there_is_room(job, small_fs):
    write(job / "train.py", TRAIN)
    logs = small_fs / "logs"
    err_path = job / "vigil.err"
    with open(err_path, "w") as err:
        p = subprocess.Popen(
            [vigil_bin(), "run", "--nproc-per-node", "2", "--max-restarts", "100",
             "--restart-backoff", "0", "--log-dir", str(logs), "train.py"],
            cwd=job, env=base_env(OUT_DIR=job), stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        wait_for(lambda: (job / "started_0_0").exists() and (job / "started_0_1").exists(),
                 timeout=60, what="attempt 0's ranks")
        fill(small_fs)
        # Rank 1 fails and fails again: the restarts' records fill what room the event log's last
        # page had, and the agent says, once, that it cannot write the log.
        (job / "fail").write_text("1")
        wait_for(lambda: NOTE in err_path.read_text(), timeout=120,
                 what="the agent's note that it cannot write the event log")
        # A few more failures while it is full, each with its records.
        wait_for(lambda: len(list(job.glob("started_*_1"))) >= 4, timeout=120,
                 what="rank 1 failing while the log directory is full")
        freed_at = time.time()
        (small_fs / "fill").unlink()
        (job / "steady").write_text("1")
        attempt = wait_for(lambda: steady_attempt(job) is not None and steady_attempt(job),
                           timeout=120, what="both ranks of an attempt after the space was freed")
        (job / "release").write_text("1")
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = err_path.read_text()
    assert p.returncode == 0, text
    assert text.count(NOTE) >= 1, text
    (run,) = run_dirs(logs)
    lines = (run / "events.jsonl").read_text().split("\n")
    assert lines[-1] == "", "the log ends inside a line"
    ev = []
    for i, l in enumerate(lines[:-1]):
        try:
            ev.append(json.loads(l))
        except ValueError as e:
            raise AssertionError(f"line {i + 1} of events.jsonl is not whole JSON ({e}): {l!r}")
    names = [e["event"] for e in ev]
    assert "written again" in text and "held back" in text, text
    # Nothing lost: the failures made while it was full are in the log, with their own times
    # (before the space was freed), in order, and every attempt's failure is there.
    assert not [e for e in ev if e["event"] == "events_lost"], names
    failed = [e for e in ev if e["event"] == "rank_exited" and e.get("exit_code") == 1]
    assert [e for e in failed if e["ts"] < freed_at], names
    assert [e["cycle"] for e in failed] == list(range(len(failed))), failed
    assert len(failed) >= 3 and len(failed) >= attempt, (len(failed), attempt)
    ts = [e["ts"] for e in ev]
    assert ts == sorted(ts), "records out of order"
    # What happened after the space was freed is in the log: the ends of the ranks of the
    # attempt they were steady in, and the job's result.
    assert sorted(e["rank"] for e in ev if e["event"] == "rank_exited" and e["cycle"] == attempt
                  and e["exit_code"] == 0) == [0, 1], names
    assert ev[-1]["event"] == "result" and ev[-1]["outcome"] == "succeeded", ev[-1]
    # `vigil report` reads it whole.
    rep = run_vigil(["report", str(run), "-o", str(job / "report.html")], cwd=job, timeout=60)
    assert rep.returncode == 0, rep.stderr


# Prints a line, then, once told, 4 KiB lines (each one write, whole in the pipe) until told to
# stop, then a last line.
PRINTER = """
import os, pathlib, time
out = pathlib.Path(os.environ["OUT_DIR"])
print("before", flush=True)
(out / f"printed_{os.environ['RANK']}").write_text("1")
while not (out / "full").exists():
    time.sleep(0.05)
while not (out / "freed").exists():
    print("x" * 4095, flush=True)
    time.sleep(0.02)
print("after", flush=True)
(out / f"done_{os.environ['RANK']}").write_text("1")
while not (out / "release").exists():
    time.sleep(0.05)
"""


def test_a_rank_log_is_written_again_once_there_is_room(job, small_fs):
    write(job / "printer.py", PRINTER)
    logs = small_fs / "logs"
    err_path = job / "vigil.err"
    with open(err_path, "w") as err:
        p = subprocess.Popen(
            [vigil_bin(), "run", "--nproc-per-node", "2", "--log-dir", str(logs),
             "--duplicate-stdout-filters", "before,xxxx,after", "printer.py"],
            cwd=job, env=base_env(OUT_DIR=job), stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        wait_for(lambda: (job / "printed_0").exists() and (job / "printed_1").exists(), timeout=60,
                 what="the ranks' first lines")
        fill(small_fs)
        (job / "full").write_text("1")
        wait_for(lambda: "cannot write the rank log" in err_path.read_text(), timeout=60,
                 what="the agent's note that it cannot write a rank log")
        (small_fs / "fill").unlink()
        (job / "freed").write_text("1")
        wait_for(lambda: (job / "done_0").exists() and (job / "done_1").exists(), timeout=60,
                 what="the ranks' last lines")
        (job / "release").write_text("1")
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = err_path.read_text()
    assert p.returncode == 0, text
    # Said once each: that a rank log could not be written, and that one is written again.
    assert text.count("cannot write the rank log") == 1, text
    assert text.count("is written again") == 1, text
    (run,) = run_dirs(logs)
    for rank in (0, 1):
        data = (run / "attempt_0" / str(rank) / "stdout.log").read_bytes()
        # The first line, what fitted of the rest (a write that did not fit keeps its first part:
        # the file is the rank's bytes, not records), and the last line, once there was room.
        assert data.startswith(b"before\n") and data.endswith(b"after\n"), (rank, data[-100:])
        assert set(data[len(b"before\n"):-len(b"after\n")]) <= set(b"x\n"), rank
    # The filtered copy (--duplicate-stdout-filters; every line matches) is written again too.
    kept = (run / "attempt_0" / "filtered_stdout.log").read_text().splitlines()
    for rank in (0, 1):
        assert f"[default{rank}]:before" in kept and f"[default{rank}]:after" in kept, kept[-4:]
    # Whole lines only: a write that did not fit is cut off again.
    whole = {f"[default{r}]:{t}" for r in (0, 1) for t in ("before", "after", "x" * 4095)}
    assert all(l in whole for l in kept), [l[:40] + "..." + l[-20:] for l in kept if l not in whole]

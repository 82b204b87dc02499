"""Restarts back off: a rank that fails at once with a large --max-restarts must not make hundreds of
restarts in a few seconds (fault-findings item 10: 500 instant failures took 76 s at 190% CPU).

The first restart is immediate, later ones in a streak wait base, 2*base, ... up to a cap; an attempt
that ran long enough starts a new streak. Every test runs the real agent; the waits are checked from
the event log's order and time stamps as lower bounds, never as tight timings.
"""
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from harness import base_env, events, run_vigil, start_vigil, wait_for, write  # noqa: E402
from test_multinode import Nodes  # noqa: E402

# Fails at once in every attempt, without Python's start-up time.
FAIL = "#!/bin/sh\nexit 3\n"


def of(ev, name):
    return [e for e in ev if e["event"] == name]


def waits_respected(ev):
    """Each restart's back-off really passed between the verdict and the next attempt's start."""
    for r in of(ev, "restart"):
        ended = [e for e in ev if e["event"] == "cycle_ended" and e["cycle"] == r["from_cycle"]][0]
        start = [e for e in ev if e["event"] == "cycle_start" and e["cycle"] == r["to_cycle"]][0]
        # 50 ms of slack for the time stamps' own rounding and the order they were written in.
        assert start["ts"] - ended["ts"] >= r["backoff_ms"] / 1000 - 0.05, (r, ended, start)


def test_default_backoff_is_immediate_then_doubles(job):
    script = write(job / "fail.sh", FAIL)
    script.chmod(0o755)
    r = run_vigil(["run", "--no-python", "--max-restarts", "3", "--log-dir", str(job / "logs"),
                   str(script)], cwd=job)
    assert r.returncode == 1, r.stderr
    ev = events(job / "logs")
    assert [e["backoff_ms"] for e in of(ev, "restart")] == [0, 1000, 2000]
    assert [e["cycle"] for e in of(ev, "cycle_start")] == [0, 1, 2, 3]
    waits_respected(ev)
    assert "waiting 1.0s before attempt 2 (restart back-off)" in r.stderr


def test_backoff_is_capped_and_can_be_turned_off(job):
    script = write(job / "fail.sh", FAIL)
    script.chmod(0o755)
    r = run_vigil(["run", "--no-python", "--max-restarts", "5", "--restart-backoff", "0.2",
                   "--restart-backoff-max", "0.5", "--log-dir", str(job / "a"), str(script)], cwd=job)
    assert r.returncode == 1, r.stderr
    ev = events(job / "a")
    assert [e["backoff_ms"] for e in of(ev, "restart")] == [0, 200, 400, 500, 500]
    waits_respected(ev)

    r = run_vigil(["run", "--no-python", "--max-restarts", "5", "--restart-backoff", "0",
                   "--log-dir", str(job / "b"), str(script)], cwd=job)
    assert r.returncode == 1, r.stderr
    assert [e["backoff_ms"] for e in of(events(job / "b"), "restart")] == [0] * 5


def test_an_attempt_that_ran_long_enough_starts_a_new_streak(job):
    # Attempts 0, 1 and 3 fail at once; attempt 2 runs past --restart-backoff-reset first.
    script = write(job / "flaky.sh", f"""#!/bin/sh
if [ "$TORCHELASTIC_RESTART_COUNT" = 2 ]; then
    while [ ! -e {job}/go ]; do sleep 0.05; done
fi
exit 3
""")
    script.chmod(0o755)
    p = start_vigil(["run", "--no-python", "--max-restarts", "3", "--restart-backoff", "0.3",
                     "--restart-backoff-reset", "2", "--log-dir", str(job / "logs"), str(script)], cwd=job)
    try:
        wait_for(lambda: any(e["event"] == "cycle_start" and e["cycle"] == 2
                             for e in safe_events(job / "logs")),
                 timeout=60, what="attempt 2 to start")
        start = [e for e in events(job / "logs") if e["event"] == "cycle_start" and e["cycle"] == 2][0]
        # Let attempt 2 run past the reset (an observable condition: the clock the log uses).
        wait_for(lambda: time.time() - start["ts"] > 3, timeout=30, what="attempt 2 to run 3 s")
        (job / "go").write_text("")
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 1, err
    restarts = of(events(job / "logs"), "restart")
    assert [e["backoff_ms"] for e in restarts] == [0, 300, 0], restarts
    assert restarts[2]["ran_ms"] >= 2000, restarts


def safe_events(log_dir):
    try:
        return events(log_dir)
    except (ValueError, FileNotFoundError):
        return []


def test_a_signal_ends_a_backoff_promptly(job):
    script = write(job / "fail.sh", FAIL)
    script.chmod(0o755)
    # The second restart would wait 10 minutes.
    p = start_vigil(["run", "--no-python", "--max-restarts", "500", "--restart-backoff", "600",
                     "--restart-backoff-max", "600", "--log-dir", str(job / "logs"), str(script)], cwd=job)
    try:
        wait_for(lambda: any(e["event"] == "restart" and e["backoff_ms"] == 600_000
                             for e in safe_events(job / "logs")),
                 timeout=60, what="the agent to back off before attempt 2")
        p.send_signal(signal.SIGTERM)
        # Far less than the back-off: the signal, not the end of the wait, ends the agent.
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 128 + signal.SIGTERM, err
    ev = events(job / "logs")
    assert [e["cycle"] for e in of(ev, "cycle_start")] == [0, 1]
    assert of(ev, "result")[0]["outcome"] == "signaled"


def test_every_node_backs_off_alike(job):
    # Node 1's rank fails at once in every attempt; node 0's waits to be stopped.
    script = write(job / "train.py", """
import os, sys, time
if os.environ["GROUP_RANK"] == "1":
    sys.exit(3)
time.sleep(600)
""")
    nodes = Nodes(job, 2, [str(script)], nproc=1,
                  extra=["--max-restarts", "3", "--restart-backoff", "0.5"])
    res = nodes.wait(timeout=120)
    assert [rc for rc, _, _ in res] == [1, 1], res
    for i in range(2):
        ev = nodes.events(i)
        assert [e["backoff_ms"] for e in of(ev, "restart")] == [0, 500, 1000], (i, ev)
        assert [e["cycle"] for e in of(ev, "cycle_start")] == [0, 1, 2, 3]
        waits_respected(ev)

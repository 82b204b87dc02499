"""The real agent and `Progress` (kind 0x09): it takes the message, and the message is not a heartbeat."""
from harness import events, of, one, run_vigil, write

# Heartbeats twice, then only reports progress through should_stop(step), for at most 120 s.
PROGRESS_ONLY = """
import time
import vigil

vigil.heartbeat(0)
vigil.heartbeat(0)
step, deadline = 1, time.monotonic() + 120
while time.monotonic() < deadline:
    vigil.should_stop(step)
    step += 1
    time.sleep(0.02)
print("never caught", flush=True)
"""


def test_a_rank_that_only_reports_progress_is_caught_by_the_heartbeat_timeout(job):
    write(job / "t.py", PROGRESS_ONLY)
    r = run_vigil(["run", "--max-restarts", "0", "--heartbeat-timeout", "1", "--log-dir", "logs", "t.py"],
                  cwd=job, timeout=240)
    assert "never caught" not in r.stdout, "Progress kept the rank looking alive"
    assert r.returncode != 0, r.stderr  # 1, or 75 where a failed allocation may be requeued
    ev = events(job / "logs")
    one(ev, "registered", cycle=0)
    hang = one(ev, "hang", cycle=0)
    assert hang["timeout"] == "heartbeat" and hang["limit_ms"] == 1000 and hang["silent_ms"] >= 1000
    # The connection stayed up through dozens of Progress messages: a dropped one is not monitored.
    assert of(ev, "ipc_rejected") == []

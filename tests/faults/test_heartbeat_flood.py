"""Eight ranks heartbeating as fast as they can: the agent's memory stays flat and a hang on
another rank is still noticed on time.

Found by attack (fault-findings 5): an unbounded queue between the socket readers and the loop
grew the agent's RSS linearly (11.6 MB -> 120 MB in a minute) and a hang was noticed 2 s late.
Real binary, real ranks; the bounds are generous failure limits.
"""
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from harness import base_env, read_events, start_vigil, wait_for, write  # noqa: E402

FLOODERS = 8

# Local ranks 0..7 heartbeat flat out until stopped; the last rank heartbeats every 50 ms until
# HANG_AFTER seconds after the flood started, then hangs.
SCRIPT = """
import os, time
import vigil
out = os.environ["OUT_DIR"]
lr = int(os.environ["LOCAL_RANK"])
vigil.heartbeat(0)
open(os.path.join(out, "up_%d" % lr), "w").close()
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.01)
if lr < int(os.environ["FLOODERS"]):
    i = 0
    while True:
        vigil.heartbeat(i)
        i += 1
t0 = time.monotonic()
i = 0
while time.monotonic() - t0 < float(os.environ["HANG_AFTER"]):
    vigil.heartbeat(i)
    i += 1
    time.sleep(0.05)
open(os.path.join(out, "last_heartbeat"), "w").write(repr(time.monotonic()))
time.sleep(600)
"""


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_heartbeat_flood_keeps_rss_flat_and_another_ranks_hang_is_detected(job):
    write(job / "t.py", SCRIPT)
    ev_path = job / "events.jsonl"
    hang_after = 25.0
    timeout = 3.0
    p = start_vigil(["run", "--nproc-per-node", str(FLOODERS + 1), "--heartbeat-timeout", str(timeout),
                     "--max-restarts", "0", "--log-dir", "logs", "--event-log", str(ev_path), "t.py"],
                    cwd=job, env=base_env(OUT_DIR=job, FLOODERS=FLOODERS, HANG_AFTER=hang_after))
    samples = []  # (monotonic, rss kB)
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                samples.append((time.monotonic(), rss_kb(p.pid)))
            except (OSError, AssertionError):
                return
            time.sleep(0.25)

    try:
        wait_for(lambda: all((job / f"up_{i}").exists() for i in range(FLOODERS + 1)), timeout=60,
                 what="every rank connected")
        t = threading.Thread(target=sample, daemon=True)
        t.start()
        go = time.monotonic()
        (job / "go").touch()
        hang = wait_for(lambda: [e for e in read_events(ev_path) if e["event"] == "hang"], timeout=hang_after + 60,
                        what="the hang of the quiet rank")[0]
        seen = time.monotonic()
        stop.set()
        out, err = p.communicate(timeout=60)
    finally:
        stop.set()
        if p.poll() is None:
            p.kill()
            p.wait()
    assert hang["local_rank"] == FLOODERS and hang["timeout"] == "heartbeat", hang
    last = float((job / "last_heartbeat").read_text())
    # Noticed within a generous second of its deadline, flood or not.
    # The deadline is the last heartbeat plus the limit the agent applied (it may have calculated
    # a shorter one than configured from the heartbeats it saw).
    late = seen - (last + hang["limit_ms"] / 1000)
    assert late < 1.5, f"the hang was noticed {late:.2f}s after its deadline"
    assert hang["silent_ms"] - hang["limit_ms"] < 1500, hang
    # Memory: after 5 s of warm-up, flat to the end of the flood.
    warm = [kb for (ts, kb) in samples if ts - go >= 5.0 and ts < seen - 0.5]
    assert len(warm) > 20, samples
    assert max(warm) - warm[0] < 8 * 1024, f"RSS grew from {warm[0]} kB to {max(warm)} kB under the flood"
    assert p.returncode == 1, err[-2000:]

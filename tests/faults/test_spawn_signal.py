"""A SIGTERM that arrives while the agent is still starting its ranks (fault-findings 3, second half).

The rank ceiling (16 per CPU, and what the descriptor limit allows) bounds a spawn burst, so the
agent handles a signal that came in during the burst as soon as the burst is over: every rank it
started gets the signal, nothing is left running, and the agent ends with 128 + SIGTERM. The test
sends the signal the moment the first rank runs, while the others are still being started.
"""
import os
import signal

from harness import base_env, events, of, pid_alive, start_vigil, wait_for, write

SCRIPT = """
import os, sys, time, pathlib
out = pathlib.Path(os.environ["OUT_DIR"])
(out / f"pid_{os.environ['RANK']}").write_text(str(os.getpid()))
time.sleep(600)
"""


def test_sigterm_during_the_spawn_burst_stops_every_rank_started(job):
    n = min(16 * (os.cpu_count() or 1), 32)
    write(job / "sleep.py", SCRIPT)
    p = start_vigil(["run", "--nproc-per-node", str(n), "--term-timeout", "5", "--log-dir", str(job / "logs"),
                     "sleep.py"], cwd=job, env=base_env(OUT_DIR=job))
    ev_dir = job / "logs"
    # The first rank started: the agent is inside (or just past) the burst.
    wait_for(lambda: any(of(events(ev_dir), "rank_started")) if list(ev_dir.glob("*/events.jsonl")) else False,
             60, "the first rank to start")
    p.send_signal(signal.SIGTERM)
    o, e = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, e
    ev = events(ev_dir)
    started = {x["pid"] for x in of(ev, "rank_started")}
    exited = {x["pid"] for x in of(ev, "rank_exited")}
    assert started and started == exited, (started - exited)
    assert not [pid for pid in started if pid_alive(pid)]
    assert "Traceback" not in e and "panicked" not in e

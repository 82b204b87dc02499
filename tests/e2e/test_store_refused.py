"""Clients without the job's secret at node rank 0's store (junk bytes, a flood of connections that
never say a word) are in the job's event log: a `store_refused` record with the counts by kind and
the last peer (docs/store.md, "Connections turned away"), and a console line; the job goes on.

The real binary hosts the real store; the junk and the flood are real sockets from this test."""
import socket
import time

from harness import base_env, events, of, send_junk, start_vigil, wait_for, write

# Runs until released (the file `release`), after saying it started.
TRAIN = """
import os, pathlib, time
out = pathlib.Path(os.environ["OUT_DIR"])
(out / "started").write_text("1")
while not (out / "release").exists():
    time.sleep(0.05)
"""

FLOOD = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused(job):
    return of(events(job / "logs"), "store_refused")


def test_junk_and_a_flood_at_the_store_are_recorded_and_the_job_goes_on(job):
    write(job / "train.py", TRAIN)
    port = free_port()
    p = start_vigil(["run", "--nnodes", "1", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                     "--master-port", str(port), "--log-dir", str(job / "logs"), "train.py"],
                    cwd=job, env=base_env(OUT_DIR=job))
    try:
        wait_for(lambda: (job / "started").exists(), timeout=60, what="the rank's start")
        # The agent's and the rank's own connections are no refusal.
        assert refused(job) == []
        # A client that sends what is not the store's handshake (a port scanner, junk).
        send_junk(port, b"\xff" * 512)
        wait_for(lambda: any(r["bad_bytes"] >= 1 for r in refused(job)), timeout=30,
                 what="a store_refused record of the junk")
        # A flood: connections that never say a word, held, then closed.
        flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(FLOOD)]
        time.sleep(1)  # held open, as chaos.py's flood does; not a wait for a result
        for s in flood:
            s.close()

        def flood_seen():
            rs = refused(job)
            return rs and rs[-1]["closed_in_handshake"] + rs[-1]["over_budget"] >= FLOOD and rs

        # At most one record per 10 s: the flood's is due at the end of the junk's window.
        rs = wait_for(flood_seen, timeout=60, what="a store_refused record of the flood")
        last = rs[-1]
        assert last["node_rank"] == 0
        assert last["bad_bytes"] == 1 and last["wrong_secret"] == 0, last
        # Every connection of the flood, and nothing else: closed in its handshake by the client,
        # or by the store to keep at most 256 in their handshake (how many of each depends on how
        # fast the store accepted them).
        assert last["closed_in_handshake"] + last["over_budget"] == FLOOD, last
        assert last["last_peer"].startswith("127.0.0.1:"), last
        assert sum(r["new"] for r in rs) == last["bad_bytes"] + last["closed_in_handshake"] + \
            last["over_budget"], rs
        assert len(rs) <= 3, rs
        (job / "release").write_text("1")
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    assert "vigil's store turned away" in err, err
    ev = events(job / "logs")
    assert of(ev, "result")[-1]["outcome"] == "succeeded", of(ev, "result")

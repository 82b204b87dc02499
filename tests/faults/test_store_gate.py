"""The store's gate, attacked as field findings 31-33 did: a client that never proves the job's
secret sweeps the liveness counters, parks thousands of waits on large keys, or floods node rank
0 with idle connections. Each ended the job (or grew node rank 0 to gigabytes) before the store
decided authentication in one place; now the job finishes. Real binary, real ranks, real sockets.
"""
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import wait_for, write  # noqa: E402
from test_multinode import Nodes, markers  # noqa: E402
from test_store import WORKER, Raw, rss_mb  # noqa: E402

SECRET = "test-secret-0123456789abcdef"

# Ranks that run until released; with `crash_once`, rank 0 of attempt 0 fails once released, so
# the job restarts and finishes in attempt 1.
CRASH_ONCE = """
import os, pathlib, sys, time
out = pathlib.Path(os.environ["OUT_DIR"])
rank, attempt = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
(out / f"ran_{rank}_{attempt}").write_text(str(os.getpid()))
while attempt == 0 and not (out / "release").exists():
    time.sleep(0.05)
if attempt == 0 and rank == "0":
    sys.exit(3)
"""


def secured(job, how):
    """The job's arguments and environment for a store closed by `how`: the job script's
    VIGIL_STORE_SECRET, or (the default) the secret node rank 0 writes to the shared state dir."""
    if how == "env":
        return [], {"VIGIL_STORE_SECRET": SECRET}
    return ["--rdzv-id", "gate-test", "--state-dir", str(job / "state")], {}


def sweep(addr, stop, seen):
    """SWEEP "" every 20 ms (VALIDATE only, no secret), reconnecting whenever the store closes
    the connection, until `stop`."""
    while not stop.is_set():
        try:
            c = Raw(addr)
            while not stop.is_set():
                c.send(b"\x63" + Raw.b(b""))
                c.s.settimeout(1)
                (n,) = struct.unpack("<q", c.recv_exact(8))
                seen.append(n)
                time.sleep(0.02)
        except (OSError, ConnectionError):
            time.sleep(0.02)


@pytest.mark.parametrize("how", ["env", "state-dir"])
def test_an_unauthenticated_sweep_every_20ms_does_not_end_the_job(job, how):
    write(job / "worker.py", WORKER)
    extra, env = secured(job, how)
    nodes = Nodes(job, 2, ["worker.py"], extra=["--node-timeout", "5", *extra], env=env)
    stop, seen = threading.Event(), []
    t = threading.Thread(target=sweep, args=(("127.0.0.1", nodes.port), stop, seen), daemon=True)
    try:
        wait_for(lambda: len(markers(job, "ran_")) == 4, timeout=60, what="all four ranks running")
        t.start()
        time.sleep(15)  # the attack's length; three node timeouts
        stop.set()
        t.join(10)
        assert [p.poll() for p in nodes.procs] == [None, None], "a node ended under the attack"
        assert seen == [], "a sweep without the secret was answered"
        (job / "release").write_text("")
        res = nodes.wait()
        assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
        assert "before the connection proved the job's secret" in res[0][2], res[0][2]
    finally:
        stop.set()
        nodes.kill()


def park_waits(addr, n):
    """VALIDATE, then `n` tagged WAIT_GETs on 60 KB keys, without the secret."""
    c = Raw(addr)
    key = b"/" + b"w" * (60 << 10)
    try:
        for tag in range(n):
            c.send(b"\x64" + struct.pack("<I", tag) + b"\x65" + struct.pack("<Q", 1) + Raw.b(key + b"%d" % tag))
    except OSError:
        pass
    return c


def test_unauthenticated_tagged_waits_do_not_grow_node_rank_0(job):
    write(job / "worker.py", WORKER)
    nodes = Nodes(job, 2, ["worker.py"], env={"VIGIL_STORE_SECRET": SECRET})
    held = []
    try:
        wait_for(lambda: len(markers(job, "ran_")) == 4, timeout=60, what="all four ranks running")
        base = rss_mb(nodes.procs[0].pid)
        for _ in range(14):
            held.append(park_waits(("127.0.0.1", nodes.port), 1024))
        assert all(c.closed() for c in held), "a connection without the secret was kept"
        peak = rss_mb(nodes.procs[0].pid)
        assert peak < 512, (base, peak)
        assert peak < base + 64, (base, peak)
        (job / "release").write_text("")
        res = nodes.wait()
        assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    finally:
        for c in held:
            c.close()
        nodes.kill()


FLOOD = """
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for _ in range(n):
    try:
        held.append(socket.create_connection((host, port), timeout=30))
    except OSError:
        time.sleep(0.001)
print(len(held), flush=True)
sys.stdin.read()
"""


def open_files(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_flood_of_idle_connections_leaves_the_next_restart_working(job):
    """20,000 idle connections to node rank 0's store (two processes of 10,000, each within this
    machine's open-file limit), then a rank fails: the restart spawns every rank again and the
    job finishes. Before the gate the flood took node rank 0's descriptors and the restart failed
    with "Too many open files" (field finding 33)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < 10_100:
        pytest.skip(f"the open-file hard limit is {hard}, under the 10,100 a flooding process needs")
    write(job / "worker.py", CRASH_ONCE)
    write(job / "flood.py", FLOOD)
    nodes = Nodes(job, 2, ["worker.py"], extra=["--max-restarts", "1"], env={"VIGIL_STORE_SECRET": SECRET})
    floods = []
    try:
        wait_for(lambda: len(markers(job, "ran_")) == 4, timeout=60, what="all four ranks running")
        limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # noqa: E731
        for _ in range(2):
            floods.append(subprocess.Popen([sys.executable, str(job / "flood.py"), "127.0.0.1", str(nodes.port),
                                            "10000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                           preexec_fn=limit))
        opened = [int(f.stdout.readline()) for f in floods]
        assert sum(opened) >= 19_000, opened
        assert open_files(nodes.procs[0].pid) < 2_000, open_files(nodes.procs[0].pid)
        (job / "release").write_text("")
        res = nodes.wait(timeout=120)
        assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
        assert len(markers(job, "ran_")) == 8, markers(job, "ran_")
        assert "Too many open files" not in res[0][2], res[0][2]
    finally:
        for f in floods:
            f.kill()
            f.communicate()
        nodes.kill()


def authenticated(addr, secret):
    """A connection that proved `secret` as a vigil agent does (AUTH_CHALLENGE, AUTH_PROOF)."""
    import hashlib
    import hmac
    c = Raw(addr)
    c.send(b"\x60")
    required, nonce = c.recv_exact(1), c.recv_exact(32)
    assert required == b"\x01"
    proof = hmac.new(secret.encode(), b"vigil-store-auth-v1" + nonce, hashlib.sha256).digest()
    c.send(b"\x61" + proof)
    assert c.recv_exact(1) == b"\x01"
    return c


def test_waits_parked_by_an_agent_count_against_the_total_and_go_when_it_closes(job):
    """An authenticated connection parks tagged waits on 60 KB keys: the store counts them
    against its 256 MiB total (the one over it closes the connection), and once the connections
    close node rank 0's resident size comes back (field finding 32: 729 MB stayed)."""
    write(job / "worker.py", WORKER)
    nodes = Nodes(job, 1, ["worker.py"], nproc=1, env={"VIGIL_STORE_SECRET": SECRET})
    held = []
    try:
        wait_for(lambda: markers(job, "ran_"), timeout=60, what="the rank running")
        agent = nodes.procs[0].pid
        base = rss_mb(agent)
        key = b"/" + b"w" * (60 << 10)
        for conn in range(4):
            c = authenticated(("127.0.0.1", nodes.port), SECRET)
            try:
                for tag in range(1024):
                    c.send(b"\x64" + struct.pack("<I", tag) + b"\x65" + struct.pack("<Q", 1)
                           + Raw.b(key + b"%d-%d" % (conn, tag)))
            except OSError:
                pass
            held.append(c)
        # 1,024 waits on 60 KB keys take about 123 MB: the third connection goes over 256 MiB.
        for c in held:
            c.s.settimeout(3)
        over = [c.closed() for c in held]
        assert over[:2] == [False, False] and any(over[2:]), over
        peak = rss_mb(agent)
        assert peak < 512, (base, peak)
        for c in held:
            c.close()
        wait_for(lambda: rss_mb(agent) < base + 64, timeout=30,
                 what=f"node rank 0's RSS back near {base:.0f} MB (peak {peak:.0f} MB)")
        (job / "release").write_text("")
        res = nodes.wait()
        assert [rc for rc, _, _ in res] == [0], [e for _, _, e in res]
        assert "the store is full" in res[0][2], res[0][2]
    finally:
        for c in held:
            c.close()
        nodes.kill()

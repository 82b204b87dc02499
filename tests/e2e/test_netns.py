"""Agents on separate network addresses: two Linux network namespaces joined by a veth pair,
created by the test. Cutting the link must end the job on both sides within the node timeout,
with the requeue status, and leave no rank behind.

Needs root and iproute2 (`ip`); skipped otherwise, unless VIGIL_REQUIRE_NETNS=1 (set by .ci/run).
"""
import os
import shutil
import subprocess
import uuid

import pytest

from harness import base_env, events, pid_alive, vigil_bin, wait_for, write
from test_multinode import FLAKY, markers, of

REQUIRED = os.environ.get("VIGIL_REQUIRE_NETNS") == "1"


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def two_hosts():
    """Namespaces `a` (10.77.<x>.1) and `b` (10.77.<x>.2) on one veth link; yields (a, b, cut)."""
    why = None
    if os.geteuid() != 0:
        why = "network namespaces need root"
    elif not shutil.which("ip"):
        why = "iproute2 (`ip`) is not installed"
    if why:
        if REQUIRED:
            pytest.fail(f"VIGIL_REQUIRE_NETNS=1 but {why}")
        pytest.skip(why)
    tag = uuid.uuid4().hex[:6]
    a, b = f"vga{tag}", f"vgb{tag}"
    va, vb = f"va{tag}", f"vb{tag}"
    net = int(tag[:2], 16)
    try:
        ip("netns", "add", a)
        ip("netns", "add", b)
        ip("link", "add", va, "type", "veth", "peer", "name", vb)
        ip("link", "set", va, "netns", a)
        ip("link", "set", vb, "netns", b)
        ip("-n", a, "addr", "add", f"10.77.{net}.1/24", "dev", va)
        ip("-n", b, "addr", "add", f"10.77.{net}.2/24", "dev", vb)
        for ns, dev in ((a, va), (b, vb)):
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        for ns in (a, b):
            ip("netns", "del", ns, check=False)
        if REQUIRED:
            pytest.fail(f"cannot create network namespaces: {e.stderr}")
        pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")

    def cut():
        # Node b's cable is pulled: from then on neither side hears from the other.
        ip("-n", b, "link", "set", vb, "down")

    try:
        yield (a, f"10.77.{net}.1"), (b, f"10.77.{net}.2"), cut
    finally:
        for ns in (a, b):
            ip("netns", "del", ns, check=False)


def start_in(ns, job, node_rank, head_addr, extra, nnodes="2"):
    logs = job / f"node{node_rank}" / "logs"
    logs.mkdir(parents=True)
    args = ["ip", "netns", "exec", ns, vigil_bin(), "run", "--nnodes", nnodes, "--node-rank", str(node_rank),
            "--master-addr", head_addr, "--master-port", "29500", "--nproc-per-node", "2",
            "--log-dir", str(logs), *extra]
    return subprocess.Popen(args, cwd=job, env=base_env(OUT_DIR=job), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_cutting_a_node_off_ends_the_job_on_both_sides(job, two_hosts):
    (ns_a, addr_a), (ns_b, _), cut = two_hosts
    write(job / "flaky.py", FLAKY)
    extra = ["--max-restarts", "3", "--node-timeout", "3", "--workers-stop-timeout", "2", "flaky.py", "-1", "1"]
    procs = [start_in(ns_a, job, 0, addr_a, extra), start_in(ns_b, job, 1, addr_a, extra)]
    try:
        wait_for(lambda: len(markers(job, "ran_")) == 4, timeout=60, what="four ranks running on two hosts")
        pids = [int((job / n).read_text().split()[0]) for n in markers(job, "ran_")]
        cut()
        # Generous bound: detection is ~3 s (--node-timeout); a hang would run into this limit.
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    codes = [p.returncode for p in procs]
    assert codes == [75, 75], [e for _, e in outs]
    assert "node 1" in outs[0][1] and "was lost" in outs[0][1]
    # Node 1's one connection to the store carries its liveness reads, so the first to notice the
    # cut may be the connection (TCP_USER_TIMEOUT) or the unanswered read (liveness): both name
    # node rank 0's store, within --node-timeout of each other.
    assert ("lost the connection to node rank 0's store" in outs[1][1]
            or f"node rank 0 was lost: its store at {addr_a}:29500 did not answer" in outs[1][1]), outs[1][1]
    for i in range(2):
        ev = events(job / f"node{i}" / "logs")
        assert of(ev, "cycle_ended", cycle=0, end="lost")
        assert ev[-1]["outcome"] == "lost" and not of(ev, "restart")
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=30, what="every rank gone")


SLOW = """
import os, pathlib, sys, time, vigil
out = pathlib.Path(os.environ["OUT_DIR"])
attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
(out / f"att{attempt}_{rank}").write_text(os.environ["GROUP_RANK"] + " " + str(os.getpid()))
for step in range(int(sys.argv[1])):
    time.sleep(0.05)
    vigil.heartbeat(step)
"""


def test_a_standby_takes_the_place_of_a_node_cut_off(job, two_hosts):
    # Hot spares: node 1 (host b) is cut off; the standby (node 2, on host a beside the store)
    # takes its group rank and the job finishes in this allocation.
    (ns_a, addr_a), (ns_b, _), cut = two_hosts
    write(job / "slow.py", SLOW)
    extra = ["--max-restarts", "3", "--node-timeout", "3", "--workers-stop-timeout", "2", "slow.py", "150"]
    procs = [start_in(ns_a, job, 0, addr_a, extra, "2:3"), start_in(ns_b, job, 1, addr_a, extra, "2:3"),
             start_in(ns_a, job, 2, addr_a, extra, "2:3")]
    try:
        wait_for(lambda: all((job / f"att0_{r}").exists() for r in range(4)), timeout=60,
                 what="four ranks running")
        cut()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    codes = [p.returncode for p in procs]
    # The head and the standby finish; the node cut off learns it lost the store.
    assert codes[0] == 0 and codes[2] == 0, [e[-1500:] for _, e in outs]
    assert codes[1] == 75, outs[1][1][-1500:]
    promos = of(events(job / "node0" / "logs"), "promotion")
    assert [(p["slot"], p["lost"], p["standby"]) for p in promos] == [(1, 1, 2)], promos
    # Ranks 2 and 3 ran on node 2 in the next attempt, as group rank 1.
    assert all((job / f"att1_{r}").read_text().split()[0] == "1" for r in (2, 3))
    assert of(events(job / "node2" / "logs"), "standby", cycle=0)

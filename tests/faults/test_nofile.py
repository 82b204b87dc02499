"""The open-file limit (field finding 27): vigil raises its soft limit to the hard one, the ranks
keep the limit the job script gave them, and node rank 0 refuses, in one line, a job whose store
its hard limit cannot hold, instead of running out of descriptors half-way; and it says when the
kernel caps the listen backlog the job needs.

Before: the agent kept a soft limit of 1,024 and node rank 0's store ran out near 250 nodes.
"""
import resource
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from harness import base_env, run_vigil, vigil_bin, write  # noqa: E402
from test_multinode import free_port  # noqa: E402

# The rank writes its own soft limit and its agent's (its parent's), from /proc.
RANK = """
import os, pathlib, resource
out = pathlib.Path(os.environ["OUT_DIR"])
mine = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
agent = next(l for l in open(f"/proc/{os.getppid()}/limits") if l.startswith("Max open files")).split()[3]
(out / "limits").write_text(f"{mine} {agent}")
"""


def limited(soft, hard):
    """A preexec_fn that starts vigil under these open-file limits."""
    def set_limits():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return set_limits


def hard_limit():
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def test_the_agent_raises_its_soft_limit_and_the_ranks_keep_theirs(job):
    hard = min(hard_limit(), 8192)
    assert hard > 512, "this test needs a hard open-file limit above 512"
    write(job / "rank.py", RANK)
    r = run_vigil(["run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"), "rank.py"], cwd=job,
                  env=base_env(OUT_DIR=job), preexec_fn=limited(512, hard))
    assert r.returncode == 0, r.stderr
    rank, agent = (int(x) for x in (job / "limits").read_text().split())
    assert agent == hard, f"the agent's soft limit stayed {agent}, not raised to the hard limit {hard}"
    # Like torchrun: the training script sees the limit the job script set.
    assert rank == 512, rank


def test_node_rank_0_refuses_a_job_its_hard_limit_cannot_hold(job):
    write(job / "rank.py", "pass\n")
    r = run_vigil(["run", "--nnodes", "200", "--node-rank", "0", "--master-addr", "127.0.0.1",
                   "--master-port", str(free_port()), "--nproc-per-node", "1", "--join-timeout", "20",
                   "--log-dir", str(job / "logs"), "rank.py"], cwd=job, timeout=60,
                  preexec_fn=limited(1024, 1024))
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [l for l in r.stderr.splitlines() if "error" in l]
    assert len(lines) == 1, r.stderr
    assert "--nnodes 200" in lines[0] and "1024" in lines[0] and "ulimit" in lines[0], lines[0]
    assert not (job / "limits").exists()


def test_the_agent_that_hosts_a_c10d_endpoint_refuses_a_job_its_hard_limit_cannot_hold(job):
    """Without node ranks (c10d), the store's host is known only when it binds the endpoint."""
    write(job / "rank.py", "pass\n")
    r = run_vigil(["run", "--nnodes", "200", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   f"127.0.0.1:{free_port()}", "--rdzv-id", "fds", "--nproc-per-node", "1",
                   "--join-timeout", "20", "--log-dir", str(job / "logs"), "rank.py"], cwd=job,
                  timeout=60, preexec_fn=limited(1024, 1024))
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [l for l in r.stderr.splitlines() if "error" in l]
    assert len(lines) == 1 and "--nnodes 200" in lines[0] and "ulimit" in lines[0], r.stderr


def test_a_job_the_limit_holds_is_not_refused(job):
    """The refusal counts: two nodes need far fewer descriptors than 1,024."""
    write(job / "rank.py", RANK)
    port = str(free_port())
    procs = [subprocess.Popen([vigil_bin(), "run", "--nnodes", "2", "--node-rank", str(i), "--master-addr",
                               "127.0.0.1", "--master-port", port, "--nproc-per-node", "1",
                               "--log-dir", str(job / f"logs{i}"), "rank.py"],
                              cwd=job, env=base_env(OUT_DIR=job), stderr=subprocess.PIPE, text=True,
                              preexec_fn=limited(1024, 1024)) for i in range(2)]
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs


def test_node_rank_0_says_when_the_kernel_caps_its_listen_backlog(job):
    """500 nodes of 8 ranks may connect 4,500 times at once (each agent once, each rank once); above net.core.somaxconn node rank 0
    says so in one note, naming the sysctl."""
    cap = int(Path("/proc/sys/net/core/somaxconn").read_text())
    burst = 500 * (1 + 8)
    if cap >= burst:
        pytest.skip(f"net.core.somaxconn is {cap}, above this job's {burst}")
    if hard_limit() < 500 * (2 + 16) + 256:
        pytest.skip("the hard open-file limit cannot hold the store for 500 nodes")
    write(job / "rank.py", "pass\n")
    r = run_vigil(["run", "--nnodes", "500", "--node-rank", "0", "--master-addr", "127.0.0.1",
                   "--master-port", str(free_port()), "--nproc-per-node", "8", "--join-timeout", "2",
                   "--log-dir", str(job / "logs"), "rank.py"], cwd=job, timeout=60)
    notes = [l for l in r.stderr.splitlines() if "net.core.somaxconn" in l]
    assert len(notes) == 1, r.stderr
    assert f"net.core.somaxconn is {cap}" in notes[0] and str(burst) in notes[0], notes[0]

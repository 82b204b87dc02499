"""The hung rank is named right, job-wide (issue 35's violation 4, issue 32's hung rank across
nodes): a rank stuck inside `vigil.section("step")` while the others wait for it in a gloo
all-reduce, in the same section, is the rank vigil names hung, on one node and when it is on
another node than the ranks that run out first. Real torch.distributed (gloo), real processes."""
import os
import sys
from pathlib import Path

from harness import base_env, events, of, require_torch, run_vigil, write

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_inprocess import TRAIN, check_generation_events, check_traces  # noqa: E402
from test_multinode import Nodes  # noqa: E402

require_torch()

# Every rank steps with an all-reduce inside section "step". At step AT the sleeper opens its
# section only once every other rank wrote that it is inside its own (they then wait for the
# sleeper in the all-reduce): the sleeper's silence begins after theirs, so theirs run out first.
SLEEPER = r"""
import os, sys, time
import torch, torch.distributed as dist
import vigil

TRACE = os.environ["TRACE_DIR"]
SLEEPER, AT = int(sys.argv[1]), 20
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
# The configured timeouts stay (NVRx's rule): a step of a loaded machine is no hang.
vigil.announce_calculation_on_request()
dist.init_process_group("gloo")
step = 0
while True:
    vigil.should_stop(step)
    if step == AT and rank == SLEEPER:
        while len([f for f in os.listdir(TRACE) if f.startswith("in_")]) < world - 1:
            time.sleep(0.01)
        time.sleep(0.3)
        with open(os.path.join(TRACE, "sleeper"), "w") as f:
            f.write(str(os.getpid()))
        with vigil.section("step"):
            time.sleep(600)
    with vigil.section("step"):
        if step == AT:
            open(os.path.join(TRACE, "in_%d" % rank), "w").close()
        t = torch.ones(4)
        dist.all_reduce(t)
    # As bench/chaos_train.py: a heartbeat after each step, so the heartbeat timeout, which runs
    # from the heartbeat before the section, is every rank's first to run out.
    vigil.heartbeat(step)
    step += 1
    time.sleep(0.02)
"""

# Section "step" and the heartbeat time out after 6 s; a rank is a candidate once its own timeout
# ran 3/4 of that.
FLAGS = ["--section-timeouts", "step=6", "--heartbeat-timeout", "6", "--initial-heartbeat-timeout", "120",
         "--max-restarts", "0"]


def sleeper_pid(job):
    return int((job / "trace" / "sleeper").read_text())


def check_hang(ev, pid, rank):
    (h,) = of(ev, "hang")
    assert (h["pid"], h["rank"]) == (pid, rank), h
    assert h["timeout"] in ("heartbeat", {"section": "step"}) and not h["stopped"], h


def test_on_one_node_the_sleeper_is_named_not_the_ranks_waiting_for_it(job):
    write(job / "train.py", SLEEPER)
    (job / "trace").mkdir()
    env = base_env(TRACE_DIR=str(job / "trace"))
    args = ["run", "--nproc-per-node", "4", *FLAGS, "--log-dir", "logs", "train.py", "3"]
    r = run_vigil(args, cwd=job, env=env, timeout=300)
    assert r.returncode != 0, r.stdout[-2000:]
    check_hang(events(job / "logs"), sleeper_pid(job), 3)


def test_across_two_nodes_the_sleeper_on_node1_is_named_once(job):
    """2 loopback nodes x 2 ranks: rank 3 (node 1) sleeps; ranks 0 and 1 on node 0 run out first
    and have only waiting ranks to blame: the job's verdict names rank 3, recorded by node 1,
    and node 0 records no hang of its own."""
    write(job / "train.py", SLEEPER)
    (job / "trace").mkdir()
    nodes = Nodes(job, 2, ["train.py", "3"], nproc=2, env={"TRACE_DIR": str(job / "trace")},
                  extra=[*FLAGS, "--rdzv-id", "hang2"])
    res = nodes.wait(timeout=300)
    assert all(rc != 0 for rc, _, _ in res), [e[-3000:] for _, _, e in res]
    check_hang(nodes.events(1), sleeper_pid(job), 3)
    assert not of(nodes.events(0), "hang"), of(nodes.events(0), "hang")


def test_in_process_a_stopped_rank_on_node1_is_replaced_alone_in_one_generation(job):
    """Issue 32: 2 loopback nodes x 2 ranks, rank 2 (node 1) SIGSTOPped: node 0's ranks wait for
    it and run out too, but the job makes one verdict: one generation, only rank 2 replaced,
    the survivors on both nodes keep their processes."""
    write(job / "train.py", TRAIN)
    (job / "trace").mkdir()
    extra = ["--in-process-restarts", "2", "--max-restarts", "0", "--rdzv-id", "hang3",
             "--heartbeat-timeout", "4", "--initial-heartbeat-timeout", "120"]
    nodes = Nodes(job, 2, ["train.py", "stop"], nproc=2, env={"TRACE_DIR": str(job / "trace")},
                  extra=extra)
    res = nodes.wait(timeout=600)
    assert [rc for rc, _, _ in res] == [0, 0], [e[-5000:] for _, _, e in res]
    check_traces(job, failed_rank=2, nproc=4)
    for i in range(2):
        ev = nodes.events(i)
        assert not of(ev, "in_process_declined"), of(ev, "in_process_declined")
        check_generation_events(ev, failed_rank=2)
    (h,) = of(nodes.events(1), "hang")
    assert h["rank"] == 2 and h["stopped"], h
    assert not of(nodes.events(0), "hang"), of(nodes.events(0), "hang")

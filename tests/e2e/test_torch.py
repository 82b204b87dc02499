"""Real torch.distributed under vigil: the environment is what torch expects."""
from harness import require_torch, base_env, events, run_vigil, write

require_torch()

ALL_REDUCE = """
import os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")  # env:// from vigil's variables, as under torchrun
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print("sum", int(t.item()), "attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], flush=True)
dist.barrier()
if rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and len(sys.argv) > 1:
    os._exit(13)  # a crash after the collective; the next attempt must rendezvous again
dist.barrier()
dist.destroy_process_group()
"""


def test_gloo_all_reduce_two_ranks(job):
    write(job / "ar.py", ALL_REDUCE)
    r = run_vigil(["run", "--nproc-per-node", "2", "ar.py"], cwd=job, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[default0]:sum 3 attempt 0" in r.stdout
    assert "[default1]:sum 3 attempt 0" in r.stdout


def test_gloo_job_survives_a_rank_crash_and_restart(job):
    write(job / "ar.py", ALL_REDUCE)
    r = run_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--workers-stop-timeout", "5",
                   "--log-dir", "logs", "ar.py", "crash"], cwd=job, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[default0]:sum 3 attempt 1" in r.stdout and "[default1]:sum 3 attempt 1" in r.stdout
    ev = events(job / "logs")
    assert [e["to_cycle"] for e in ev if e["event"] == "restart"] == [1]
    assert ev[-1]["outcome"] == "succeeded"


def test_gloo_across_two_agents_through_the_agent_store_survives_a_crash(job):
    """2 agents x 2 ranks; torch's ranks rendezvous through vigil's store on node rank 0
    (TORCHELASTIC_USE_AGENT_STORE=True: no rank binds a port), and rank 1 on node 0 crashes once."""
    from test_multinode import Nodes

    write(job / "ar.py", ALL_REDUCE)
    nodes = Nodes(job, 2, ["ar.py", "crash"], extra=["--max-restarts", "1", "--workers-stop-timeout", "5"])
    res = nodes.wait(timeout=300)
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    out = res[0][1] + res[1][1]
    for lr in range(2):
        assert out.count(f"[default{lr}]:sum 10 attempt 0") == 2, out
        assert out.count(f"[default{lr}]:sum 10 attempt 1") == 2, out
    for i in range(2):
        ev = nodes.events(i)
        assert [e["to_cycle"] for e in ev if e["event"] == "restart"] == [1]
        assert ev[-1]["outcome"] == "succeeded"


LEFTOVER = """
import datetime, os, sys
import torch.distributed as dist
s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                  timeout=datetime.timedelta(seconds=30))
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    s.set("leftover", "from attempt 0")
    assert s.check(["leftover"])
    sys.exit(3)
print("leftover present:", s.check(["leftover"]), flush=True)
"""


def test_each_attempt_starts_from_a_clean_store(job):
    write(job / "left.py", LEFTOVER)
    r = run_vigil(["run", "--max-restarts", "1", "left.py"], cwd=job, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[default0]:leftover present: False" in r.stdout

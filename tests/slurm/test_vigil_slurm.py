"""vigil under a real Slurm cluster: the srun line is `vigil run` with no rendezvous
flags; the agents find each other from Slurm's variables, restart together after an injected
failure and succeed."""
import json
import sys
from pathlib import Path

from harness import SHIM, vigil_bin

from .slurmlib import sbatch, wait_job

# Every rank records its environment; global rank 3 (node 1) fails once all four ranks are up.
TRAIN = """
import json, os, sys, time, pathlib
out = pathlib.Path(os.environ["OUT_DIR"])
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
keep = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "SLURM_NODEID", "SLURMD_NODENAME")
(out / f"env_{rank}_{attempt}.json").write_text(json.dumps({k: os.environ.get(k) for k in keep}))
if attempt == 0:
    if rank == 3:
        while len(list(out.glob("env_*_0.json"))) < 4:
            time.sleep(0.01)
        sys.exit(5)
    time.sleep(120)
"""


def output(workdir: Path, job_id: int) -> str:
    p = Path(workdir) / f"slurm-{job_id}.out"
    return p.read_text() if p.exists() else "(no output file)"


def test_srun_vigil_run_restarts_across_nodes_and_succeeds(slurm_cluster, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    job_id = sbatch(
        f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1
export PYTHON_EXEC={sys.executable} PYTHONPATH={SHIM} OUT_DIR={tmp_path}
srun {vigil_bin()} run --nproc-per-node 2 --max-restarts 2 --workers-stop-timeout 5 --log-dir {tmp_path}/logs train.py
""",
        tmp_path,
    )
    info = wait_job(job_id, timeout=240)
    out = output(tmp_path, job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{out}"
    assert "attempt 0 failed on node 1: rank 3 exited with code 5" in out, out

    envs = {(r, a): json.loads((tmp_path / f"env_{r}_{a}.json").read_text()) for r in range(4) for a in range(2)}
    for (rank, _attempt), e in envs.items():
        assert e["RANK"] == str(rank) and e["WORLD_SIZE"] == "4"
        # Node rank = SLURM_NODEID; global ranks by node rank.
        assert e["GROUP_RANK"] == e["SLURM_NODEID"] == str(rank // 2)
        assert e["GROUP_WORLD_SIZE"] == "2"
        # n1 is not in DNS: its address came from `scontrol show node` (NodeAddr=127.0.0.1).
        # The ranks' door on their own node (node rank 0's store is at the port Slurm's job id gives).
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert 0 < int(e["MASTER_PORT"]) < 65536 and e["MASTER_PORT"] != str(20000 + job_id % 12000)
        assert e["TORCHELASTIC_RUN_ID"] == str(job_id)
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert {e["SLURMD_NODENAME"] for e in envs.values()} == {"n1", "n2"}

    logs = sorted((tmp_path / "logs").glob("vigil_*/events.jsonl"))
    assert len(logs) == 2, "one agent per node"
    by_node = {}
    for f in logs:
        ev = [json.loads(line) for line in f.read_text().splitlines()]
        by_node[ev[0]["node_rank"]] = ev
    assert sorted(by_node) == [0, 1]
    for ev in by_node.values():
        assert [e["to_cycle"] for e in ev if e["event"] == "restart"] == [1]
        ended = [e for e in ev if e["event"] == "cycle_ended" and e["cycle"] == 0]
        assert [(e["end"], e.get("node")) for e in ended] == [("failed", 1)]
        assert ev[-1]["event"] == "result" and ev[-1]["outcome"] == "succeeded"

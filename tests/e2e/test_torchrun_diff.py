"""A differential test against the installed torchrun: the same command line, collected from popular
training repositories and torch's docs, run under `torchrun` and under `vigil run` with a stand-in
script that records its argv, `sys.path[0]` and the environment its launcher gave it. Every
difference is either fixed or listed in KNOWN with its reason (and in docs/usage.md, "Differences
from torchrun").

Ports that torchrun or vigil choose themselves, run ids drawn as uuids and per-launcher paths (error
files, log directories) are compared by shape, not value. Ranks are matched by RANK.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness import require_torch, base_env, vigil_bin, write

require_torch()

TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")

STANDIN = """
import json, os, sys
rec = {"argv": sys.argv, "path0": sys.path[0], "env": dict(os.environ)}
with open(os.path.join(os.environ["DIFF_OUT"], "rank%s.json" % os.environ.get("RANK", "x")), "w") as f:
    json.dump(rec, f)
"""

# Launcher-specific variables that are not torchrun's contract with the script.
OURS = re.compile(r"^(VIGIL_|TORCHELASTIC_ERROR_FILE$|TORCHELASTIC_ENABLE_FILE_TIMER$|TORCH_NCCL_|NCCL_)")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

# Command lines: `S` is the stand-in script, `P` a free port, `R` the node rank (multi-node lines run
# two launchers at once, node ranks 0 and 1). Sources: torch's elastic docs (run.py), the DDP
# tutorial and pytorch/examples, karpathy/nanoGPT and nanochat, Megatron-LM and NeMo's examples,
# HF accelerate/transformers' examples, torchtitan's run_train.sh, Lightning and DeepSpeed docs.
SINGLE = [
    "--nproc-per-node 2 S a b",
    "--nproc_per_node=2 S --lr 3e-4",  # nanoGPT: torchrun --standalone --nproc_per_node=8 train.py
    "--standalone --nproc_per_node=2 S config/train_gpt2.py",
    "--standalone --nnodes 1 --nproc-per-node 2 S",  # torch docs, single-node multi-worker
    "--nnodes 1 --nproc-per-node 2 S",
    "--nnodes=1 --nproc_per_node=2 --master_port=P S",  # Megatron's examples set the port
    "--master-addr localhost --master-port P --nproc-per-node 2 S",
    "--master_addr=127.0.0.1 --master_port=P --nproc_per_node=2 --node_rank=0 --nnodes=1 S",
    "--rdzv-backend c10d --rdzv-endpoint localhost:0 --nnodes 1 --nproc-per-node 2 S",  # torchtitan
    "--rdzv_backend=c10d --rdzv_endpoint=localhost:P --rdzv_id=job42 --nnodes=1 --nproc_per_node=2 S",
    "--rdzv-id myrun --standalone --nproc-per-node 1 S",
    "--nproc-per-node 1 -m standin_mod x",
    "--nproc-per-node 2 -m standin_mod -- --depth=20",  # nanochat: -m scripts.base_train -- --depth=20
    "--standalone --nproc_per_node=2 -m standin_mod -- --depth=20",
    "--no-python --nproc-per-node 2 ./standin.sh a",
    "--no_python --nproc-per-node 1 ./standin.sh",
    "--run-path --nproc-per-node 2 S a",
    "--run_path --nproc-per-node 1 S -- b",
    "--nproc-per-node 1 S -- --flag",
    "--nproc-per-node 1 S a -- b",
    "--max-restarts 3 --nproc-per-node 2 S",
    "--max_restarts=3 --nproc_per_node 2 S",
    "--max-restart 2 --max-restarts 3 --nproc-per-node 1 S",  # a wrapper appends an override
    "--nproc_per 2 S",  # an argparse prefix (`--nproc` alone: see KNOWN's note)
    "--nproc-per-node 1 --nproc-per-node 2 S",
    "--role trainer --nproc-per-node 2 S",
    "--monitor-interval 1 --nproc-per-node 1 S",
    "--start-method spawn --nproc-per-node 1 S",
    "--redirects 3 --nproc-per-node 1 S",
    "--tee 3 --nproc-per-node 1 S",
    "--local-ranks-filter 0 --nproc-per-node 2 S",
    "--nproc-per-node cpu S",
    "ENV:PET_NPROC_PER_NODE=2 S",
]
MULTI = [
    # The DDP tutorial's multi-node line and its static twin, two nodes on loopback.
    "--nnodes 2 --node-rank R --master-addr 127.0.0.1 --master-port P --nproc-per-node 2 S",
    "--nnodes=2 --node_rank=R --master_addr=localhost --master_port=P --nproc_per_node=1 S",
    "--nnodes=2 --node_rank=R --master_addr=127.0.0.1 --master_port=P --nproc_per_node=2 -m standin_mod -- --x",
    # c10d without node ranks, as pytorch/examples' sbatch line (`srun torchrun --nnodes 4
    # --rdzv_backend c10d --rdzv_endpoint $head_node_ip:29500 multinode.py 50 10`), Kubernetes'
    # PyTorchJob and torch's elastic docs run it: the rendezvous hands the node ranks out.
    "--nnodes 2 --nproc_per_node 1 --rdzv_id 4242 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:P S 50 10",
    "--nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=localhost:P --rdzv-id=k8s-job S",
]

# Differences of every case, kept on purpose: vigil's ranks reach node rank 0's store through their
# own node's door (MASTER_ADDR 127.0.0.1, MASTER_PORT a free loopback port; docs/store.md, "Who may
# use the store"), which proves the job's secret for them; torchrun's ranks get the store's address.
ALWAYS_DIFFERENT = {"MASTER_ADDR", "MASTER_PORT"}

# Differences kept on purpose: (case, field) -> reason. Keep docs/usage.md in step. (Not in the
# corpus: `--nproc 2`, which Python 3.11's argparse under torchrun refuses as ambiguous between
# `--nproc-per-node` and `--nproc_per_node`, the two spellings of one flag; vigil takes it.)
KNOWN = {
    ("--rdzv-id myrun --standalone --nproc-per-node 1 S", "TORCHELASTIC_RUN_ID"):
        "vigil keeps --rdzv-id as the job's identity (its state directory, requeue count) with --standalone; "
        "torchrun replaces it by a fresh uuid",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_dir(d: Path):
    write(d / "standin.py", STANDIN)
    write(d / "standin_mod.py", STANDIN)
    sh = write(d / "standin.sh", '#!/bin/sh\nexec "$PYTHON_EXEC" "$(dirname "$0")/standin.py" "$@"\n')
    sh.chmod(0o755)


def argv_of(line, port, node_rank):
    env = {}
    words = []
    for w in line.split():
        if w.startswith("ENV:"):
            k, v = w[4:].split("=", 1)
            env[k] = v
            continue
        w = {"S": "standin.py", "P": str(port), "R": str(node_rank)}.get(w, w)
        w = re.sub(r"([=:])P$", rf"\g<1>{port}", w)
        w = re.sub(r"=R$", f"={node_rank}", w)
        words.append(w)
    return words, env


def launch(tool, line, d: Path, nodes: int):
    out = d / tool
    out.mkdir()
    port = free_port()
    procs = []
    for r in range(nodes):
        words, extra = argv_of(line, port, r)
        env = base_env(DIFF_OUT=str(out), **extra)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        cmd = [TORCHRUN, *words] if tool == "torchrun" else [vigil_bin(), "run", *words]
        procs.append(subprocess.Popen(cmd, cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(o)
        assert p.returncode == 0, f"{tool} {line}: exit {p.returncode}\n{o}"
    recs = {}
    for f in sorted(out.glob("rank*.json")):
        rec = json.loads(f.read_text())
        recs[rec["env"].get("RANK")] = rec
    assert recs, f"{tool} {line}: no rank ran\n" + "\n".join(outs)
    return recs, base_env(DIFF_OUT=str(out), **argv_of(line, port, 0)[1]), port


def normalise(rec, launch_env, port, d: Path, tool):
    env = {}
    for k, v in rec["env"].items():
        if launch_env.get(k) == v or OURS.match(k) or k == "DIFF_OUT":
            continue
        if k == "PATH":
            continue
        if k == "TORCHELASTIC_RUN_ID" and UUID.match(v):
            v = "<uuid>"
        if k in ALWAYS_DIFFERENT:
            continue
        env[k] = v
    path0 = rec["path0"].replace(str(d), "<dir>")
    return {"argv": rec["argv"], "path0": path0, "env": env}


def compare(line, nodes, tmp_path):
    setup_dir(tmp_path)
    t, t_env, t_port = launch("torchrun", line, tmp_path, nodes)
    v, v_env, v_port = launch("vigil", line, tmp_path, nodes)
    assert sorted(t) == sorted(v), f"{line}: torchrun ran ranks {sorted(t)}, vigil {sorted(v)}"
    diffs = []
    for rank in sorted(t):
        a = normalise(t[rank], t_env, t_port, tmp_path, "torchrun")
        b = normalise(v[rank], v_env, v_port, tmp_path, "vigil")
        for field in ("argv", "path0"):
            if a[field] != b[field] and (line, field) not in KNOWN:
                diffs.append(f"rank {rank} {field}: torchrun {a[field]!r}, vigil {b[field]!r}")
        for k in sorted(set(a["env"]) | set(b["env"])):
            if a["env"].get(k) != b["env"].get(k) and (line, k) not in KNOWN:
                diffs.append(f"rank {rank} {k}: torchrun {a['env'].get(k)!r}, vigil {b['env'].get(k)!r}")
    assert not diffs, f"`{line}` differs from torchrun:\n  " + "\n  ".join(diffs)


def test_the_corpus_is_large_enough():
    assert len(SINGLE) + len(MULTI) >= 30


@pytest.mark.parametrize("line", SINGLE)
def test_single_node_line_matches_torchrun(line, tmp_path):
    compare(line, 1, tmp_path)


@pytest.mark.parametrize("line", MULTI)
def test_two_node_loopback_line_matches_torchrun(line, tmp_path):
    compare(line, 2, tmp_path)

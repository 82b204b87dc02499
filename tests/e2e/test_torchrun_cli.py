"""torchrun's whole command line on the real binary: what follows the script belongs to the script,
torchrun 2.15's flags work as torchrun documents them, and `host:0` is any free port.

Found running third-party command lines under vigil (fault-findings 11, 12): a script argument that
shared a name with a vigil flag was taken by vigil, and `--rdzv-endpoint localhost:0` was refused.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO, base_env, events, run_dirs, run_vigil, start_vigil, vigil_bin, wait_for, write

# Writes what the rank got: its argv and the variables vigil sets.
DUMP = """
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
        "VIGIL_RUN_DIR", "TORCHELASTIC_SIGNALS_TO_HANDLE"]
out = {k: os.environ.get(k) for k in keys}
out["argv"] = sys.argv[1:]
out["main"] = __name__
path = os.path.join(os.environ["OUT_DIR"], "dump_%s_%s.json" % (os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]))
with open(path, "w") as f:
    json.dump(out, f)
"""


def dumps(out_dir: Path):
    return {p.name: json.loads(p.read_text()) for p in sorted(out_dir.glob("dump_*.json"))}


# --- --rdzv-endpoint host:0 -------------------------------------------------------------------

# The rank connects to MASTER_ADDR:MASTER_PORT: the port is real and vigil's store answers there.
CONNECT = DUMP + """
s = __import__("socket").create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=10)
s.close()
"""


@pytest.mark.parametrize("endpoint", ["localhost:0", "127.0.0.1:0"])
@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_endpoint_port_zero_is_any_free_port(job, endpoint, backend):
    write(job / "t.py", CONNECT)
    # NeMo-Run's ft_launcher line and NVRx's scripts: c10d, one node, port 0.
    r = run_vigil(["run", "--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--nnodes", "1",
                   "--nproc-per-node", "2", "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    assert r.returncode == 0, r.stderr
    d = dumps(job)
    ports = {v["MASTER_PORT"] for v in d.values()}
    assert len(d) == 2 and len(ports) == 1 and int(ports.pop()) > 0, d


def test_endpoint_port_zero_on_several_nodes_is_refused(job):
    write(job / "t.py", DUMP)
    r = run_vigil(["run", "--rdzv-endpoint", "localhost:0", "--nnodes", "2", "--node-rank", "0", "t.py"], cwd=job,
                  env=base_env(OUT_DIR=job))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "localhost:0" in line and "one node" in line, line
    assert not dumps(job)

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


def vigil_long_flags():
    """Every long flag `vigil run --help` lists, in both spellings, and its short flags."""
    text = subprocess.run([vigil_bin(), "run", "--help"], capture_output=True, text=True, check=True).stdout
    longs = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)))
    assert "--max-restarts" in longs and "--log-dir" in longs and len(longs) > 30, longs
    underscored = [f.replace("-", "_").replace("__", "--", 1) for f in longs if "-" in f[2:]]
    shorts = sorted(set(re.findall(r"^\s+(-[a-zA-Z]),", text, re.M)))
    assert {"-m", "-r", "-t", "-h"} <= set(shorts), shorts
    return longs + underscored + shorts


def ft_flags():
    """Every ft_launcher flag vigil translates, in each spelling NVRx accepts (from ftcompat's table)."""
    src = (REPO / "agent" / "src" / "ftcompat.rs").read_text()
    fields = re.findall(r'^\s+(?:map|note)\("([a-z_]+)"', src, re.M)
    assert "rank_heartbeat_timeout" in fields and len(fields) > 30, fields
    out = []
    for f in fields:
        out += ["--ft-" + f.replace("_", "-"), "--ft-" + f, "--ft_" + f, "--ft-param-" + f]
    out += ["--ft-cfg-path", "--ft_cfg_path", "--fault-tol-cfg-path", "--fault_tol_cfg_path",
            "--ft-ignore-missing-cfg", "--ignore-missing-fault-tol-cfg", "--restart-policy"]
    return out


def script_tail():
    """Every vigil and ft_launcher flag name, each followed by a value, plus the forms that bit
    real jobs: `--role x --max-restarts 3`, `--log_dir D`, `--module x`, `-m`, `--`, `--x=v`."""
    tail = ["--role", "x", "--max-restarts", "3", "--log_dir", "D", "--module", "llama3", "-m", "--", "-r3"]
    for i, flag in enumerate(vigil_long_flags() + ft_flags()):
        tail += [flag, f"v{i}"] if i % 3 else [f"{flag}=v{i}"]
    return tail


def assert_vigil_untouched(job, r, n_dumps=1):
    """vigil ran with its defaults: one rank, role `default`, no restarts, one run dir under logs/."""
    assert r.returncode == 0, r.stderr
    assert "accepted, no effect" not in r.stderr, "an ft_launcher flag after the script was translated"
    d = dumps(job)
    assert len(d) == n_dumps, d.keys()
    for got in d.values():
        assert got["ROLE_NAME"] == "default" and got["TORCHELASTIC_MAX_RESTARTS"] == "0", got
        assert got["LOCAL_WORLD_SIZE"] == str(n_dumps) and got["TORCHELASTIC_RESTART_COUNT"] == "0", got
    (rd,) = run_dirs(job / "logs")
    assert Path(d[next(iter(d))]["VIGIL_RUN_DIR"]) == rd
    kinds = [e["event"] for e in events(job / "logs")]
    assert kinds.count("cycle_start") == 1 and "restart" not in kinds, kinds
    # No directory was made from a value meant for the script (--log-dir D, --log_dir v12, ...).
    assert sorted(p.name for p in job.iterdir() if p.is_dir()) == ["logs", "pkg"], list(job.iterdir())
    return d


@pytest.fixture
def scripts(job):
    write(job / "train.py", DUMP)
    (job / "pkg").mkdir()
    write(job / "pkg" / "__init__.py", "")
    write(job / "pkg" / "train.py", DUMP)
    return job


def test_the_reported_line_reaches_the_script(scripts):
    job = scripts
    r = run_vigil(["run", "--nproc_per_node=1", "--log-dir", "logs", "train.py", "--role", "x", "--max-restarts", "3"],
                  cwd=job, env=base_env(OUT_DIR=job))
    d = assert_vigil_untouched(job, r)
    assert d["dump_0_0.json"]["argv"] == ["--role", "x", "--max-restarts", "3"]


@pytest.mark.parametrize("form", ["script", "module", "module-torchtitan", "no-python", "run-path", "ft_launcher"])
def test_every_flag_name_after_the_script_reaches_it_untouched(scripts, form, tmp_path):
    job = scripts
    tail = script_tail()
    launcher = [vigil_bin(), "run"]
    if form == "ft_launcher":
        link = tmp_path / "ft_launcher"
        link.symlink_to(vigil_bin())
        launcher = [str(link), "--ft-rank-heartbeat-timeout", "600"]
    head = {
        "script": ["train.py"],
        "ft_launcher": ["train.py"],
        "module": ["-m", "pkg.train"],
        "module-torchtitan": ["--module", "pkg.train"],
        "no-python": ["--no-python", sys.executable, "train.py"],
        "run-path": ["--run-path", str(job / "train.py")],
    }[form]
    r = subprocess.run([*launcher, "--log-dir", "logs", *head, *tail], cwd=job, env=base_env(OUT_DIR=job),
                       capture_output=True, text=True, timeout=120)
    if form == "ft_launcher":
        # The one ft flag before the script is translated (and says nothing: it maps to a vigil flag).
        assert r.returncode == 0, r.stderr
    d = assert_vigil_untouched(job, r)
    got = d["dump_0_0.json"]
    assert got["argv"] == tail, [(i, a, b) for i, (a, b) in enumerate(zip(got["argv"], tail)) if a != b][:5]
    assert got["main"] == "__main__"


def test_unknown_flag_before_the_script_is_still_refused(scripts):
    job = scripts
    r = run_vigil(["run", "--bogus", "train.py", "--role", "x"], cwd=job, env=base_env(OUT_DIR=job))
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()
    assert len(line) == 1 and "--bogus" in line[0] and "after the script" in line[0], r.stderr
    assert not dumps(job)


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

"""Fixtures for tests against a real three-node Slurm cluster on this machine (cluster.sh).

Without root or a cluster the harness can start, these tests skip; with VIGIL_REQUIRE_SLURM=1 (CI)
they fail instead, showing the harness output.
"""
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import slurmlib


@dataclass(frozen=True)
class SlurmCluster:
    dir: Path  # VIGIL_SLURM_DIR: etc/, log/, state/, run/
    conf: Path  # slurm.conf (also /etc/slurm/slurm.conf)
    nodes: tuple  # node names, in SLURM_NODEID order
    started_here: bool  # this session started it and stops it at the end

    @property
    def logs(self) -> Path:
        return self.dir / "log"


def _unavailable(reason: str):
    if os.environ.get("VIGIL_REQUIRE_SLURM") == "1":
        pytest.fail(f"VIGIL_REQUIRE_SLURM=1 but no Slurm test cluster: {reason}", pytrace=False)
    pytest.skip(f"no Slurm test cluster: {reason} (VIGIL_REQUIRE_SLURM=1 makes this an error)")


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local three-node cluster (nodes n1, n2, n3): reused if `cluster.sh status` says it is up,
    otherwise started (installing slurm-wlm and munge if needed) and stopped after the session."""
    if os.geteuid() != 0:
        _unavailable("not root (the harness installs packages and runs slurmd as root)")
    started = False
    if slurmlib.cluster("status").returncode != 0:
        try:
            p = slurmlib.cluster("start")
        except Exception as e:  # e.g. bash missing, timeout
            _unavailable(f"`cluster.sh start` failed to run: {e!r}")
        if p.returncode != 0:
            _unavailable(f"`cluster.sh start` exited {p.returncode}:\n{p.stdout}")
        started = True
    yield SlurmCluster(
        dir=slurmlib.SLURM_DIR,
        conf=slurmlib.SLURM_CONF,
        nodes=tuple(f"n{i}" for i in range(1, slurmlib.NUM_NODES + 1)),
        started_here=started,
    )
    if started:
        slurmlib.cluster("stop")

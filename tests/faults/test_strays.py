"""A stray agent cannot hurt a job (field finding 16). Real agents on loopback, sharing the job's
store secret: an agent with another --nnodes, other hot spares, another --nproc-per-node or
another job id is refused by node rank 0's job with one line and exit status 2, having written
nothing, and the job runs on untouched to a normal end whatever the stray does next (SIGTERM,
SIGKILL)."""
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from harness import base_env, events, of, start_vigil, wait_for, write  # noqa: E402
from test_multinode import free_port  # noqa: E402

SECRET = "stray-test-secret-0123456789"

# Every rank says it runs, then waits for the test's go (the stray arrives meanwhile).
WAIT = """
import os, pathlib, time
out = pathlib.Path(os.environ["OUT_DIR"])
(out / f"up_{os.environ['RANK']}_{os.environ['TORCHELASTIC_RESTART_COUNT']}").touch()
while not (out / "go").exists():
    time.sleep(0.05)
"""


def agent(job, port, node_rank, nnodes, *extra, name=None, nproc=1):
    name = name or f"node{node_rank}"
    (job / name).mkdir()
    args = ["run", "--nnodes", nnodes, "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--nproc-per-node", str(nproc), "--max-restarts", "2",
            "--log-dir", str(job / name), *extra, "wait.py"]
    return start_vigil(args, cwd=job, env=base_env(OUT_DIR=job, VIGIL_STORE_SECRET=SECRET))


CASES = {
    # finding 16: ended the whole job with 75 "node lost" on every node
    "more_nodes": ("2", [], {"nnodes": "3", "node_rank": 2}, "it runs --nnodes 2 and this agent has --nnodes 3"),
    "another_job": ("2", ["--rdzv-id", "strays"],
                    {"nnodes": "2", "node_rank": 1, "extra": ["--rdzv-id", "other"]},
                    'it runs job id "strays" and this agent has job id "other"'),
    # finding 16: let in, and a SIGTERM to it stopped every node
    "more_spares": ("2:3", [], {"nnodes": "2:4", "node_rank": 3}, "it runs --nnodes 2:3 and this agent has --nnodes 2:4"),
    "other_nproc_with_spares": ("2:3", [], {"nnodes": "2:3", "node_rank": 2, "nproc": 2, "late_standby": True},
                                "it runs --nproc-per-node 1 with hot spares"),
    # without spares nodes may differ in ranks; the node rank it names is taken
    "other_nproc": ("2", [], {"nnodes": "2", "node_rank": 1, "nproc": 3}, "node rank 1 is already taken"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("then", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_stray_is_refused_and_the_job_finishes(job, case, then):
    nnodes, job_extra, stray, said = CASES[case]
    write(job / "wait.py", WAIT)
    port = free_port()
    members = 3 if ":" in nnodes else 2
    late = stray.get("late_standby", False)
    # late: the job's standby (node 2) comes after the stray that names its node rank, so the job
    # waits for it at its first rendezvous meanwhile.
    procs = [agent(job, port, i, nnodes, *job_extra) for i in range(members - late)]
    stray_p = None
    try:
        if not late:
            wait_for(lambda: all((job / f"up_{r}_0").exists() for r in range(2)), timeout=60,
                     what="the job's ranks running")
        stray_p = agent(job, port, stray["node_rank"], stray["nnodes"], *stray.get("extra", []),
                        name="stray", nproc=stray.get("nproc", 1))
        try:
            _, err = stray_p.communicate(timeout=60)
        except Exception:
            stray_p.send_signal(then)
            _, err = stray_p.communicate(timeout=30)
            pytest.fail(f"the stray was not refused: {err[-2000:]}")
        assert stray_p.returncode == 2, err
        # One line, besides the note every agent prints on start ("node 2 of 3; vigil's store is at").
        lines = [l for l in err.splitlines() if l.strip() and " vigil's store is at " not in l]
        assert len(lines) == 1 and lines[0].startswith("vigil: error: ") and said in lines[0], err
        if case != "other_nproc":
            assert "refused by node rank 0" in lines[0], lines[0]
        # Whatever it does next: a signal to it reaches nobody of the job.
        if stray_p.poll() is None:
            stray_p.send_signal(then)
        if late:
            procs.append(agent(job, port, 2, nnodes, *job_extra))
        wait_for(lambda: all((job / f"up_{r}_0").exists() for r in range(2)), timeout=60,
                 what="the job's ranks running")
        (job / "go").touch()
        res = [p.communicate(timeout=120) for p in procs]
        codes = [p.returncode for p in procs]
        assert codes == [0] * members, [e[-1500:] for _, e in res]
    finally:
        for p in procs + ([stray_p] if stray_p else []):
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert not (job / "up_0_1").exists(), "the job restarted"
    for i in range(members):
        ev = events(job / f"node{i}")
        if i < 2:  # node 2 is the job's standby: it runs no ranks
            assert [e["cycle"] for e in of(ev, "cycle_start")] == [0], ev
        assert not [e for e in ev if "lost" in str(e.get("reason", ""))], ev

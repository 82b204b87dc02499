"""One job never leaks into another: saved state, run directories, run ids, ports, sockets.

Found by attack: a heartbeat timeout learned by one job without an id was saved to a file shared
by every such job and killed the next, unrelated job (fault-findings 2, 14). Every test here
runs the real binary; two agents share a `$TMPDIR` and log directory on purpose, as two jobs on
one machine do.
"""
import json
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from harness import base_env, events, of, run_dirs, run_vigil, start_vigil, wait_for, write  # noqa: E402
from test_multinode import Nodes, free_port  # noqa: E402

# Heartbeats every 50 ms: vigil (with --calculate-timeouts) calculates a heartbeat timeout of about
# 1 s and saves it.
LEARN = """
import vigil, time
for i in range(25):
    vigil.heartbeat(i)
    time.sleep(0.05)
"""

# A healthy job whose heartbeats are 2.5 s apart: fine under its configured 60 s, killed if it
# inherited another job's 1 s.
PAUSES = """
import vigil, time
for i in range(3):
    vigil.heartbeat(i)
    time.sleep(2.5)
vigil.heartbeat(3)
"""


def learn(job, *extra, script="learn.py"):
    """Runs LEARN with --log-dir logs (where the job's state lives too); the new run's events."""
    logs = job / "logs"
    logs.mkdir(exist_ok=True)
    before = set(run_dirs(logs))
    r = run_vigil(["run", "--calculate-timeouts", "--heartbeat-timeout", "60", "--log-dir", "logs", *extra, script],
                  cwd=job, timeout=60)
    assert r.returncode == 0, r.stderr
    (new,) = set(run_dirs(logs)) - before
    ev = [json.loads(line) for line in (new / "events.jsonl").read_text().splitlines()]
    assert of(ev, "timeouts_updated", source="calculated") or of(ev, "timeouts_updated", source="loaded"), \
        [e["event"] for e in ev]
    return ev, r


def test_a_job_without_an_id_loads_nothing_and_keeps_its_state_in_its_run_directory(job):
    write(job / "learn.py", LEARN)
    write(job / "pauses.py", PAUSES)
    # No --log-dir: both jobs share $TMPDIR, the default place for both, like the README's example
    # and the next job a user starts on the same machine.
    tmp = Path(os.environ["TMPDIR"])
    r = run_vigil(["run", "--calculate-timeouts", "--heartbeat-timeout", "60", "learn.py"], cwd=job, timeout=60)
    assert r.returncode == 0, r.stderr
    (first,) = run_dirs(tmp)
    saved = json.loads((first / "timeouts.json").read_text())
    assert saved["written_by"]["job_id"] is None
    assert saved["timeouts"]["heartbeat"] < 5, saved
    assert not [p for p in tmp.iterdir() if p.is_file() and "timeout" in p.name], list(tmp.iterdir())

    r = run_vigil(["run", "--heartbeat-timeout", "60", "--max-restarts", "0", "pauses.py"], cwd=job, timeout=60)
    assert r.returncode == 0, f"the second job inherited the first one's timeouts:\n{r.stderr}"
    second = [d for d in run_dirs(tmp) if d != first]
    assert len(second) == 1
    ev = [json.loads(l) for l in (second[0] / "events.jsonl").read_text().splitlines()]
    assert not of(ev, "timeouts_updated", source="loaded")
    assert not of(ev, "hang")


def test_saved_timeouts_belong_to_one_job_program_and_shape(job):
    write(job / "learn.py", LEARN)
    write(job / "other.py", LEARN)
    ev, _ = learn(job, "--rdzv-id", "job-7")
    state = job / "logs" / "vigil-job-job-7" / "timeouts.json"
    saved = json.loads(state.read_text())
    assert saved["written_by"] == {"job_id": "job-7", "program": str(job / "learn.py"), "nnodes": 1,
                                   "nproc_per_node": 1}, saved
    assert saved["written_at"].endswith("Z")

    # The same job, run again (a requeue): it starts from what it learned.
    ev, _ = learn(job, "--rdzv-id", "job-7")
    assert of(ev, "timeouts_updated", source="loaded")

    # Another id, another shape, another program: each ignored, and the note says why. (Each run
    # then saves what it learned over the file, so the next case reads the previous one's.)
    cases = [
        (["--rdzv-id", "job-8"], "learn.py", None),
        (["--rdzv-id", "job-7", "--nproc-per-node", "2"], "learn.py", "1 x 2"),
        (["--rdzv-id", "job-7", "--nproc-per-node", "2"], "other.py", "this job runs"),
    ]
    for extra, script, says in cases:
        ev, r = learn(job, *extra, script=script)
        assert not of(ev, "timeouts_updated", source="loaded"), (extra, script)
        assert of(ev, "timeouts_updated", source="calculated"), (extra, script)
        if says:
            assert "ignoring the timeouts file" in r.stderr and says in r.stderr, r.stderr
    # job-8 has its own state directory; job-7's was not overwritten by it.
    assert (job / "logs" / "vigil-job-job-8" / "timeouts.json").is_file()


def test_a_file_without_provenance_is_ignored_with_a_note(job):
    write(job / "pauses.py", PAUSES)
    stale = write(job / "old.json", json.dumps({"heartbeat": 1.0}))  # the format vigil wrote before
    r = run_vigil(["run", "--heartbeat-timeout", "60", "--timeouts-file", str(stale), "--max-restarts", "0",
                   "--log-dir", "logs", "pauses.py"], cwd=job, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ignoring the timeouts file" in r.stderr and "does not say which job" in r.stderr, r.stderr
    assert not of(events(job / "logs"), "hang")


ENV = """
import json, os, sys
keys = ["TORCHELASTIC_RUN_ID", "MASTER_PORT", "VIGIL_SOCKET", "VIGIL_RUN_DIR"]
out = os.path.join(os.environ["OUT_DIR"], sys.argv[1] + "_" + os.environ["RANK"] + ".json")
json.dump({k: os.environ[k] for k in keys}, open(out, "w"))
if len(sys.argv) > 2:  # hold until the other job has started too
    import time
    deadline = time.time() + 60
    while not os.path.exists(sys.argv[2]) and time.time() < deadline:
        time.sleep(0.02)
"""


def test_run_ids_and_run_directories_name_the_job(job):
    write(job / "env.py", ENV)
    env = base_env(OUT_DIR=job)
    for tag, extra in [("u1", []), ("u2", []), ("id", ["--rdzv-id", "nightly-3"])]:
        r = run_vigil(["run", "--log-dir", "logs", *extra, "env.py", tag], cwd=job, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
    got = {t: json.loads((job / f"{t}_0.json").read_text()) for t in ("u1", "u2", "id")}
    # One node without an id: a fresh uuid per run, as torchrun 2.15 gives it; never "none".
    for t in ("u1", "u2"):
        rid = got[t]["TORCHELASTIC_RUN_ID"]
        assert len(rid) == 36 and rid.count("-") == 4, rid
    assert got["u1"]["TORCHELASTIC_RUN_ID"] != got["u2"]["TORCHELASTIC_RUN_ID"]
    assert got["id"]["TORCHELASTIC_RUN_ID"] == "nightly-3"
    names = sorted(Path(g["VIGIL_RUN_DIR"]).name for g in got.values())
    assert [n.split("_")[1] for n in names] == ["env", "env", "nightly-3"], names
    assert all("none" not in n for n in names), names


def start_pair(job, tag, extra, marker):
    return start_vigil(["run", "--nproc-per-node", "2", "--log-dir", "logs", *extra, "env.py", tag, str(marker)],
                       cwd=job, env=base_env(OUT_DIR=job))


def test_two_jobs_at_once_share_no_port_socket_or_directory(job):
    write(job / "env.py", ENV)
    for pair, (ea, eb) in {
        "noid": ([], []),
        "sameid": (["--rdzv-id", "same"], ["--rdzv-id", "same"]),
        "diffid": (["--rdzv-id", "x1"], ["--rdzv-id", "x2"]),
        "mixed": (["--rdzv-id", "x3"], []),
    }.items():
        marker = job / f"{pair}.go"
        a = start_pair(job, f"{pair}a", ea, marker)
        b = start_pair(job, f"{pair}b", eb, marker)
        try:
            # Both jobs' ranks are up at the same time before either may finish.
            wait_for(lambda: all((job / f"{pair}{s}_{r}.json").exists() for s in "ab" for r in (0, 1)),
                     timeout=60, what=f"{pair}: both jobs' ranks running")
            marker.touch()
            for p in (a, b):
                _, err = p.communicate(timeout=60)
                assert p.returncode == 0, err
        finally:
            for p in (a, b):
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        ja, jb = (json.loads((job / f"{pair}{s}_0.json").read_text()) for s in "ab")
        for k in ("MASTER_PORT", "VIGIL_SOCKET", "VIGIL_RUN_DIR"):
            assert ja[k] != jb[k], (pair, k, ja[k])
        assert Path(ja["VIGIL_SOCKET"]).parent != Path(jb["VIGIL_SOCKET"]).parent
        if pair != "sameid":
            assert ja["TORCHELASTIC_RUN_ID"] != jb["TORCHELASTIC_RUN_ID"], pair


def test_two_multi_node_jobs_at_once_on_one_machine(job):
    """Two 2-node jobs side by side (each on its own port, as Slurm gives each job its own)."""
    marker = job / "mn.go"
    (job / "j1").mkdir()
    (job / "j2").mkdir()
    write(job / "j1" / "env.py", ENV)
    write(job / "j2" / "env.py", ENV)
    # Each job's ranks write into that job's own directory (Nodes sets OUT_DIR to it).
    j1 = Nodes(job / "j1", 2, ["env.py", "mn1", str(marker)], nproc=1, extra=["--rdzv-id", "mn"])
    j2 = Nodes(job / "j2", 2, ["env.py", "mn2", str(marker)], nproc=1)
    out = lambda j, r: job / f"j{j}" / f"mn{j}_{r}.json"  # noqa: E731
    try:
        wait_for(lambda: all(out(j, r).exists() for j in (1, 2) for r in (0, 1)),
                 timeout=60, what="both jobs' ranks running")
        marker.touch()
        for nodes in (j1, j2):
            res = nodes.wait()
            assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    finally:
        j1.kill()
        j2.kill()
    got = {(j, r): json.loads(out(j, r).read_text()) for j in (1, 2) for r in (0, 1)}
    # Every node's ranks have a door of their own (each job's store is at its own --master-port).
    assert len({g["MASTER_PORT"] for g in got.values()}) == 4
    assert len({g["VIGIL_SOCKET"] for g in got.values()}) == 4
    assert len({g["VIGIL_RUN_DIR"] for g in got.values()}) == 4

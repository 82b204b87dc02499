"""The store outside the job: `vigil store --listen` serves a job whose agents all run with
`--rdzv-conf is_host=false`, node rank 0 included, which coordinates through it (docs/store.md,
"The store outside the job")."""

from harness import StoreService as Service
from harness import base_env, of, run_vigil, send_junk, start_vigil, wait_for, write
from test_multinode import FLAKY, Nodes, markers

SECRET = "0123456789abcdef-outside-the-job"


def test_a_job_restarts_through_a_store_outside_it_which_clears_the_job_at_its_end(job):
    write(job / "flaky.py", FLAKY)
    store = Service(job, "--node-timeout", "10", env={"VIGIL_STORE_SECRET": SECRET})
    try:
        nodes = Nodes(job, 2, ["flaky.py", "3", "1"], port=store.port,
                      extra=["--max-restarts", "1", "--rdzv-conf", "is_host=false", "--rdzv-id", "ext1"],
                      env={"VIGIL_STORE_SECRET": SECRET})
        res = nodes.wait()
        assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
        # Attempt 0 failed on node 1 (rank 3), attempt 1 ran everywhere.
        assert markers(job, "ran_") == [f"ran_{r}_{a}" for r in range(4) for a in range(2)]
        for i in range(2):
            ev = nodes.events(i)
            ended = of(ev, "cycle_ended", cycle=0)
            assert len(ended) == 1 and ended[0]["end"] == "failed" and ended[0]["node"] == 1
            assert [e["cycle"] for e in of(ev, "cycle_start")] == [0, 1]
            assert ev[-1]["event"] == "result" and ev[-1]["outcome"] == "succeeded"
        # Node rank 0 hosted nothing: it says where the store is.
        assert "(here)" not in res[0][2] and "outside the job" in res[0][2], res[0][2]
        wait_for(lambda: any("cleared" in line for line in store.lines), timeout=30,
                 what="the store service clearing the job")
        joined = [line for line in store.lines if "joined" in line]
        assert len(joined) == 1 and '"ext1"' in joined[0] and "--nnodes 2" in joined[0], store.lines
        cleared = [line for line in store.lines if "cleared" in line]
        assert len(cleared) == 1 and '"ext1"' in cleared[0], store.lines
    finally:
        rc, err = store.stop()
    assert rc == 0, err


def test_an_agent_sigkilled_reaches_node_rank_0_through_the_lease_queue(job):
    write(job / "flaky.py", FLAKY)
    store = Service(job, env={"VIGIL_STORE_SECRET": SECRET})
    try:
        # --node-timeout 60: only the lease (the agent's connection closing) can tell in time.
        nodes = Nodes(job, 2, ["flaky.py", "-1", "1"], port=store.port,
                      extra=["--max-restarts", "3", "--node-timeout", "60", "--workers-stop-timeout", "3",
                             "--rdzv-conf", "is_host=false"],
                      env={"VIGIL_STORE_SECRET": SECRET})
        wait_for(lambda: len([n for n in markers(job, "ran_") if (job / n).read_text().strip()]) == 4,
                 what="all four ranks running")
        nodes.procs[1].kill()
        rc0 = nodes.procs[0].wait(timeout=30)
        res = nodes.wait()
        assert rc0 == 75, res[0][2]
        assert "node 1" in res[0][2] and "connection to the store closed" in res[0][2], res[0][2]
        (ended,) = of(nodes.events(0), "cycle_ended", cycle=0)
        assert ended["end"] == "lost"
    finally:
        rc, err = store.stop()
    assert rc == 0, err


def test_an_open_store_off_loopback_is_refused_naming_the_fix(job):
    r = run_vigil(["store", "--listen", "0.0.0.0:0"], cwd=job, timeout=30)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "VIGIL_STORE_SECRET" in lines[0] and "--secret-file" in lines[0]
    assert r.stdout == ""


def test_a_secret_file_that_is_too_short_is_refused(job):
    short = write(job / "secret", "short\n")
    r = run_vigil(["store", "--listen", "0.0.0.0:0", "--secret-file", str(short)], cwd=job, timeout=30)
    assert r.returncode == 2 and "--secret-file" in r.stderr, r.stderr


def test_strangers_at_the_store_are_summed_up_not_told_one_line_each(job):
    """60 connections that send junk instead of the handshake: the service says so at once for
    the first, then once for the rest at the end of its 10 s window, with the totals by kind; it
    keeps serving. (It used to print a line for each on stderr: a flood wrote without bound, and
    into a pipe nobody read it would block the store.)"""
    store = Service(job, env={"VIGIL_STORE_SECRET": SECRET})
    try:
        for _ in range(60):
            send_junk(store.port, b"\xff" * 64)

        def said():
            return [line for line in store.lines if "turned away" in line]
        wait_for(lambda: sum(int(l.split("turned away ")[1].split()[0]) for l in said()) == 60,
                 timeout=60, what="the 60 refusals summed up")
        lines = said()
        assert len(lines) == 2, store.lines
        assert lines[0].startswith("vigil's store turned away 1 connection(s)"), lines
        assert "turned away 59 connection(s)" in lines[1] and "60 sent bytes that are not the handshake" in lines[1], lines
        assert "the last from 127.0.0.1:" in lines[1], lines
        # Still serving: a job's agent gets through.
        res = run_vigil(["run", "--nproc-per-node", "1", "--rdzv-conf", "is_host=false", "--master-addr",
                         "127.0.0.1", "--master-port", str(store.port), "--rdzv-id", "after-junk",
                         "-m", "json.tool", "--help"], cwd=job, env=base_env(VIGIL_STORE_SECRET=SECRET))
        assert res.returncode == 0, res.stderr
    finally:
        rc, err = store.stop()
    assert rc == 0, err
    assert "closed the connection" not in err, err

"""One way to name a job everywhere (issue 25, field finding 26): `vigil logs --rank N`, `status`,
`ledger` and `report` all take a plain `vigil run` log directory and its run directory, as well
as a launched experiment. A real `vigil run` with two ranks, then each command on its directories.
"""
import pytest

from harness import base_env, run_dirs, run_vigil, write


@pytest.fixture
def ran(job):
    write(job / "train.py", "import os, sys\nr = os.environ['RANK']\nprint('out of rank', r)\nprint('err of rank', r, file=sys.stderr)\n")
    p = run_vigil(["run", "--log-dir", str(job / "logs"), "--nproc-per-node", "2", str(job / "train.py")], cwd=job)
    assert p.returncode == 0, p.stderr
    (run,) = run_dirs(job / "logs")
    return job, run


def env_for(job):
    # No experiments here: a name would be looked up under this empty home.
    return base_env(VIGIL_HOME=job / "home")


def targets(job, run):
    return [str(job / "logs"), str(run)]


def test_logs_rank_reads_a_log_and_a_run_directory(ran):
    job, run = ran
    for t in targets(job, run):
        p = run_vigil(["logs", "--rank", "1", t], cwd=job, env=env_for(job))
        assert p.returncode == 0, (t, p.stderr)
        assert p.stdout == "out of rank 1\n" and p.stderr == "err of rank 1\n", (t, p.stdout, p.stderr)
        p = run_vigil(["logs", "--rank", "5", t], cwd=job, env=env_for(job))
        assert p.returncode == 2 and "no rank 5 in" in p.stderr, (t, p.stderr)
        p = run_vigil(["logs", t], cwd=job, env=env_for(job))
        assert p.returncode == 2 and "give --rank N" in p.stderr, (t, p.stderr)


def test_status_reads_a_log_and_a_run_directory(ran):
    job, run = ran
    for t in targets(job, run):
        p = run_vigil(["status", t], cwd=job, env=env_for(job))
        assert p.returncode == 0, (t, p.stderr)
        assert p.stdout.startswith(f"Records in {t}\n"), p.stdout
        assert "1 allocation" in p.stdout and "every rank exited 0" in p.stdout, p.stdout


def test_ledger_reads_a_log_and_a_run_directory(ran):
    job, run = ran
    for t in targets(job, run):
        p = run_vigil(["ledger", t], cwd=job, env=env_for(job))
        assert p.returncode == 0, (t, p.stderr)
        rows = [l for l in p.stdout.splitlines() if l.startswith("1 ")]
        assert len(rows) == 1 and "finished" in rows[0], p.stdout


def test_report_reads_a_log_and_a_run_directory(ran):
    job, run = ran
    for t in targets(job, run):
        p = run_vigil(["report", t, "-o", str(job / "r.html")], cwd=job, env=env_for(job))
        assert p.returncode == 0, (t, p.stderr)
        assert "allocation" in (job / "r.html").read_text()


def test_a_corrupt_ledger_is_one_note_at_run_and_at_ledger(job):
    """Field finding 44: a ledger of thousands of corrupt lines printed a note per line at every
    `vigil run` and `vigil ledger`; it is one note with the count and the first bad line."""
    write(job / "train.py", "pass\n")
    state = job / "state"
    state.mkdir()
    (state / "ledger.jsonl").write_text("not json\n" * 5000)
    p = run_vigil(["run", "--log-dir", str(job / "logs"), "--state-dir", str(state),
                   "--nproc-per-node", "1", str(job / "train.py")], cwd=job)
    assert p.returncode == 0, p.stderr
    about = [l for l in p.stderr.splitlines() if "ledger.jsonl" in l]
    assert len(about) == 1, p.stderr[-3000:]
    assert "5000 lines skipped (5000 not JSON); the first, line 1, is not JSON" in about[0], about
    p = run_vigil(["ledger", str(state)], cwd=job, env=env_for(job))
    assert p.returncode == 0, p.stderr
    notes = [l for l in p.stdout.splitlines() if l.startswith("note:")]
    assert len(notes) == 1, p.stdout[-3000:]
    assert "5000 lines skipped" in notes[0] and "line 1" in notes[0], notes
    rows = [l for l in p.stdout.splitlines() if l.startswith("1 ")]
    assert len(rows) == 1 and "finished" in rows[0], p.stdout[:3000]


def test_status_ledger_and_report_number_an_allocation_alike(job):
    """Field finding 45: a ledger's allocation 0 was "allocation 1" in `vigil status` (and on the
    page) while `vigil ledger` said 0."""
    import json
    state = job / "state"
    state.mkdir()
    rec = {"format": 1, "allocation": 0, "job_id": "42", "nodes": ["a"], "start": 1767225600.0,
           "end": 1767229200.0, "outcome": "stopped", "highest_step": 10, "restarts": 0, "decision": "requeue",
           "why": "time-limit", "excluded": [], "exit_status": 75}
    (state / "ledger.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps({**rec, "allocation": 1,
                                        "start": 1767229300.0, "end": 1767230000.0}) + "\n")
    p = run_vigil(["ledger", str(state)], cwd=job, env=env_for(job))
    assert p.returncode == 0, p.stderr
    assert [l.split()[0] for l in p.stdout.splitlines()[1:3]] == ["0", "1"], p.stdout
    p = run_vigil(["status", str(state)], cwd=job, env=env_for(job))
    assert p.returncode == 0, p.stderr
    assert "  allocation 0 (job 42): " in p.stdout and "  allocation 1 (job 42): " in p.stdout, p.stdout
    p = run_vigil(["report", str(state), "-o", str(job / "r.html")], cwd=job, env=env_for(job))
    assert p.returncode == 0, p.stderr
    section = (job / "r.html").read_text().split('<section id="allocations">')[1]
    assert "<tr><td>0</td>" in section and "<tr><td>1</td>" in section

"""Odd input, the low ones of field finding 20: record times of +-1e308, terminal control
sequences in records, a SIGKILLed agent's socket directory, repeated names in health output, and
the wording after a forwarded SIGTERM. The real binary each time.
"""
import json
import os
import signal
import subprocess

import pytest

from harness import base_env, read_events, run_vigil, start_vigil, vigil_bin, wait_for

ESC = "\x1b]0;PWNED\x07\x1b[2J\x9b1m"  # retitle the window, clear the screen, C1 CSI


def test_report_on_timestamps_of_1e308_ends_with_a_clear_error(job):
    run = job / "logs" / "vigil_x"
    run.mkdir(parents=True)
    lines = [
        {"event": "nodes", "ts": 1e308, "host": "h", "node_rank": 0, "nnodes": 1, "store": "x:1", "run_id": "r"},
        {"event": "cycle_start", "ts": -1e308, "host": "h", "node_rank": 0, "cycle": 0, "restart_count": 0, "nproc": 1},
        {"event": "result", "ts": 1e308, "host": "h", "node_rank": 0, "outcome": "succeeded", "exit_code": 0},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    try:
        p = run_vigil(["report", str(job / "logs")], cwd=job, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("vigil report did not end on times of 1e308")
    assert p.returncode == 2, (p.returncode, p.stderr)
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vigil report: error:"), p.stderr
    assert "is not a time" in err[0], err[0]


def fake_bin(job, **scripts):
    d = job / "FAKE-bin"
    d.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (d / name).write_text("#!/bin/bash\n" + text)
        (d / name).chmod(0o755)
    return d


def experiment(job):
    """A launched experiment as vigil launch leaves it, with a hostile event log and job log."""
    d = job / "home" / "experiments" / "a" / "a_20260101-000000"
    run = d / "runs" / "vigil_a_1"
    run.mkdir(parents=True)
    (d / "state").mkdir()
    (d / "experiment.json").write_text(json.dumps(
        {"id": "a_20260101-000000", "name": "a", "job_id": "7", "partition": None,
         "interactive": False, "created": 0.0}))
    ev = [
        {"event": "nodes", "ts": 100.0, "host": "h" + ESC, "node_rank": 0, "nnodes": 1, "store": "x:1", "run_id": "r"},
        {"event": "cycle_start", "ts": 100.1, "host": "h", "node_rank": 0, "cycle": 0, "restart_count": 0, "nproc": 1},
        {"event": "cycle_ended", "ts": 102.0, "host": "h", "node_rank": 0, "cycle": 0, "end": "failed",
         "node": 0, "reason": "rank 0 " + ESC + "\nFAKE: all good"},
        {"event": "result", "ts": 103.0, "host": "h", "node_rank": 0, "outcome": "failed", "exit_code": 1},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ev))
    (d / "7.log").write_bytes(("step 1\n" + ESC + "\rstep 2\n").encode())
    (d / "state" / "ledger.jsonl").write_text(json.dumps({
        "format": 1, "allocation": 1, "job_id": "7", "restart_count": 0, "nodes": ["n1" + ESC],
        "start": 100.0, "end": 103.0, "outcome": "failed", "highest_step": None, "restarts": 0,
        "decision": "stop", "why": "failed" + ESC, "excluded": [], "exit_status": 1, "stop_lead_s": 60.0,
    }) + "\n")
    return d


def env_with_fake_slurm(job):
    b = fake_bin(
        job,
        scontrol='echo "JobId=7 JobName=a JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0"\n',
        squeue="exit 0\n",
    )
    return base_env(VIGIL_HOME=job / "home", PATH=f"{b}:{os.environ['PATH']}")


def no_controls(text):
    bad = [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
    assert not bad, f"control characters reach the terminal: {bad!r} in {text!r}"


def test_status_prints_no_control_sequences_from_records(job):
    experiment(job)
    env = env_with_fake_slurm(job)
    p = run_vigil(["status", "a"], cwd=job, env=env)
    assert p.returncode == 0, p.stderr
    no_controls(p.stdout)
    assert "\\x1b]0;PWNED" in p.stdout, p.stdout
    # A newline in a record does not make a line of its own.
    assert not any(l.startswith("FAKE: all good") for l in p.stdout.splitlines()), p.stdout


def test_logs_print_no_control_sequences_unless_raw(job):
    d = experiment(job)
    env = env_with_fake_slurm(job)
    p = run_vigil(["logs", "a"], cwd=job, env=env)
    assert p.returncode == 0, p.stderr
    no_controls(p.stdout)
    assert p.stdout == "step 1\n\\x1b]0;PWNED\\x07\\x1b[2J\\x9b1m\\x0dstep 2\n", repr(p.stdout)
    raw = subprocess.run([vigil_bin(), "logs", "a", "--raw"], cwd=job, env=env, capture_output=True)
    assert raw.returncode == 0 and raw.stdout == (d / "7.log").read_bytes(), "--raw gives the bytes as written"


def test_ledger_prints_no_control_sequences_from_records(job):
    d = experiment(job)
    p = run_vigil(["ledger", str(d / "state")], cwd=job, env=env_with_fake_slurm(job))
    assert p.returncode == 0, p.stderr
    no_controls(p.stdout)
    assert "failed\\x1b]0;PWNED" in p.stdout, p.stdout


def test_a_sigkilled_agents_socket_directory_is_removed(job):
    tmp = job / "tmp"
    tmp.mkdir()
    (job / "t.py").write_text("import time\ntime.sleep(120)\n")
    env = base_env(TMPDIR=tmp)
    p = start_vigil(["run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"), "t.py"], cwd=job, env=env)
    try:
        def started():
            runs = list((job / "logs").glob("vigil_*/events.jsonl"))
            return runs and any(e["event"] == "rank_started" for e in read_events(runs[0]))
        wait_for(started, timeout=60, what="the rank to start")
        mine = list(tmp.glob(f"vigil-{p.pid}-*"))
        assert len(mine) == 1 and (mine[0] / "agent.sock").exists(), list(tmp.iterdir())
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        wait_for(lambda: not mine[0].exists(), timeout=30, what="the socket directory to be removed")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_health_names_a_failing_check_once(job):
    paths = ",".join(str(job / f"absent{i}") for i in range(3))
    p = run_vigil(["health", "--storage-path", paths], cwd=job)
    assert p.returncode == 1, p.stderr
    assert p.stdout.count("FAIL storage") == 3, p.stdout
    assert p.stdout.splitlines()[-1] == "unhealthy: storage", p.stdout


def test_the_wording_after_a_forwarded_sigterm_matches_the_exit_status(job):
    (job / "t.py").write_text("import time\ntime.sleep(120)\n")
    p = start_vigil(["run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"), "t.py"], cwd=job)
    try:
        def started():
            runs = list((job / "logs").glob("vigil_*/events.jsonl"))
            return runs and any(e["event"] == "rank_started" for e in read_events(runs[0]))
        wait_for(started, timeout=60, what="the rank to start")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, err
    assert "run the job again to go on (exit status 143)" not in err, err
    assert "its exit status is 143" in err and "not 75" in err, err

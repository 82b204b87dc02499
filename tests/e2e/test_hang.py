"""Hang detection end to end: the real agent, real rank processes that hang in different ways.

Every test asserts the events the agent logged and their order; bounds are generous failure
limits, never timing goals.
"""
import json
import os
import signal
import socket
import struct
import time
from pathlib import Path

from harness import base_env, events, of, one, pid_alive, run_vigil, start_vigil, wait_for, write


def current_events(log_dir: Path):
    """The event log so far; empty while the run directory or a complete line is not there yet."""
    try:
        return events(log_dir)
    except (ValueError, FileNotFoundError):
        return []


def pos(ev, record):
    return next(i for i, e in enumerate(ev) if e is record)


def in_order(ev, *records):
    idx = [pos(ev, r) for r in records]
    assert idx == sorted(idx), ([r["event"] for r in records], idx, [e["event"] for e in ev])


def register_frame(rank, local_rank, pid, cycle):
    return bytes([0x56, 0x01, 0x01, 0x00]) + struct.pack("<I", 16) + struct.pack("<4I", rank, local_rank, pid, cycle)


def outcome_of_raw_connection(sock, timeout=10.0):
    """What the agent did with a connection we spoke on: closed it, or left it open."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(4096)
    except socket.timeout:
        return "open"
    except OSError:
        return "reset"
    return "closed" if data == b"" else "data"


# A rank that heartbeats `N` times and then waits in a function whose name the stacks must show.
# With TORCHELASTIC_RESTART_COUNT >= FIRST_OK it exits 0 at once (the attempt after a restart).
HEARTBEATS_THEN_SLEEPS = """
import os, sys, time
import vigil

def wait_forever_in_this_function():
    time.sleep(600)

if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) >= int(os.environ.get("FIRST_OK", "99")):
    sys.exit(0)
for i in range(int(os.environ.get("N", "5"))):
    vigil.heartbeat(i)
    time.sleep(0.05)
wait_forever_in_this_function()
"""


def test_rank_that_never_connects_hits_initial_timeout_and_restarts(job):
    write(job / "t.py", """
import os, time
# Never imports vigil: the agent hears nothing from this rank.
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    time.sleep(600)
""")
    r = run_vigil(["run", "--max-restarts", "1", "--initial-heartbeat-timeout", "1", "--log-dir", "logs", "t.py"],
                  cwd=job, timeout=60)
    assert r.returncode == 0, r.stderr
    ev = events(job / "logs")
    assert not of(ev, "registered")
    hang = one(ev, "hang", cycle=0)
    assert hang["timeout"] == "initial" and hang["limit_ms"] == 1000 and hang["silent_ms"] >= 1000
    assert hang["pid"] == one(ev, "rank_started", cycle=0)["pid"]
    st = one(ev, "stacks", cycle=0)
    assert st["python_stacks"] is None, "a rank without the shim cannot dump Python stacks"
    assert st["proc_stacks"] and Path(st["proc_stacks"]).is_file()
    assert f"process {hang['pid']}:" in Path(st["proc_stacks"]).read_text()
    stop = one(ev, "stop", cycle=0)
    assert stop["reason"] == "rank_hung" and hang["pid"] in stop["pids"]
    exited = one(ev, "rank_exited", cycle=0)
    assert exited.get("signal") == signal.SIGTERM
    restart = one(ev, "restart")
    assert (restart["from_cycle"], restart["to_cycle"], restart["restarts_left"]) == (0, 1, 0)
    result = ev[-1]
    assert result["event"] == "result" and result["outcome"] == "succeeded" and result["exit_code"] == 0
    in_order(ev, one(ev, "rank_started", cycle=0), hang, st, stop, exited, restart, one(ev, "cycle_start", cycle=1),
             result)


def test_rank_that_stops_heartbeating_is_reported_with_its_stack(job):
    write(job / "t.py", HEARTBEATS_THEN_SLEEPS)
    r = run_vigil(["run", "--max-restarts", "0", "--heartbeat-timeout", "1", "--log-dir", "logs", "t.py"],
                  cwd=job, timeout=60)
    assert r.returncode == 1, r.stderr
    ev = events(job / "logs")
    reg = one(ev, "registered", cycle=0)
    hang = one(ev, "hang", cycle=0)
    assert hang["timeout"] == "heartbeat" and hang["limit_ms"] == 1000 and hang["silent_ms"] >= 1000
    st = one(ev, "stacks", cycle=0)
    dump = Path(st["python_stacks"]).read_text()
    assert "in wait_forever_in_this_function" in dump, dump
    assert Path(st["proc_stacks"]).is_file()
    assert any("in wait_forever_in_this_function" in f for f in st["innermost"]), st["innermost"]
    stop = one(ev, "stop", cycle=0)
    exited = one(ev, "rank_exited", cycle=0)
    result = ev[-1]
    assert result["event"] == "result" and result["outcome"] == "failed"
    in_order(ev, reg, hang, st, stop, exited, result)
    # Console: the hang, then the innermost frame.
    assert "is hung: no heartbeat for " in r.stderr and ", past its heartbeat timeout of 1.0s" in r.stderr
    assert "innermost frames:" in r.stderr
    assert r.stderr.index("is hung") < r.stderr.index("in wait_forever_in_this_function")
    # The failure summary names the rank, the hang and where it was.
    summary = r.stderr.split("Root Cause")[1]
    assert "rank      : 0 (local_rank: 0)" in summary
    assert "hang      : no heartbeat for " in summary
    assert ", past its heartbeat timeout of 1.0s" in summary
    assert "in wait_forever_in_this_function" in summary


def test_the_hang_excerpt_leads_with_the_users_frame_not_library_internals(job):
    """Field finding 46: the excerpt showed the main thread's three innermost frames, all of them
    library code (here four frames of threading.py, as a collective shows torch's); it must show
    the user's innermost frame first, the library frames inside it counted."""
    write(job / "t.py", """
import threading
import vigil

def wait_in_a_barrier_that_never_fills():
    threading.Barrier(2).wait()

for i in range(3):
    vigil.heartbeat(i)
wait_in_a_barrier_that_never_fills()
""")
    r = run_vigil(["run", "--max-restarts", "0", "--heartbeat-timeout", "1", "--log-dir", "logs", "t.py"],
                  cwd=job, timeout=60)
    assert r.returncode == 1, r.stderr
    st = one(events(job / "logs"), "stacks", cycle=0)
    first = st["innermost"][0]
    assert "(main)" in first, st["innermost"]
    assert "in wait_in_a_barrier_that_never_fills" in first, st["innermost"]
    assert "library frames, innermost: threading.py:" in first, st["innermost"]
    assert not any("threading.py" in f.split("[+")[0] for f in st["innermost"] if "(main)" in f), st["innermost"]
    summary = r.stderr.split("Root Cause")[1]
    assert "in wait_in_a_barrier_that_never_fills" in summary


def test_rank_stuck_in_a_section(job):
    write(job / "t.py", """
import time
import vigil
for i in range(3):
    with vigil.section("step"):
        time.sleep(0.01)
    vigil.heartbeat(i)
with vigil.section("step"):
    time.sleep(600)
""")
    r = run_vigil(["run", "--max-restarts", "0", "--heartbeat-timeout", "300", "--section-timeouts", "step=1",
                   "--log-dir", "logs", "t.py"], cwd=job, timeout=60)
    assert r.returncode == 1, r.stderr
    ev = events(job / "logs")
    hang = one(ev, "hang", cycle=0)
    assert hang["timeout"] == {"section": "step"}, hang
    assert hang["limit_ms"] == 1000 and hang["silent_ms"] >= 1000
    in_order(ev, one(ev, "registered"), hang, one(ev, "stacks"), one(ev, "stop"), ev[-1])
    assert 'in section "step" for ' in r.stderr and 'past its section "step" timeout of 1.0s' in r.stderr


def test_a_stopped_rank_blamed_before_its_own_timeout_is_worded_with_what_was_measured(job):
    """Field finding 45: rank 1 is stopped, rank 0 runs past its section timeout first, and rank 1
    is named the root cause while its own heartbeat timeout (300 s) is far from run out. The
    console said "heartbeat timeout of 300.0s passed (silent for 0.5s)"; it must say what was
    measured, and that this timeout had not run out."""
    write(job / "t.py", """
import os, time
import vigil
out = os.environ["OUT_DIR"]
for i in range(3):
    vigil.heartbeat(i)
if os.environ["RANK"] == "1":
    open(os.path.join(out, "ready.tmp"), "w").write(str(os.getpid()))
    os.rename(os.path.join(out, "ready.tmp"), os.path.join(out, "ready"))
    while True:
        vigil.heartbeat()
        time.sleep(0.05)
deadline = time.time() + 120
while not os.path.exists(os.path.join(out, "go")) and time.time() < deadline:
    vigil.heartbeat()
    time.sleep(0.02)
with vigil.section("step"):
    time.sleep(600)
""")
    p = start_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "0", "--heartbeat-timeout", "300",
                     "--section-timeouts", "step=1", "--log-dir", "logs", "t.py"],
                    cwd=job, env=base_env(OUT_DIR=job))
    pid = None
    try:
        wait_for(lambda: (job / "ready").exists(), what="rank 1 heartbeating")
        pid = int((job / "ready").read_text())
        os.kill(pid, signal.SIGSTOP)
        (job / "go").touch()
        out, err = p.communicate(timeout=90)
    finally:
        if pid is not None and pid_alive(pid):
            os.kill(pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, err
    hang = one(events(job / "logs"), "hang", cycle=0)
    assert hang["rank"] == 1 and hang["stopped"] and hang["timeout"] == "heartbeat", hang
    assert hang["silent_ms"] < hang["limit_ms"], hang
    line = next(l for l in err.splitlines() if "is hung:" in l)
    assert "rank 1 (pid" in line, line
    assert "its process is stopped (SIGSTOP or a debugger); no heartbeat for " in line, line
    assert "(its heartbeat timeout of 300.0s had not run out)" in line, line
    assert "passed" not in line, line


def test_sigstopped_rank_is_hung_and_job_restarts(job):
    write(job / "t.py", """
import os, sys, time
import vigil
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    sys.exit(0)
for i in range(5):
    vigil.heartbeat(i)
    time.sleep(0.02)
open(os.path.join(os.environ["OUT_DIR"], "ready"), "w").write(str(os.getpid()))
deadline = time.time() + 120
while time.time() < deadline:
    vigil.heartbeat()
    time.sleep(0.05)
""")
    p = start_vigil(["run", "--max-restarts", "1", "--heartbeat-timeout", "1", "--log-dir", "logs", "t.py"],
                    cwd=job, env=base_env(OUT_DIR=job))
    try:
        wait_for(lambda: (job / "ready").exists() and (job / "ready").read_text()
                 and of(current_events(job / "logs"), "registered"), what="rank registered and heartbeating")
        pid = one(current_events(job / "logs"), "rank_started", cycle=0)["pid"]
        assert pid == int((job / "ready").read_text())
        os.kill(pid, signal.SIGSTOP)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    ev = events(job / "logs")
    hang = one(ev, "hang", cycle=0)
    assert hang["timeout"] == "heartbeat" and hang["pid"] == pid
    st = one(ev, "stacks", cycle=0)
    # The dump needs the rank running: the agent continued it for its SIGUSR2.
    assert st["python_stacks"] and Path(st["python_stacks"]).read_text().strip(), st
    stop = one(ev, "stop", cycle=0)
    exited = one(ev, "rank_exited", cycle=0)
    assert exited.get("signal") == signal.SIGTERM, "SIGCONT came with SIGTERM, so the stopped rank died of it"
    in_order(ev, hang, st, stop, exited, one(ev, "restart"), one(ev, "cycle_start", cycle=1), ev[-1])
    assert ev[-1]["outcome"] == "succeeded"
    assert not pid_alive(pid)


def test_rank_spinning_with_the_gil_held_shows_where(job):
    src = """
import os, sys, time
import vigil

def spin_holding_the_gil():
    x = 0
    while True:
        x += 1  # SPIN-LINE

if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    sys.exit(0)
for i in range(3):
    vigil.heartbeat(i)
spin_holding_the_gil()
"""
    write(job / "t.py", src)
    spin_line = next(i for i, l in enumerate(src.splitlines(), 1) if "SPIN-LINE" in l)
    head_line = spin_line - 1  # `while True:` (CPython may report either line of the loop)
    r = run_vigil(["run", "--max-restarts", "1", "--heartbeat-timeout", "1", "--log-dir", "logs", "t.py"],
                  cwd=job, timeout=60)
    assert r.returncode == 0, r.stderr
    ev = events(job / "logs")
    hang = one(ev, "hang", cycle=0)
    assert hang["timeout"] == "heartbeat"
    st = one(ev, "stacks", cycle=0)
    dump = Path(st["python_stacks"]).read_text()
    assert any(f"line {n} in spin_holding_the_gil" in dump for n in (head_line, spin_line)), dump
    in_order(ev, hang, st, one(ev, "stop"), one(ev, "restart"), ev[-1])
    assert ev[-1]["outcome"] == "succeeded"


def test_whole_job_suspended_is_not_a_hang(job):
    write(job / "t.py", """
import os, time
import vigil
for i in range(80):
    vigil.heartbeat(i)
    if i == 3:
        open(os.path.join(os.environ["OUT_DIR"], "beating_" + os.environ["RANK"]), "w").close()
    time.sleep(0.1)
""")
    p = start_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--heartbeat-timeout", "2",
                     "--log-dir", "logs", "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    stopped = []
    try:
        wait_for(lambda: (job / "beating_0").exists() and (job / "beating_1").exists()
                 and len(of(current_events(job / "logs"), "registered")) == 2, what="both ranks heartbeating")
        pids = [e["pid"] for e in of(current_events(job / "logs"), "rank_started")]
        assert len(pids) == 2
        # Like a job suspend: the ranks, then the agent.
        for pid in pids + [p.pid]:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        time.sleep(4)
        # Resume the ranks first (or with the agent): a rank resumed late would really be silent.
        for pid in pids + [p.pid]:
            os.kill(pid, signal.SIGCONT)
        stopped.clear()
        out, err = p.communicate(timeout=60)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    ev = events(job / "logs")
    assert not of(ev, "hang") and not of(ev, "restart") and not of(ev, "stop"), [e["event"] for e in ev]
    sus = one(ev, "suspended")
    assert sus["seconds"] >= 3.0, sus
    assert ev[-1]["event"] == "result" and ev[-1]["outcome"] == "succeeded"
    in_order(ev, *of(ev, "registered"), sus, ev[-1])


def test_stranger_on_the_socket_is_refused(job):
    write(job / "t.py", """
import os, time
import vigil
out = os.environ["OUT_DIR"]
vigil.heartbeat()
with open(os.path.join(out, "socket.tmp"), "w") as f:
    f.write(os.environ["VIGIL_SOCKET"])
os.rename(os.path.join(out, "socket.tmp"), os.path.join(out, "socket"))
deadline = time.time() + 60
while not os.path.exists(os.path.join(out, "done")) and time.time() < deadline:
    vigil.heartbeat()
    time.sleep(0.05)
""")
    p = start_vigil(["run", "--heartbeat-timeout", "5", "--log-dir", "logs", "t.py"], cwd=job,
                    env=base_env(OUT_DIR=job))
    try:
        wait_for(lambda: (job / "socket").exists(), what="the rank to report its socket")
        path = (job / "socket").read_text()
        assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        try:
            # A well-formed Register claiming to be rank 0: still not a rank's process.
            s.sendall(register_frame(0, 0, os.getpid(), 0))
        except OSError:
            pass  # already closed by the agent
        assert outcome_of_raw_connection(s) in ("closed", "reset")
        s.close()
        wait_for(lambda: of(current_events(job / "logs"), "ipc_rejected"), what="ipc_rejected event")
        (job / "done").touch()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    ev = events(job / "logs")
    rej = one(ev, "ipc_rejected")
    assert rej["peer_pid"] == os.getpid(), rej
    assert not of(ev, "hang")
    assert ev[-1]["outcome"] == "succeeded"
    in_order(ev, one(ev, "registered"), rej, ev[-1])


def test_garbage_on_the_socket_closes_only_that_connection(job):
    write(job / "t.py", """
import json, os, socket, struct, time
import vigil
path = os.environ["VIGIL_SOCKET"]
for i in range(3):
    vigil.heartbeat(i)
    time.sleep(0.02)

def raw(payload):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    try:
        s.sendall(payload)
    except OSError:
        return "closed-before-send-finished"
    s.settimeout(10)
    try:
        data = s.recv(4096)
    except socket.timeout:
        return "open"
    except OSError:
        return "reset"
    finally:
        s.close()
    return "closed" if data == b"" else "data"

res = {
    "garbage": raw(b"GET / HTTP/1.1\\r\\n\\r\\n" + b"\\xff" * 64),
    # A heartbeat header announcing a 4 GiB payload.
    "oversized": raw(bytes([0x56, 0x01, 0x02, 0x00]) + struct.pack("<I", 0xFFFFFFFF)),
}
t0 = time.time()
while time.time() - t0 < 3.0:  # longer than --heartbeat-timeout 2: only heartbeats that arrive keep it alive
    vigil.heartbeat()
    time.sleep(0.05)
res["connected"] = vigil.is_connected()
json.dump(res, open(os.path.join(os.environ["OUT_DIR"], "res.json"), "w"))
""")
    r = run_vigil(["run", "--heartbeat-timeout", "2", "--max-restarts", "0", "--log-dir", "logs", "t.py"], cwd=job,
                  env=base_env(OUT_DIR=job), timeout=60)
    assert r.returncode == 0, r.stderr
    res = json.loads((job / "res.json").read_text())
    assert res["garbage"] in ("closed", "reset", "closed-before-send-finished"), res
    assert res["oversized"] in ("closed", "reset", "closed-before-send-finished"), res
    assert res["connected"] is True
    ev = events(job / "logs")
    pid = one(ev, "rank_started")["pid"]
    rej = of(ev, "ipc_rejected")
    assert len(rej) == 2, rej
    assert all(e["peer_pid"] == pid and "malformed" in e["reason"] for e in rej), rej
    assert not of(ev, "hang") and not of(ev, "stop")
    assert ev[-1]["outcome"] == "succeeded"
    in_order(ev, one(ev, "registered"), rej[0], rej[1], ev[-1])


def test_calculated_timeouts_survive_a_restart_of_the_agent(job):
    tfile = job / "timeouts.json"
    # One program for both runs: saved timeouts apply only to the job, program and shape that
    # learned them (tests/faults/test_job_identity.py shows the others are ignored).
    write(job / "job.py", """
import sys
import time
import vigil

def silent_for_three_seconds():
    time.sleep(3)

if sys.argv[1] == "learn":
    time.sleep(1.0)  # the observed initial delay is long: a loaded initial timeout would not bite run 2
    for i in range(25):
        vigil.heartbeat(i)
        time.sleep(0.05)
else:
    for i in range(3):
        vigil.heartbeat(i)
        time.sleep(0.05)
    silent_for_three_seconds()
    for i in range(3):
        vigil.heartbeat(i)
""")
    r = run_vigil(["run", "--nproc-per-node", "1", "--calculate-timeouts", "--heartbeat-timeout", "60",
                   "--timeouts-file", str(tfile), "--log-dir", "logs", "job.py", "learn"], cwd=job, timeout=60)
    assert r.returncode == 0, r.stderr
    ev = events(job / "logs")
    conf = one(ev, "timeouts_updated", source="configured")
    assert conf["timeouts"]["heartbeat"] == 60
    calc = one(ev, "timeouts_updated", source="calculated")
    hb = calc["timeouts"]["heartbeat"]
    assert 1.0 <= hb < 60, calc
    assert calc["timeouts"]["initial"] is None, "only enabled checks are calculated"
    in_order(ev, conf, *of(ev, "registered"), calc, ev[-1])
    assert tfile.is_file()
    saved = json.loads(tfile.read_text())
    assert saved["timeouts"]["heartbeat"] == hb
    assert saved["written_by"]["job_id"] is None and saved["written_by"]["program"] == str(job / "job.py")

    # Run 2: a new agent process. The rank goes silent for 3 s, far below the configured 60 s.
    (job / "logs2").mkdir()
    r = run_vigil(["run", "--nproc-per-node", "1", "--heartbeat-timeout", "60", "--timeouts-file", str(tfile),
                   "--max-restarts", "0", "--log-dir", "logs2", "job.py", "silent"], cwd=job, timeout=60)
    assert r.returncode == 1, r.stderr
    ev = events(job / "logs2")
    loaded = one(ev, "timeouts_updated", source="loaded")
    assert loaded["timeouts"]["heartbeat"] == hb
    hang = one(ev, "hang")
    assert hang["timeout"] == "heartbeat" and hang["limit_ms"] == round(hb * 1000), hang
    assert hang["silent_ms"] < 10_000
    in_order(ev, one(ev, "timeouts_updated", source="configured"), loaded, one(ev, "cycle_start"),
             one(ev, "registered"), hang, ev[-1])


def test_configured_timeouts_stay_unless_calculation_is_asked_for(job):
    """As under ft_launcher, which calculates only when the rank's code asks: quick steps in a
    section with a configured timeout never replace it (the chaos soak saw `step=15` become a
    calculated 1.0 s, and a slow all-reduce a hang; docs/reliability.md)."""
    write(job / "t.py", """
import time
import vigil
for i in range(25):  # more than enough for a calculation on its own
    with vigil.section("step"):
        vigil.heartbeat(i)
        time.sleep(0.02)
""")
    r = run_vigil(["run", "--heartbeat-timeout", "60", "--section-timeouts", "step=15", "--log-dir", "logs",
                   "t.py"], cwd=job, timeout=60)
    assert r.returncode == 0, r.stderr
    ev = events(job / "logs")
    assert [e["source"] for e in of(ev, "timeouts_updated")] == ["configured"], of(ev, "timeouts_updated")
    assert ev[-1]["outcome"] == "succeeded"


def test_timeouts_are_pushed_to_ranks(job):
    write(job / "t.py", """
import json, os, time
import vigil
vigil.heartbeat()
deadline = time.time() + 20
t = vigil.timeouts()
while t is None and time.time() < deadline:
    time.sleep(0.01)
    t = vigil.timeouts()
json.dump(t, open(os.path.join(os.environ["OUT_DIR"], "t_%s.json" % os.environ["RANK"]), "w"))
""")
    r = run_vigil(["run", "--nproc-per-node", "2", "--heartbeat-timeout", "7.5", "--initial-heartbeat-timeout", "30",
                   "--out-of-section-timeout", "40", "--section-timeouts", "step=3,checkpointing=20",
                   "--log-dir", "logs", "t.py"], cwd=job, env=base_env(OUT_DIR=job), timeout=60)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        t = json.loads((job / f"t_{rank}.json").read_text())
        assert t == {"initial_ms": 30000, "heartbeat_ms": 7500, "out_of_section_ms": 40000,
                     "sections": {"checkpointing": 20000, "step": 3000}}, t


def test_rank_termination_signal_sigkill(job):
    write(job / "t.py", HEARTBEATS_THEN_SLEEPS)
    r = run_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "0", "--heartbeat-timeout", "1",
                   "--rank-termination-signal", "SIGKILL", "--log-dir", "logs", "t.py"], cwd=job,
                  env=base_env(N="3"), timeout=60)
    assert r.returncode == 1, r.stderr
    ev = events(job / "logs")
    hang = of(ev, "hang")[0]
    hung = one(ev, "rank_exited", local_rank=hang["local_rank"])
    assert hung.get("signal") == signal.SIGKILL, (
        f"the hung rank must end by --rank-termination-signal SIGKILL, it ended by {hung}")
    in_order(ev, hang, one(ev, "stacks"), one(ev, "stop"), hung, ev[-1])


def test_rejected_second_connection_does_not_cut_off_the_ranks_own(job):
    """A malformed frame drops *that* connection only (docs/protocol.md). Here a second connection of
    the rank registers (as a process forked before its parent connected would) and then sends
    garbage; the rank's own shim connection must still receive what the agent pushes."""
    write(job / "t.py", """
import json, os, socket, struct, time
import vigil
path = os.environ["VIGIL_SOCKET"]
vigil.heartbeat(0)
t0 = time.time()
while vigil.timeouts() is None and time.time() - t0 < 10:
    time.sleep(0.01)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
s.sendall(bytes([0x56, 1, 1, 0]) + struct.pack("<I", 16) + struct.pack("<4I", 0, 0, os.getpid(), 0))
time.sleep(0.3)  # let the agent read the Register before the garbage
try:
    s.sendall(b"\\xff" * 8)
    s.recv(16)
except OSError:
    pass
s.close()
for i in range(25):  # enough heartbeats for the agent to calculate timeouts and push them
    vigil.heartbeat(i)
    time.sleep(0.05)
t0 = time.time()
while vigil.timeouts()["heartbeat_ms"] == 60000 and time.time() - t0 < 5:
    vigil.heartbeat()  # the calculated timeout is short: keep beating while waiting for it
    time.sleep(0.01)
json.dump(vigil.timeouts(), open(os.path.join(os.environ["OUT_DIR"], "t.json"), "w"))
""")
    r = run_vigil(["run", "--calculate-timeouts", "--heartbeat-timeout", "60", "--log-dir", "logs", "t.py"], cwd=job,
                  env=base_env(OUT_DIR=job), timeout=60)
    assert r.returncode == 0, r.stderr
    ev = events(job / "logs")
    rej = one(ev, "ipc_rejected")
    assert "malformed" in rej["reason"]
    calc = one(ev, "timeouts_updated", source="calculated")
    in_order(ev, one(ev, "registered"), rej, calc, ev[-1])
    got = json.loads((job / "t.json").read_text())
    assert abs(got["heartbeat_ms"] - calc["timeouts"]["heartbeat"] * 1000) <= 1, (
        f"the calculated timeouts never reached the rank's own connection: it still has {got}")


def test_closing_the_connection_ends_heartbeat_monitoring(job):
    """docs/protocol.md: a rank that closes its connection (vigil.close(), NVRx
    shutdown_workload_monitoring) ends heartbeat and section monitoring; the process is still
    supervised."""
    write(job / "t.py", """
import time
import vigil
for i in range(3):
    vigil.heartbeat(i)
    time.sleep(0.05)
with vigil.section("step"):
    time.sleep(0.01)
vigil.close()
time.sleep(3)  # e.g. a final evaluation after shutdown_workload_monitoring()
print("finished after close", flush=True)
""")
    r = run_vigil(["run", "--max-restarts", "0", "--heartbeat-timeout", "1", "--section-timeouts", "step=1",
                   "--log-dir", "logs", "t.py"], cwd=job, timeout=60)
    ev = events(job / "logs")
    assert not of(ev, "hang"), f"a rank that closed its connection was declared hung: {of(ev, 'hang')}"
    assert r.returncode == 0, r.stderr
    assert "[default0]:finished after close" in r.stdout
    assert ev[-1]["outcome"] == "succeeded"

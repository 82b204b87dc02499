"""The shim end to end: each scenario runs in a fresh interpreter against a fake agent."""

import json
import os
import signal
import time

from conftest import child_env, finish, spawn

HB = {"type": "Heartbeat", "step": None}


def hb(step):
    return {"type": "Heartbeat", "step": step}


def register(proc, rank=0, local_rank=0, cycle=0):
    return {"type": "Register", "rank": rank, "local_rank": local_rank, "pid": proc.pid, "cycle": cycle}


COUNT_WARNINGS = """
import json, warnings
warnings.simplefilter("always")
_caught = warnings.catch_warnings(record=True)
caught = _caught.__enter__()
import vigil
def vigil_warnings():
    return [str(w.message) for w in caught if issubclass(w.category, vigil.VigilWarning)]
"""


def test_registration_and_heartbeats(agent):
    proc = spawn(
        COUNT_WARNINGS
        + """
vigil.heartbeat()
vigil.heartbeat(7)
vigil.heartbeat(2**64 - 1)
vigil.heartbeat(-1)
vigil.heartbeat(0)
print(json.dumps(vigil_warnings()))
""",
        child_env(agent, RANK=3, LOCAL_RANK=1, TORCHELASTIC_RESTART_COUNT=2),
    )
    conn = agent.accept()
    out, _ = finish(proc)
    assert conn.drain() == [
        register(proc, rank=3, local_rank=1, cycle=2),
        HB,
        hb(7),
        hb(2**64 - 1),
        HB,  # the invalid step is dropped, the heartbeat is not
        hb(0),
    ]
    warned = json.loads(out)
    assert len(warned) == 1 and "-1" in warned[0]


def test_sections_timing_and_finished(agent):
    proc = spawn(
        """
import vigil
with vigil.section("step"):
    pass
vigil.start_section("チェックポイント ✓")
vigil.end_section("チェックポイント ✓")
vigil.start_section("x" * 300)
vigil.end_all_sections()
vigil.step_timing(5, 0.25)
vigil.step_timing(6, -1.0)
vigil.mark_finished()
try:
    with vigil.section("failing"):
        raise KeyError("boom")
except KeyError:
    pass
""",
        child_env(agent),
    )
    conn = agent.accept()
    finish(proc)
    assert conn.drain() == [
        register(proc),
        {"type": "SectionStart", "name": "step"},
        {"type": "SectionEnd", "name": "step"},
        {"type": "SectionStart", "name": "チェックポイント ✓"},
        {"type": "SectionEnd", "name": "チェックポイント ✓"},
        {"type": "SectionStart", "name": "x" * 255},
        {"type": "EndAllSections"},
        {"type": "StepTiming", "step": 5, "duration_us": 250000},
        {"type": "StepTiming", "step": 6, "duration_us": 0},
        {"type": "Finished"},
        {"type": "SectionStart", "name": "failing"},
        {"type": "SectionEnd", "name": "failing"},
    ]


def test_should_stop_after_stop_request(agent):
    proc = spawn(
        """
import json, time, vigil
first = [vigil.should_stop(), vigil.stop_step(), vigil.timeouts()]
vigil.heartbeat(1)
deadline = time.time() + 10
while not vigil.should_stop():
    assert time.time() < deadline, "no stop request seen"
    time.sleep(0.005)
vigil.heartbeat(2)
print(json.dumps({"first": first, "stop_step": vigil.stop_step(), "reason": vigil.stop_reason(),
                  "timeouts": vigil.timeouts(), "still": vigil.should_stop()}))
""",
        child_env(agent),
    )
    conn = agent.accept()
    conn.expect(register(proc), hb(1))
    conn.send(
        {
            "type": "Timeouts",
            "initial_ms": 1800000,
            "heartbeat_ms": None,
            "out_of_section_ms": 60000,
            "sections": [["step", 30000], ["checkpointing", 600000]],
        }
    )
    conn.send({"type": "StopRequest", "reason": "preempted: SIGTERM", "at_step": 1200})
    out, _ = finish(proc)
    assert conn.drain() == [hb(2)]
    got = json.loads(out)
    assert got["first"] == [False, None, None]
    assert got["stop_step"] == 1200
    assert got["reason"] == "preempted: SIGTERM"
    assert got["still"] is True
    assert got["timeouts"] == {
        "initial_ms": 1800000,
        "heartbeat_ms": None,
        "out_of_section_ms": 60000,
        "sections": {"step": 30000, "checkpointing": 600000},
    }


def test_outside_vigil_everything_is_a_noop_with_one_warning():
    proc = spawn(
        COUNT_WARNINGS
        + """
import time
vigil.heartbeat(); vigil.heartbeat(3)
with vigil.section("step"):
    vigil.start_section("a"); vigil.end_section("a"); vigil.end_all_sections()
vigil.step_timing(1, 0.5); vigil.mark_finished()
state = [vigil.should_stop(), vigil.stop_step(), vigil.stop_reason(), vigil.timeouts(),
         vigil.is_connected()]
t = time.perf_counter()
for _ in range(100000):
    vigil.heartbeat()
per_call_us = (time.perf_counter() - t) * 10
print(json.dumps({"warnings": vigil_warnings(), "state": state, "us": per_call_us}))
""",
        child_env(None),
    )
    got = json.loads(finish(proc)[0])
    assert len(got["warnings"]) == 1 and "VIGIL_SOCKET" in got["warnings"][0]
    assert got["state"] == [False, None, None, None, False]
    assert got["us"] < 5, "a no-op heartbeat should cost well under a microsecond or two"


def test_unreachable_agent_is_a_noop_with_one_warning(tmp_path):
    proc = spawn(
        COUNT_WARNINGS
        + """
vigil.heartbeat(); vigil.start_section("s"); print(json.dumps([vigil.should_stop(), vigil_warnings()]))
""",
        child_env(None, VIGIL_SOCKET=str(tmp_path / "nobody-listens.sock")),
    )
    stopped, warned = json.loads(finish(proc)[0])
    assert stopped is False
    assert len(warned) == 1 and "cannot reach the vigil agent" in warned[0]


def test_survives_the_agent_closing_the_socket(agent):
    proc = spawn(
        COUNT_WARNINGS
        + """
import time
vigil.heartbeat(1)
deadline = time.time() + 10
while vigil.is_connected():
    assert time.time() < deadline
    vigil.heartbeat(2)
    vigil.should_stop()
    time.sleep(0.01)
for i in range(1000):
    vigil.heartbeat(i)
    with vigil.section("step"):
        pass
    vigil.step_timing(i, 0.1)
print(json.dumps([vigil.should_stop(), vigil_warnings()]))
""",
        child_env(agent),
    )
    conn = agent.accept()
    conn.expect(register(proc), hb(1))
    conn.close()
    stopped, warned = json.loads(finish(proc)[0])
    assert stopped is False
    assert len(warned) == 1 and "lost the connection" in warned[0]


def test_forked_child_never_uses_the_parents_connection(agent):
    proc = spawn(
        COUNT_WARNINGS
        + """
import os
vigil.heartbeat(1)
pid = os.fork()
if pid == 0:
    vigil.heartbeat(100)
    vigil.start_section("worker")
    vigil.should_stop()
    vigil.heartbeat(101)
    w = vigil_warnings()
    os._exit(0 if len(w) == 1 and "forked" in w[0] and not vigil.is_connected() else 3)
_, status = os.waitpid(pid, 0)
vigil.heartbeat(2)
print(json.dumps([os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8, vigil_warnings()]))
""",
        child_env(agent),
    )
    conn = agent.accept()
    child_status, warned = json.loads(finish(proc)[0])
    assert child_status == 0
    assert warned == []
    assert conn.drain() == [register(proc), hb(1), hb(2)]
    assert agent.no_more_connections()


def test_child_forked_before_connecting_registers_itself(agent):
    proc = spawn(
        """
import os, vigil
pid = os.fork()
if pid == 0:
    vigil.heartbeat(5)
    print(os.getpid(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
""",
        child_env(agent, RANK=2, LOCAL_RANK=2),
    )
    conn = agent.accept()
    out, _ = finish(proc)
    child_pid = int(out.split()[0])
    assert conn.drain() == [
        {"type": "Register", "rank": 2, "local_rank": 2, "pid": child_pid, "cycle": 0},
        hb(5),
    ]


def test_full_socket_buffer_never_blocks_training(agent):
    proc = spawn(
        COUNT_WARNINGS
        + """
import time
vigil.SEND_TIMEOUT_S = 0.3
vigil.heartbeat(0)
t = time.perf_counter()
for i in range(300000):
    vigil.heartbeat(i)
hb_s = time.perf_counter() - t
t = time.perf_counter()
vigil.start_section("after-stall")
section_s = time.perf_counter() - t
print(json.dumps({"hb_s": hb_s, "section_s": section_s, "warnings": vigil_warnings()}))
""",
        child_env(agent),
    )
    conn = agent.accept()
    conn.expect(register(proc), hb(0))
    conn.reading.clear()  # the agent stalls
    out, _ = finish(proc, timeout=60)
    got = json.loads(out)
    assert got["hb_s"] < 10
    # The section could not be delivered: it waited for SEND_TIMEOUT_S, then the shim gave up.
    assert 0.2 < got["section_s"] < 3
    assert len(got["warnings"]) == 1 and "stopped reading" in got["warnings"][0]
    conn.reading.set()
    msgs = conn.drain()
    # Every byte that made it through is a well-formed heartbeat (partial frames were completed).
    assert len(msgs) > 100 and all(m["type"] == "Heartbeat" for m in msgs)
    steps = [m["step"] for m in msgs]
    assert steps == sorted(steps)


def test_sigusr2_dumps_every_thread_stack_while_spinning(agent, tmp_path):
    stack_file = tmp_path / "stacks.txt"
    proc = spawn(
        """
import threading, time, vigil
def idle_thread_wait():
    time.sleep(60)
threading.Thread(target=idle_thread_wait, daemon=True).start()
def spin_forever_in_python():
    x = 0
    while True:
        x += 1
print("ready", flush=True)
spin_forever_in_python()
""",
        child_env(agent, VIGIL_STACK_FILE=stack_file),
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        for n in (1, 2):
            os.kill(proc.pid, signal.SIGUSR2)
            deadline = time.time() + 10
            while stack_file.read_text().count("spin_forever_in_python") < n:
                assert time.time() < deadline, "no stack dump #%d" % n
                time.sleep(0.05)
            time.sleep(0.1)
            assert proc.poll() is None, "SIGUSR2 must not end the rank"
        text = stack_file.read_text()
        assert "idle_thread_wait" in text
        assert "most recent call first" in text
        # The shim names the main thread (faulthandler does not), so the agent can show it first.
        (line,) = [l for l in text.splitlines() if l.startswith("vigil: main thread of pid %d is " % proc.pid)]
        main_id = line.rsplit(" ", 1)[1]
        spinning = next(l for l in text.splitlines() if "most recent call first" in l and main_id in l)
        after = text.split(spinning, 1)[1].split("most recent call first")[0]
        assert "spin_forever_in_python" in after
    finally:
        proc.kill()
        proc.communicate()


def test_no_stack_dump_handler_outside_vigil(tmp_path):
    stack_file = tmp_path / "stacks.txt"
    proc = spawn(
        "import signal, vigil; print(signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL, vigil._stack_file)",
        child_env(None, VIGIL_STACK_FILE=stack_file),
    )
    out, _ = finish(proc)
    assert out.split() == ["True", "None"]
    assert not stack_file.exists()


def test_close_then_reconnect(agent):
    proc = spawn(
        """
import vigil
vigil.heartbeat(1)
vigil.close()
vigil.heartbeat(2)
""",
        child_env(agent),
    )
    first = agent.accept()
    second = agent.accept()
    finish(proc)
    assert first.drain() == [register(proc), hb(1)]
    assert second.drain() == [register(proc), hb(2)]


def test_an_uncaught_exception_is_told_to_the_agent_before_the_interpreter_goes(agent):
    # The hook runs before atexit handlers, so the agent learns it while the rank is still exiting;
    # the traceback is still printed and the exit status is still 1.
    proc = spawn(
        """
import atexit, vigil
vigil.heartbeat(3)
atexit.register(lambda: print("atexit ran", flush=True))
raise RuntimeError("Parent directory /ckpt does not exist.")
""",
        child_env(agent),
    )
    conn = agent.accept()
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 1, err
    assert "RuntimeError: Parent directory /ckpt does not exist." in err and "atexit ran" in out
    assert conn.drain() == [
        register(proc),
        hb(3),
        {"type": "Raised", "error": "RuntimeError: Parent directory /ckpt does not exist."},
    ]


def test_an_exception_in_a_rank_that_never_spoke_to_the_agent_connects_nothing(agent):
    proc = spawn("import vigil\nraise KeyError('x')\n", child_env(agent))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1 and "KeyError" in err
    assert agent.no_more_connections(wait=0.5)

"""``vigil.should_stop(step)``: Progress messages and the agreed stop step, against a fake agent."""

import json
import signal
import subprocess

from conftest import child_env, finish, spawn
from test_client import COUNT_WARNINGS, hb, register


def progress(step):
    return {"type": "Progress", "step": step}


#: What the first should_stop(step) tells the agent: it holds the stop signals (default action).
HELD = {"type": "HoldsSignals", "signals": sum(1 << s for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2))}


def stop(at_step, reason="time limit"):
    return {"type": "StopRequest", "reason": reason, "at_step": at_step}


WAIT_FOR = """
import time
def wait_for(cond, what):
    deadline = time.time() + 20
    while not cond():
        assert time.time() < deadline, "timed out waiting for " + what
        time.sleep(0.002)
"""


def test_progress_is_sent_once_per_step_and_is_not_a_heartbeat(agent):
    proc = spawn(
        COUNT_WARNINGS
        + """
got = [vigil.should_stop(s) for s in (0, 0, 1, 1, 1, 2)]
vigil.heartbeat(2)
got.append(vigil.should_stop(2))
got.append(vigil.should_stop(7))
print(json.dumps([got, vigil_warnings()]))
""",
        child_env(agent, RANK=5, LOCAL_RANK=1),
    )
    conn = agent.accept()
    out, _ = finish(proc)
    assert conn.drain() == [
        register(proc, rank=5, local_rank=1),
        HELD,
        progress(0),
        progress(1),
        progress(2),
        hb(2),
        progress(7),
    ]
    got, warned = json.loads(out)
    assert got == [False] * 8
    assert warned == []


def test_true_exactly_from_the_agreed_step_and_a_later_request_replaces_it(agent):
    proc = spawn(
        COUNT_WARNINGS
        + WAIT_FOR
        + """
r = {"before": [vigil.should_stop(1), vigil.should_stop(), vigil.stop_step()]}
vigil.heartbeat(99)  # tells the test that "before" is taken
wait_for(lambda: vigil.stop_step() == 5, "stop at 5")
r["at5"] = [vigil.should_stop(s) for s in (3, 4, 5, 6)] + [vigil.should_stop(), vigil.stop_reason()]
wait_for(lambda: vigil.stop_step() == 4, "stop moved to 4")
r["at4"] = [vigil.should_stop(3), vigil.should_stop(4), vigil.stop_reason()]
wait_for(lambda: vigil.stop_step() is None, "stop as soon as possible")
r["asap"] = [vigil.should_stop(0), vigil.should_stop(), vigil.stop_reason()]
print(json.dumps([r, vigil_warnings()]))
""",
        child_env(agent),
    )
    conn = agent.accept()
    # No request before the rank took "before": on a loaded machine it would otherwise see it.
    conn.expect(register(proc), HELD, progress(1), hb(99))
    conn.send(stop(5, "SIGTERM"))
    # Each step the rank evaluates is reported, in order, before the next request goes out.
    conn.expect(progress(3), progress(4), progress(5), progress(6))
    conn.send(stop(4, "earlier"))
    conn.expect(progress(3), progress(4))
    conn.send(stop(None, "asap"))
    out, _ = finish(proc)
    assert conn.drain() == [progress(0)]
    r, warned = json.loads(out)
    assert r["before"] == [False, False, None]
    assert r["at5"] == [False, False, True, True, True, "SIGTERM"]
    assert r["at4"] == [False, True, "earlier"]
    assert r["asap"] == [True, True, "asap"]
    assert warned == []


def test_bad_steps_warn_once_send_nothing_and_act_as_no_step(agent):
    proc = spawn(
        COUNT_WARNINGS
        + WAIT_FOR
        + """
class Index:  # a numpy or torch integer scalar is taken through __index__
    def __index__(self):
        return 9
before = [vigil.should_stop(s) for s in (-1, 2**64, 1.5, "3")]
ok = vigil.should_stop(Index())
wait_for(vigil.should_stop, "a stop request")
after = [vigil.should_stop(-1), vigil.should_stop(0), vigil.should_stop(Index())]
print(json.dumps([before, ok, after, vigil_warnings()]))
""",
        child_env(agent),
    )
    conn = agent.accept()
    conn.expect(register(proc), HELD, progress(9))
    conn.send(stop(10))
    out, _ = finish(proc)
    assert conn.drain() == [progress(0), progress(9)]
    before, ok, after, warned = json.loads(out)
    assert before == [False] * 4 and ok is False
    # Without a valid step the answer is should_stop()'s: a stop was asked.
    assert after == [True, False, False]
    assert len(warned) == 1 and "should_stop step" in warned[0] and "-1" in warned[0]


def test_a_new_connection_reports_the_step_again(agent):
    proc = spawn(
        """
import vigil
vigil.should_stop(5)
vigil.close()
vigil.should_stop(5)
vigil.should_stop(6)
""",
        child_env(agent),
    )
    first = agent.accept()
    second = agent.accept()
    finish(proc)
    assert first.drain() == [register(proc), HELD, progress(5)]
    # Held once per process: the agent keeps it for the rank, whatever connection it uses.
    assert second.drain() == [register(proc), progress(5), progress(6)]


def test_progress_never_blocks_and_a_dropped_one_is_sent_again(agent):
    proc = spawn(
        WAIT_FOR
        + """
import json, sys, time, vigil
vigil.should_stop(0)
print("connected", flush=True)
sys.stdin.readline()  # the agent has stopped reading
n = 200000  # far more 16-byte frames than a socket buffer holds
t = time.perf_counter()
for step in range(1, n):
    vigil.should_stop(step)
spent = time.perf_counter() - t
print(json.dumps([spent, vigil._progress_sent]), flush=True)  # the last step that got through
wait_for(vigil.should_stop, "a stop request")
print(json.dumps([vigil.should_stop(n - 1), vigil.is_connected()]), flush=True)
""",
        child_env(agent),
        stdin=subprocess.PIPE,
    )
    conn = agent.accept()
    conn.expect(register(proc), HELD, progress(0))
    assert proc.stdout.readline().strip() == "connected"
    conn.reading.clear()
    # The reader thread parks after the recv it is blocked in returns: at most one more chunk.
    proc.stdin.write("go\n")
    proc.stdin.flush()
    spent, last_through = json.loads(proc.stdout.readline())
    # A Progress that waited for buffer space (5 s each) would take hours here.
    assert spent < 120
    assert last_through < 199999, "the full buffer dropped some"
    conn.reading.set()
    steps = []
    while not steps or steps[-1] < last_through:  # the agent catches up with the socket buffer
        steps.append(conn.next()["step"])
    conn.send(stop(1))
    out, _ = finish(proc)
    assert json.loads(out) == [True, True]
    steps += [m["step"] for m in conn.drain()]
    assert steps == sorted(set(steps)), "each step at most once, in order"
    assert steps[-2:] == [last_through, 199999], "the dropped last step was sent on the next call"


def test_outside_vigil_should_stop_with_a_step_is_a_noop():
    proc = spawn(
        COUNT_WARNINGS
        + """
print(json.dumps([[vigil.should_stop(s) for s in range(3)], vigil.stop_step(), vigil_warnings()]))
""",
        child_env(None),
    )
    got, at, warned = json.loads(finish(proc)[0])
    assert got == [False, False, False] and at is None
    assert len(warned) == 1 and "VIGIL_SOCKET" in warned[0]


def test_a_held_signal_is_reported_to_the_agent_once_by_the_next_call(agent):
    proc = spawn(
        COUNT_WARNINGS
        + """
import os, signal
vigil.should_stop(1)
os.kill(os.getpid(), signal.SIGTERM)  # from outside vigil: `kill` by hand
os.kill(os.getpid(), signal.SIGUSR1)
got = [vigil.should_stop(2), vigil.should_stop(3)]
print(json.dumps([got, vigil_warnings()]))
""",
        child_env(agent),
    )
    conn = agent.accept()
    out, _ = finish(proc)
    # The handler only notes it; the next should_stop tells the agent (the first signal, once).
    assert conn.drain() == [
        register(proc),
        HELD,
        progress(1),
        progress(2),
        {"type": "Signalled", "signal": int(signal.SIGTERM)},
        progress(3),
    ]
    got, warned = json.loads(out)
    assert got == [False, False] and warned == []


def test_signals_the_program_handles_itself_are_not_reported_as_held(agent):
    proc = spawn(
        """
import signal, vigil
signal.signal(signal.SIGTERM, lambda *a: None)  # e.g. NeMo's or Lightning's own handler
vigil.should_stop(1)
""",
        child_env(agent),
    )
    conn = agent.accept()
    finish(proc)
    held = (1 << signal.SIGUSR1) | (1 << signal.SIGUSR2)
    assert conn.drain() == [register(proc), {"type": "HoldsSignals", "signals": held}, progress(1)]

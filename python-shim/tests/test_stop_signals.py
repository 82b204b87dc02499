"""A rank that calls should_stop(step) is not killed by a stop signal from outside (Slurm signals
every process of a step on preemption and `scancel --signal`): it waits for the agent's stop step,
and stops on its own when none comes within SIGNAL_WAIT."""
import os
import signal
import subprocess
import sys

from conftest import SHIM_DIR as SHIM  # "" when testing the installed package

PROG = """
import os, signal, sys, time
import vigil
vigil.SIGNAL_WAIT = 0.3
if sys.argv[1] == "custom":
    signal.signal(signal.SIGTERM, lambda *a: print("custom handler", flush=True))
vigil.should_stop(1)
for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    os.kill(os.getpid(), sig)
time.sleep(0.05)
print("alive, stop now:", vigil.should_stop(2), flush=True)
time.sleep(0.4)
print("after the wait:", vigil.should_stop(3), flush=True)
"""


def run(mode, sock):
    env = dict(os.environ, PYTHONPATH=SHIM) if SHIM else dict(os.environ)
    env.pop("VIGIL_SOCKET", None)
    if sock:
        env["VIGIL_SOCKET"] = "/nonexistent/vigil.sock"  # not connected: the calls do nothing else
    return subprocess.run([sys.executable, "-W", "ignore", "-c", PROG, mode], env=env, capture_output=True,
                          text=True, timeout=30)


def test_stop_signals_are_held_and_the_rank_stops_on_its_own_when_no_step_comes():
    r = run("plain", True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["alive, stop now: False", "after the wait: True"]


def test_outside_vigil_signals_keep_their_default_action():
    r = run("plain", False)
    assert r.returncode == -signal.SIGTERM, (r.returncode, r.stdout)


def test_a_handler_of_the_program_is_left_alone():
    r = run("custom", True)
    # SIGTERM reached the program's own handler; SIGUSR1/2 were held by vigil.
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "custom handler"

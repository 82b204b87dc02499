"""Processes that escape their rank's process group (setsid daemons, double forks, nohup) must not
outlive the attempt that started them: not after a normal end, not across a restart, and not after
the agent itself is SIGKILLed (the watchdog sweeps then). Found by attack: fault-findings item 1.

Each test starts the real agent; the rank starts real daemons that write their pids to files. Every
test runs twice: with the agent's own cgroup v2 (where this machine lets one be created) and with
`VIGIL_CGROUP=off`, where the token in every rank's environment and the agent as subreaper must
find them.
"""
import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from harness import base_env, events, pid_alive, run_vigil, start_vigil, wait_for, write

# Escapees, each writing its pid to <dir>/<kind>.pid once it runs: a python double fork + setsid,
# `setsid -f`, `nohup ... & disown`, and a `setsid -f` daemon whose environment was cleared (no
# token: only the cgroup, or the agent as subreaper while it lives, can find it).
ESCAPEES = r'''
import os, subprocess, sys, time

KINDS = ["double_fork", "setsid", "nohup", "clean_env"]

def escape(d):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            open(os.path.join(d, "double_fork.pid"), "w").write(str(os.getpid()))
            time.sleep(1000)
        os._exit(0)
    os.wait()
    subprocess.run(["setsid", "-f", "sh", "-c", f"echo $$ > {d}/setsid.pid; exec sleep 1000"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    subprocess.run(["bash", "-c", f"nohup sh -c 'echo $$ > {d}/nohup.pid; exec sleep 1000' "
                    ">/dev/null 2>&1 & disown"], check=True)
    subprocess.run(["env", "-i", "/bin/sh", "-c",
                    f"setsid -f /bin/sh -c 'echo $$ > {d}/clean_env.pid; exec sleep 1000' "
                    ">/dev/null 2>&1"], check=True)
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(d, k + ".pid")) for k in KINDS):
        if time.monotonic() > deadline:
            sys.exit("escapees did not start")
        time.sleep(0.02)
'''
KINDS = ["double_fork", "setsid", "nohup", "clean_env"]


def cgroup_possible() -> bool:
    """Whether this machine lets the tests' user create a cgroup v2 where the agent would."""
    try:
        rel = next(l[3:].strip() for l in open("/proc/self/cgroup") if l.startswith("0::"))
        mount = next(l.split(" - ")[0].split()[4] for l in open("/proc/self/mountinfo")
                     if l.split(" - ")[1].split()[0] == "cgroup2")
    except (StopIteration, OSError, IndexError):
        return False
    probe = Path(mount) / rel.lstrip("/") / f"vigil-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    probe.rmdir()
    return True


@pytest.fixture(params=["cgroup", "token"])
def mode(request):
    if request.param == "cgroup" and not cgroup_possible():
        pytest.skip("this machine gives no cgroup v2 the agent could create")
    return request.param


def env_for(mode):
    return base_env(**({"VIGIL_CGROUP": "off"} if mode == "token" else {}))


def check_mode(log_dir, mode):
    (c,) = [e for e in events(log_dir) if e["event"] == "containment"]
    assert (c["cgroup"] is not None) == (mode == "cgroup"), c


def read_pids(d: Path):
    return {k: int((d / f"{k}.pid").read_text()) for k in KINDS}


def kill_quietly(pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_escapees_are_killed_at_a_normal_end(job, mode):
    d = job / "esc"
    d.mkdir()
    script = write(job / "train.py", ESCAPEES + f"escape({str(d)!r})\n")
    r = run_vigil(["run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"), str(script)],
                  cwd=job, env=env_for(mode))
    pids = read_pids(d)
    try:
        assert r.returncode == 0, r.stderr
        # Killed before the agent returned; a moment for init to reap what the agent left as zombies.
        wait_for(lambda: not any(pid_alive(p) for p in pids.values()), timeout=10,
                 what=f"escapees {pids} to be gone")
        check_mode(job / "logs", mode)
        (k,) = [e for e in events(job / "logs") if e["event"] == "leftovers_killed"]
        # The nohup'd one stays in the rank's process group (no job control in `bash -c`), so the
        # group's SIGKILL may have ended it first; the other three are outside it.
        assert k["cycle"] == 0 and k["count"] >= 3, k
        assert "left running outside their process groups" in r.stderr
    finally:
        kill_quietly(pids.values())


def test_escapees_do_not_pile_up_across_restarts(job, mode):
    d0, d1 = job / "a0", job / "a1"
    d0.mkdir()
    d1.mkdir()
    script = write(job / "train.py", ESCAPEES + f"""
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 0:
    escape({str(d0)!r})
    sys.exit(3)
# The next attempt runs only once the last one is cleaned up: its escapees must be gone.
import json
pids = {{k: int(open(os.path.join({str(d0)!r}, k + ".pid")).read()) for k in KINDS}}
def alive(p):
    try:
        return open(f"/proc/{{p}}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
json.dump({{k: alive(p) for k, p in pids.items()}}, open(os.path.join({str(d1)!r}, "seen.json"), "w"))
""")
    r = run_vigil(["run", "--nproc-per-node", "1", "--max-restarts", "1",
                   "--log-dir", str(job / "logs"), str(script)], cwd=job, env=env_for(mode))
    pids = read_pids(d0)
    try:
        assert r.returncode == 0, r.stderr
        seen = json.loads((d1 / "seen.json").read_text())
        assert seen == {k: False for k in KINDS}, seen
        ev = [e["event"] for e in events(job / "logs")]
        assert ev.index("leftovers_killed") < ev.index("restart"), ev
    finally:
        kill_quietly(pids.values())


def test_escapees_die_with_a_sigkilled_agent(job, mode):
    d = job / "esc"
    d.mkdir()
    script = write(job / "train.py", ESCAPEES + f"escape({str(d)!r})\ntime.sleep(1000)\n")
    p = start_vigil(["run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"), str(script)],
                    cwd=job, env=env_for(mode))
    pids = {}
    try:
        wait_for(lambda: all((d / f"{k}.pid").exists() and (d / f"{k}.pid").read_text().strip()
                             for k in KINDS),
                 timeout=60, what="the escapees to start")
        pids = read_pids(d)
        assert all(pid_alive(x) for x in pids.values())
        p.kill()
        p.wait(timeout=30)
        # Without a cgroup, a daemon that cleared its environment is out of reach once the agent
        # (its subreaper) is gone: the documented limit.
        reachable = [k for k in KINDS if mode == "cgroup" or k != "clean_env"]
        wait_for(lambda: not any(pid_alive(pids[k]) for k in reachable), timeout=30,
                 what=f"the watchdog to kill escapees {pids}")
        check_mode(job / "logs", mode)
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=30)
        kill_quietly(pids.values())

"""`vigil run` end to end: the real binary supervising real rank processes."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import base_env, events, pid_alive, run_dirs, run_vigil, start_vigil, wait_for, write, vigil_bin

ENV_DUMP = """
import json, os, sys
keys = sys.argv[1].split(",")
out = {k: os.environ.get(k) for k in keys}
out["argv"] = sys.argv[2:]
path = os.path.join(os.environ["OUT_DIR"], "env_%s_%s.json" % (os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]))
with open(path, "w") as f:
    json.dump(out, f)
"""

TORCHRUN_KEYS = (
    "RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_NAME "
    "ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS "
    "TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE TORCH_NCCL_ASYNC_ERROR_HANDLING "
    "TORCHELASTIC_ERROR_FILE OMP_NUM_THREADS FROM_AGENT"
).split()


def test_environment_is_torchruns(job):
    write(job / "dump.py", ENV_DUMP)
    env = base_env(OUT_DIR=job, FROM_AGENT="inherited")
    r = run_vigil(
        ["run", "--nproc_per_node", "3", "--rdzv-id", "job42", "--max-restarts", "2", "--log-dir", "logs",
         "dump.py", ",".join(TORCHRUN_KEYS), "--lr", "0.1"],
        cwd=job, env=env,
    )
    assert r.returncode == 0, r.stderr
    ports = set()
    for rank in range(3):
        e = json.loads((job / f"env_{rank}_0.json").read_text())
        assert e["RANK"] == e["LOCAL_RANK"] == e["ROLE_RANK"] == str(rank)
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == e["ROLE_WORLD_SIZE"] == "3"
        assert (e["GROUP_RANK"], e["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert e["ROLE_NAME"] == "default"
        # The ranks' door to vigil's store, on loopback (torchrun would say localhost).
        assert e["MASTER_ADDR"] == "127.0.0.1" and 0 < int(e["MASTER_PORT"]) < 65536
        ports.add(e["MASTER_PORT"])
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0" and e["TORCHELASTIC_MAX_RESTARTS"] == "2"
        assert e["TORCHELASTIC_RUN_ID"] == "job42"
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert e["OMP_NUM_THREADS"] == "1"
        assert e["FROM_AGENT"] == "inherited"
        assert e["argv"] == ["--lr", "0.1"]
        (rd,) = run_dirs(job / "logs")
        assert e["TORCHELASTIC_ERROR_FILE"] == str(rd / "attempt_0" / str(rank) / "error.json")
    assert len(ports) == 1, "every rank of a cycle sees the same MASTER_PORT"


def test_pet_environment_fallbacks_and_user_settings_kept(job):
    write(job / "dump.py", ENV_DUMP)
    env = base_env(OUT_DIR=job, PET_NPROC_PER_NODE="2", PET_MASTER_PORT="29999", OMP_NUM_THREADS="7",
                   TORCH_NCCL_ASYNC_ERROR_HANDLING="3", PET_ROLE="trainer")
    r = run_vigil(["run", "--log-dir", "logs", "dump.py", ",".join(TORCHRUN_KEYS)], cwd=job, env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in job.glob("env_*.json")) == ["env_0_0.json", "env_1_0.json"]
    e = json.loads((job / "env_1_0.json").read_text())
    # The store listens at PET_MASTER_PORT; the ranks are told their door to it.
    assert e["MASTER_PORT"] != "29999"
    (nodes,) = [x for x in events(job / "logs") if x.get("event") == "nodes"]
    assert nodes["store"].endswith(":29999"), nodes
    assert e["OMP_NUM_THREADS"] == "7"
    assert e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert e["ROLE_NAME"] == "trainer"


def test_module_and_no_python(job):
    pkg = job / "pkg"
    pkg.mkdir()
    write(pkg / "__init__.py", "")
    write(pkg / "hello.py", "import os, sys\nprint('module says', os.environ['RANK'], sys.argv[1:])\n")
    r = run_vigil(["run", "--nproc-per-node", "2", "-m", "pkg.hello", "x"], cwd=job)
    assert r.returncode == 0, r.stderr
    assert "[default0]:module says 0 ['x']" in r.stdout
    assert "[default1]:module says 1 ['x']" in r.stdout
    r = run_vigil(["run", "--nproc-per-node", "2", "--no-python", "sh", "-c", "echo shell $RANK"], cwd=job)
    assert r.returncode == 0, r.stderr
    assert sorted(l for l in r.stdout.splitlines() if "shell" in l) == ["[default0]:shell 0", "[default1]:shell 1"]
    write(job / "rp.py", "import sys\nprint('run-path', __name__, sys.argv)\n")
    r = run_vigil(["run", "--run-path", str(job / "rp.py"), "a"], cwd=job)
    assert r.returncode == 0, r.stderr
    assert f"[default0]:run-path __main__ ['{job / 'rp.py'}', 'a']" in r.stdout


FLAKY = """
import os, sys
print("attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], "rank", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "1" and int(os.environ["TORCHELASTIC_RESTART_COUNT"]) < int(sys.argv[1]):
    sys.exit(7)
if os.environ["RANK"] == "0":
    import time; time.sleep(float(sys.argv[2]))
"""


def test_restart_then_success(job):
    write(job / "flaky.py", FLAKY)
    r = run_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "3", "--log-dir", "logs", "flaky.py", "2", "30"],
                  cwd=job)
    assert r.returncode == 0, r.stderr
    ev = events(job / "logs")
    kinds = [e["event"] for e in ev]
    assert kinds.count("cycle_start") == 3
    assert kinds.count("restart") == 2
    assert ev[-1]["event"] == "result" and ev[-1]["outcome"] == "succeeded" and ev[-1]["exit_code"] == 0
    # Rank 0 sleeps 30 s in the failing cycles: it was stopped by SIGTERM, not waited for.
    stopped = [e for e in ev if e["event"] == "rank_exited" and e["rank"] == 0 and e["cycle"] < 2]
    assert [e.get("signal") for e in stopped] == [signal.SIGTERM, signal.SIGTERM]
    assert all(e["expected"] for e in stopped)
    failed = [e for e in ev if e["event"] == "rank_exited" and not e["expected"]]
    assert [(e["rank"], e["exit_code"], e["cycle"]) for e in failed] == [(1, 7, 0), (1, 7, 1)]
    for cycle in range(3):
        assert f"[default1]:attempt {cycle} rank 1" in r.stdout
    # Event order within a cycle: joined, start, ranks started, failure, stop, verdict, restart.
    c0 = [e["event"] for e in ev if e.get("cycle") == 0 or e.get("from_cycle") == 0]
    assert c0[:4] == ["joined", "cycle_start", "rank_started", "rank_started"]
    assert c0.index("stop") > c0.index("rank_started") and c0[-1] == "restart"
    assert c0.index("cycle_ended") > c0.index("stop")


def test_budget_exhausted_prints_root_cause(job):
    write(job / "bad.py", """
import os, sys, time
if os.environ["RANK"] == "1":
    print("loading batch", file=sys.stderr)
    raise ValueError("bad batch 17")
time.sleep(60)
""")
    r = run_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", "logs", "bad.py"], cwd=job)
    assert r.returncode == 1
    assert "bad.py FAILED after 1 restart" in r.stderr
    root = r.stderr.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root
    assert "exitcode  : 1 (pid: " in root
    assert "ValueError: bad batch 17" in root
    assert "host      : " in root and "time      : " in root
    ev = events(job / "logs")
    assert ev[-1]["outcome"] == "failed" and ev[-1]["restarts"] == 1


def test_error_file_in_torch_record_format_is_reported(job):
    write(job / "rec.py", """
import json, os
with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
    json.dump({"message": {"message": "RuntimeError: CUDA out of memory",
               "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  File \\"rec.py\\", line 9, in step\\nRuntimeError: CUDA out of memory",
                             "timestamp": "1700000000"}}}, f)
raise SystemExit(1)
""")
    r = run_vigil(["run", "--log-dir", "logs", "rec.py"], cwd=job)
    assert r.returncode == 1
    root = r.stderr.split("Root Cause")[1]
    assert "message   : RuntimeError: CUDA out of memory" in root
    assert 'File "rec.py", line 9, in step' in root
    assert "error_file: " in root and "error.json" in root


IGNORES_TERM = """
import os, signal, sys, time
out = os.environ["OUT_DIR"]
def on_term(sig, frame):
    open(os.path.join(out, "term_%s" % os.environ["RANK"]), "w").close()
    if os.environ["RANK"] == "1":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
if os.environ["RANK"] == "0":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
open(os.path.join(out, "ready_%s" % os.environ["RANK"]), "w").close()
while True:
    time.sleep(0.05)
"""


def test_sigterm_forwarded_and_rank_ignoring_it_killed(job):
    write(job / "t.py", IGNORES_TERM)
    p = start_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "3", "--term-timeout", "1", "--log-dir", "logs",
                     "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    wait_for(lambda: (job / "ready_0").exists() and (job / "ready_1").exists(), what="ranks ready")
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert (job / "term_0").exists() and (job / "term_1").exists(), "both ranks received the SIGTERM"
    ev = events(job / "logs")
    kinds = [e["event"] for e in ev]
    assert "restart" not in kinds, "a signal to the agent never restarts the job"
    stop = next(e for e in ev if e["event"] == "stop")
    assert stop["reason"] == "signal" and stop["signal"] == signal.SIGTERM
    esc = next(e for e in ev if e["event"] == "escalate")
    assert esc["signal"] == signal.SIGKILL and len(esc["pids"]) == 1
    r0 = next(e for e in ev if e["event"] == "rank_exited" and e["rank"] == 0)
    assert r0.get("signal") == signal.SIGKILL
    assert kinds.index("escalate") > kinds.index("stop")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_other_signals_are_forwarded(job, sig):
    write(job / "t.py", """
import os, signal, sys, time
def on(sig, frame):
    open(os.path.join(os.environ["OUT_DIR"], "got_%d_%s" % (sig, os.environ["RANK"])), "w").close()
    sys.exit(0)
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, on)
open(os.path.join(os.environ["OUT_DIR"], "ready_" + os.environ["RANK"]), "w").close()
time.sleep(60)
""")
    p = start_vigil(["run", "--nproc-per-node", "2", "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    wait_for(lambda: (job / "ready_0").exists() and (job / "ready_1").exists(), what="ranks ready")
    p.send_signal(sig)
    p.communicate(timeout=60)
    assert p.returncode == 128 + sig
    assert (job / f"got_{sig}_0").exists() and (job / f"got_{sig}_1").exists()


def test_second_sigint_escalates_at_once(job):
    write(job / "t.py", """
import os, signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
open(os.path.join(os.environ["OUT_DIR"], "ready_" + os.environ["RANK"]), "w").close()
while True:
    time.sleep(0.05)
""")
    p = start_vigil(["run", "--nproc-per-node", "2", "--term-timeout", "600", "--log-dir", "logs", "t.py"], cwd=job,
                    env=base_env(OUT_DIR=job))
    wait_for(lambda: (job / "ready_0").exists() and (job / "ready_1").exists(), what="ranks ready")
    p.send_signal(signal.SIGINT)
    wait_for(lambda: any(e["event"] == "stop" for e in events(job / "logs")), what="stop event")
    p.send_signal(signal.SIGINT)
    # The 600 s term timeout would outlast this bound: only escalation ends the job in time.
    p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGINT
    esc = [e for e in events(job / "logs") if e["event"] == "escalate"]
    assert len(esc) == 1 and len(esc[0]["pids"]) == 2


GRANDCHILDREN = """
import os, subprocess, time
out = os.environ["OUT_DIR"]
# A shell's background job and a forked worker, both in the rank's process group.
sh = subprocess.Popen(["sh", "-c", "sleep 300 & echo $! > %s/bg_%s; wait" % (out, os.environ["RANK"])])
pid = os.fork()
if pid == 0:
    time.sleep(300)
    os._exit(0)
with open(os.path.join(out, "pids_" + os.environ["RANK"]), "w") as f:
    f.write("%d %d %d" % (os.getpid(), sh.pid, pid))
time.sleep(float(os.environ.get("RANK_SLEEP", "300")))
"""


def _family(job, ranks):
    pids = []
    for r in ranks:
        wait_for(lambda: (job / f"pids_{r}").exists() and (job / f"bg_{r}").exists() and (job / f"bg_{r}").read_text().strip(),
                 what=f"rank {r} family")
        pids += [int(x) for x in (job / f"pids_{r}").read_text().split()]
        pids.append(int((job / f"bg_{r}").read_text()))
    return pids


def test_sigkill_of_agent_leaves_nothing_behind(job):
    write(job / "t.py", GRANDCHILDREN)
    p = start_vigil(["run", "--nproc-per-node", "2", "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    pids = _family(job, [0, 1])
    assert all(pid_alive(x) for x in pids)
    p.kill()
    p.wait(timeout=10)
    wait_for(lambda: not any(pid_alive(x) for x in pids), timeout=30,
             what=f"ranks and their descendants to die: {[x for x in pids if pid_alive(x)]}")


def test_descendants_of_finished_ranks_are_reaped(job):
    write(job / "t.py", GRANDCHILDREN)
    r = run_vigil(["run", "--nproc-per-node", "2", "t.py"], cwd=job, env=base_env(OUT_DIR=job, RANK_SLEEP="0"))
    assert r.returncode == 0, r.stderr
    pids = _family(job, [0, 1])
    wait_for(lambda: not any(pid_alive(x) for x in pids), timeout=30, what="leftover descendants to die")


def test_restart_stops_the_whole_group_including_descendants(job):
    write(job / "t.py", GRANDCHILDREN + """
""")
    write(job / "crash.py", """
import os, runpy, sys, time
if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    while not os.path.exists(os.path.join(os.environ["OUT_DIR"], "pids_0")):
        time.sleep(0.02)
    sys.exit(1)
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "1":
    sys.exit(0)
runpy.run_path("t.py", run_name="__main__")
""")
    r = run_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "crash.py"], cwd=job, env=base_env(OUT_DIR=job))
    assert r.returncode == 0, r.stderr
    pids = _family(job, [0])
    wait_for(lambda: not any(pid_alive(x) for x in pids), timeout=30, what="stopped group's descendants to die")


def test_log_files_per_attempt(job):
    write(job / "t.py", """
import os, sys
print("out of", os.environ["RANK"], "attempt", os.environ["TORCHELASTIC_RESTART_COUNT"])
print("err of", os.environ["RANK"], file=sys.stderr)
sys.stdout.write("no newline at the end")
sys.stdout.flush()
open(os.path.join(os.environ["OUT_DIR"], "printed_%s_%s" % (os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"])), "w").close()
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "0":
    import time
    while not os.path.exists(os.path.join(os.environ["OUT_DIR"], "printed_1_0")):
        time.sleep(0.01)
    sys.exit(1)
""")
    r = run_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", "logs", "t.py"], cwd=job,
                  env=base_env(OUT_DIR=job))
    assert r.returncode == 0, r.stderr
    (rd,) = run_dirs(job / "logs")
    for attempt in (0, 1):
        for rank in (0, 1):
            d = rd / f"attempt_{attempt}" / str(rank)
            # Byte for byte what the rank wrote: no newline is added to its last line.
            assert (d / "stdout.log").read_text() == f"out of {rank} attempt {attempt}\nno newline at the end"
            assert (d / "stderr.log").read_text() == f"err of {rank}\n"
    assert "[default0]:no newline at the end" in r.stdout.splitlines()
    for e in events(job / "logs"):
        assert {"event", "ts", "host", "node_rank"} <= set(e)


def test_console_prefix_redirects_and_filter(job):
    write(job / "t.py", """
import os, sys
print("out", os.environ["LOCAL_RANK"])
print("err", os.environ["LOCAL_RANK"], file=sys.stderr)
""")
    r = run_vigil(["run", "--nproc-per-node", "3", "--local-ranks-filter", "1,2", "-r", "2:1", "--log-dir", "logs",
                   "t.py"], cwd=job)
    assert r.returncode == 0, r.stderr
    out = [l for l in r.stdout.splitlines() if l.startswith("[")]
    err = [l for l in r.stderr.splitlines() if l.startswith("[default")]
    assert sorted(out) == ["[default1]:out 1"]
    assert sorted(err) == ["[default1]:err 1", "[default2]:err 2"]
    (rd,) = run_dirs(job / "logs")
    assert (rd / "attempt_0" / "0" / "stdout.log").read_text() == "out 0\n"
    assert (rd / "attempt_0" / "2" / "stdout.log").read_text() == "out 2\n"


def test_interleaved_output_stays_in_whole_lines(job):
    write(job / "t.py", """
import os, sys
r = os.environ["RANK"]
for i in range(2000):
    sys.stdout.write(("%s-%d-" % (r, i)) + "x" * 50 + "\\n")
""")
    r = run_vigil(["run", "--nproc-per-node", "4", "t.py"], cwd=job)
    assert r.returncode == 0
    lines = [l for l in r.stdout.splitlines() if l.startswith("[default")]
    assert len(lines) == 8000
    for l in lines:
        prefix, body = l.split("]:", 1)
        rank, i, xs = body.split("-")
        assert prefix == f"[default{rank}" and xs == "x" * 50


def no_processes_running(marker: str) -> bool:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return not [p for p in out if int(p) != os.getpid()]


@pytest.mark.parametrize("args,needle", [
    (["run", "--bogus", "t.py"], "--bogus"),
    (["run", "--nproc-per-node", "0", "t.py"], "--nproc-per-node 0"),
    (["run", "--nproc-per-node", "two", "t.py"], "--nproc-per-node \"two\""),
    (["run", "missing_script.py"], "missing_script.py"),
    (["run", "--log-dir", "afile/sub", "t.py"], "--log-dir"),
    (["run", "--no-python", "/nonexistent/cmd"], "/nonexistent/cmd"),
    (["run", "--no-python", "definitely-not-a-command-xyz"], "definitely-not-a-command-xyz"),
    (["run", "--nnodes", "0", "t.py"], "--nnodes"),
    (["run", "-r", "9", "t.py"], "--redirects"),
    (["run", "--local-ranks-filter", "5", "t.py"], "local rank 5"),
])
def test_bad_input_is_one_clear_line(job, args, needle):
    write(job / "t.py", "import time\ntime.sleep(300)  # marker-bad-input\n")
    write(job / "afile", "")
    r = run_vigil(args, cwd=job)
    assert r.returncode == 2, (r.returncode, r.stderr)
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith("vigil: error:") or first.startswith("error:"), r.stderr
    assert needle in first, first
    assert "[default" not in r.stdout + r.stderr, "no rank was started"
    assert no_processes_running("marker-bad-input")


def test_script_that_cannot_execute_fails_without_restarts(job):
    write(job / "notexec.sh", "#!/bin/sh\necho hi\n")
    os.chmod(job / "notexec.sh", 0o644)
    r = run_vigil(["run", "--no-python", "--max-restarts", "5", str(job / "notexec.sh")], cwd=job)
    assert r.returncode == 2
    assert "notexec.sh" in r.stderr.strip().splitlines()[0]


def test_ft_launcher_name_runs_vigil_run(job, tmp_path):
    link = tmp_path / "ft_launcher"
    link.symlink_to(vigil_bin())
    write(job / "t.py", "import os\nprint('ft', os.environ['RANK'])\n")
    r = subprocess.run([str(link), "--nproc-per-node", "2", "t.py"], cwd=job, env=base_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(l for l in r.stdout.splitlines() if "ft" in l) == ["[default0]:ft 0", "[default1]:ft 1"]

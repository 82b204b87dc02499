"""torchrun's whole command line on the real binary: what follows the script belongs to the script,
torchrun 2.15's flags work as torchrun documents them, and `host:0` is any free port.

Found running third-party command lines under vigil (fault-findings 11, 12): a script argument that
shared a name with a vigil flag was taken by vigil, and `--rdzv-endpoint localhost:0` was refused.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO, base_env, events, run_dirs, run_vigil, start_vigil, vigil_bin, wait_for, write

# Writes what the rank got: its argv and the variables vigil sets.
DUMP = """
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
        "VIGIL_RUN_DIR", "TORCHELASTIC_SIGNALS_TO_HANDLE"]
out = {k: os.environ.get(k) for k in keys}
out["argv"] = sys.argv[1:]
out["main"] = __name__
path = os.path.join(os.environ["OUT_DIR"], "dump_%s_%s.json" % (os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]))
with open(path, "w") as f:
    json.dump(out, f)
"""


def dumps(out_dir: Path):
    return {p.name: json.loads(p.read_text()) for p in sorted(out_dir.glob("dump_*.json"))}


def vigil_long_flags():
    """Every long flag `vigil run --help` lists, in both spellings, and its short flags."""
    text = subprocess.run([vigil_bin(), "run", "--help"], capture_output=True, text=True, check=True).stdout
    longs = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)))
    assert "--max-restarts" in longs and "--log-dir" in longs and len(longs) > 30, longs
    underscored = [f.replace("-", "_").replace("__", "--", 1) for f in longs if "-" in f[2:]]
    shorts = sorted(set(re.findall(r"^\s+(-[a-zA-Z]),", text, re.M)))
    assert {"-m", "-r", "-t", "-h"} <= set(shorts), shorts
    return longs + underscored + shorts


def ft_flags():
    """Every ft_launcher flag vigil translates, in each spelling NVRx accepts (from ftcompat's table)."""
    src = (REPO / "agent" / "src" / "cli" / "ftcompat" / "table.rs").read_text()
    fields = re.findall(r'^\s+(?:map|note)\("([a-z_]+)"', src, re.M)
    assert "rank_heartbeat_timeout" in fields and len(fields) > 30, fields
    out = []
    for f in fields:
        out += ["--ft-" + f.replace("_", "-"), "--ft-" + f, "--ft_" + f, "--ft-param-" + f]
    out += ["--ft-cfg-path", "--ft_cfg_path", "--fault-tol-cfg-path", "--fault_tol_cfg_path",
            "--ft-ignore-missing-cfg", "--ignore-missing-fault-tol-cfg", "--restart-policy"]
    return out


def script_tail():
    """Every vigil and ft_launcher flag name, each followed by a value, plus the forms that bit
    real jobs: `--role x --max-restarts 3`, `--log_dir D`, `--module x`, `-m`, `--`, `--x=v`."""
    tail = ["--role", "x", "--max-restarts", "3", "--log_dir", "D", "--module", "llama3", "-m", "--", "-r3"]
    for i, flag in enumerate(vigil_long_flags() + ft_flags()):
        tail += [flag, f"v{i}"] if i % 3 else [f"{flag}=v{i}"]
    return tail


def assert_vigil_untouched(job, r, n_dumps=1):
    """vigil ran with its defaults: one rank, role `default`, no restarts, one run dir under logs/."""
    assert r.returncode == 0, r.stderr
    assert "accepted, no effect" not in r.stderr, "an ft_launcher flag after the script was translated"
    d = dumps(job)
    assert len(d) == n_dumps, d.keys()
    for got in d.values():
        assert got["ROLE_NAME"] == "default" and got["TORCHELASTIC_MAX_RESTARTS"] == "0", got
        assert got["LOCAL_WORLD_SIZE"] == str(n_dumps) and got["TORCHELASTIC_RESTART_COUNT"] == "0", got
    (rd,) = run_dirs(job / "logs")
    assert Path(d[next(iter(d))]["VIGIL_RUN_DIR"]) == rd
    kinds = [e["event"] for e in events(job / "logs")]
    assert kinds.count("cycle_start") == 1 and "restart" not in kinds, kinds
    # No directory was made from a value meant for the script (--log-dir D, --log_dir v12, ...).
    assert sorted(p.name for p in job.iterdir() if p.is_dir()) == ["logs", "pkg"], list(job.iterdir())
    return d


@pytest.fixture
def scripts(job):
    write(job / "train.py", DUMP)
    (job / "pkg").mkdir()
    write(job / "pkg" / "__init__.py", "")
    write(job / "pkg" / "train.py", DUMP)
    return job


def test_the_reported_line_reaches_the_script(scripts):
    job = scripts
    r = run_vigil(["run", "--nproc_per_node=1", "--log-dir", "logs", "train.py", "--role", "x", "--max-restarts", "3"],
                  cwd=job, env=base_env(OUT_DIR=job))
    d = assert_vigil_untouched(job, r)
    assert d["dump_0_0.json"]["argv"] == ["--role", "x", "--max-restarts", "3"]


@pytest.mark.parametrize("form", ["script", "module", "module-torchtitan", "no-python", "run-path", "ft_launcher"])
def test_every_flag_name_after_the_script_reaches_it_untouched(scripts, form, tmp_path):
    job = scripts
    tail = script_tail()
    launcher = [vigil_bin(), "run"]
    if form == "ft_launcher":
        link = tmp_path / "ft_launcher"
        link.symlink_to(vigil_bin())
        launcher = [str(link), "--ft-rank-heartbeat-timeout", "600"]
    head = {
        "script": ["train.py"],
        "ft_launcher": ["train.py"],
        "module": ["-m", "pkg.train"],
        "module-torchtitan": ["--module", "pkg.train"],
        "no-python": ["--no-python", sys.executable, "train.py"],
        "run-path": ["--run-path", str(job / "train.py")],
    }[form]
    r = subprocess.run([*launcher, "--log-dir", "logs", *head, *tail], cwd=job, env=base_env(OUT_DIR=job),
                       capture_output=True, text=True, timeout=120)
    if form == "ft_launcher":
        # The one ft flag before the script is translated (and says nothing: it maps to a vigil flag).
        assert r.returncode == 0, r.stderr
    d = assert_vigil_untouched(job, r)
    got = d["dump_0_0.json"]
    assert got["argv"] == tail, [(i, a, b) for i, (a, b) in enumerate(zip(got["argv"], tail)) if a != b][:5]
    assert got["main"] == "__main__"


def test_unknown_flag_before_the_script_is_still_refused(scripts):
    job = scripts
    r = run_vigil(["run", "--bogus", "train.py", "--role", "x"], cwd=job, env=base_env(OUT_DIR=job))
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()
    assert len(line) == 1 and "--bogus" in line[0] and "after the script" in line[0], r.stderr
    assert not dumps(job)


# --- --rdzv-endpoint host:0 -------------------------------------------------------------------

# The rank connects to MASTER_ADDR:MASTER_PORT: the port is real and vigil's store answers there.
CONNECT = DUMP + """
s = __import__("socket").create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=10)
s.close()
"""


@pytest.mark.parametrize("endpoint", ["localhost:0", "127.0.0.1:0"])
@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_endpoint_port_zero_is_any_free_port(job, endpoint, backend):
    write(job / "t.py", CONNECT)
    # NeMo-Run's ft_launcher line and NVRx's scripts: c10d, one node, port 0.
    r = run_vigil(["run", "--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--nnodes", "1",
                   "--nproc-per-node", "2", "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    assert r.returncode == 0, r.stderr
    d = dumps(job)
    ports = {v["MASTER_PORT"] for v in d.values()}
    assert len(d) == 2 and len(ports) == 1 and int(ports.pop()) > 0, d


def test_master_port_zero_is_any_free_port(job):
    write(job / "t.py", CONNECT)
    r = run_vigil(["run", "--master-port", "0", "--nproc-per-node", "2", "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    assert r.returncode == 0, r.stderr
    ports = {v["MASTER_PORT"] for v in dumps(job).values()}
    assert len(ports) == 1 and int(ports.pop()) > 0


@pytest.mark.parametrize("args,named", [
    (["--rdzv-endpoint", "localhost:0", "--node-rank", "0"], "localhost:0"),
    (["--master-addr", "127.0.0.1", "--master-port", "0", "--node-rank", "1"], "--master-port 0"),
])
def test_port_zero_on_several_nodes_is_refused(job, args, named):
    # A node other than rank 0 would wait forever for a store on port 0.
    write(job / "t.py", DUMP)
    r = run_vigil(["run", *args, "--nnodes", "2", "t.py"], cwd=job, env=base_env(OUT_DIR=job), timeout=60)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert named in line and "one node" in line, line
    assert not dumps(job)


# --- torchrun 2.15's flags ----------------------------------------------------------------------

PRINTS = """
import os, sys
r = os.environ["RANK"]
print("out", r, flush=True)
print("err", r, file=sys.stderr, flush=True)
"""


@pytest.mark.parametrize("how", ["flag", "underscore", "PET", "TORCHELASTIC"])
def test_log_line_prefix_template(job, how):
    write(job / "t.py", PRINTS)
    tmpl = "${hostname}|${rank}|${local_rank}|${role_name}|$$|${nope}: "
    args, env = {
        "flag": (["--log-line-prefix-template", tmpl], {}),
        "underscore": ([f"--log_line_prefix_template={tmpl}"], {}),
        "PET": ([], {"PET_LOG_LINE_PREFIX_TEMPLATE": tmpl}),
        "TORCHELASTIC": ([], {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": tmpl}),
    }[how]
    r = run_vigil(["run", "--nproc-per-node", "2", "--role", "trainer", *args, "t.py"], cwd=job,
                  env=base_env(**env))
    assert r.returncode == 0, r.stderr
    host = socket.gethostname()
    assert sorted(l for l in r.stdout.splitlines() if "out" in l) == [
        f"{host}|0|0|trainer|$|${{nope}}: out 0", f"{host}|1|1|trainer|$|${{nope}}: out 1"]
    assert sorted(l for l in r.stderr.splitlines() if l.endswith(("err 0", "err 1"))) == [
        f"{host}|0|0|trainer|$|${{nope}}: err 0", f"{host}|1|1|trainer|$|${{nope}}: err 1"]


# Records every signal it gets, per rank; ends on SIGTERM or SIGUSR1.
CATCHER = """
import os, signal, sys, time
out = os.environ["OUT_DIR"]
def on(sig, frame):
    open(os.path.join(out, "got_%d_%s" % (sig, os.environ["RANK"])), "w").close()
    if sig in (signal.SIGTERM, signal.SIGUSR1):
        sys.exit(0)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, on)
open(os.path.join(out, "ready_" + os.environ["RANK"]), "w").close()
while True:
    time.sleep(0.05)
"""


def start_catchers(job, args, env=None):
    write(job / "t.py", CATCHER)
    # SIGHUP at its default action, as a login shell leaves it: a suite run under `nohup` would
    # otherwise hand the agent an ignored SIGHUP.
    p = start_vigil(["run", "--nproc-per-node", "2", "--log-dir", "logs", *args, "t.py"], cwd=job,
                    env=base_env(OUT_DIR=job, **(env or {})),
                    preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    wait_for(lambda: (job / "ready_0").exists() and (job / "ready_1").exists(), what="ranks ready")
    return p


@pytest.mark.parametrize("how", ["flag", "underscore", "PET"])
def test_signals_to_handle_adds_a_forwarded_signal(job, how):
    spec = "SIGTERM,SIGUSR1"
    args, env = {
        "flag": (["--signals-to-handle", spec], {}),
        "underscore": ([f"--signals_to_handle={spec}"], {}),
        "PET": ([], {"PET_SIGNALS_TO_HANDLE": spec}),
    }[how]
    p = start_catchers(job, args, env)
    p.send_signal(signal.SIGUSR1)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGUSR1, err
    assert (job / f"got_{signal.SIGUSR1}_0").exists() and (job / f"got_{signal.SIGUSR1}_1").exists()
    stop = next(e for e in events(job / "logs") if e["event"] == "stop")
    assert stop["reason"] == "signal" and stop["signal"] == signal.SIGUSR1


def test_a_signal_left_out_of_the_list_is_not_forwarded(job):
    # Only SIGUSR1 is handled: SIGHUP keeps its default action and ends the agent itself, whose
    # ranks then die with it (parent-death signal and watchdog) without ever seeing a SIGHUP.
    p = start_catchers(job, ["--signals-to-handle", "SIGUSR1"])
    pids = [e["pid"] for e in wait_for(
        lambda: [e for e in events(job / "logs") if e["event"] == "rank_started"][1:] and
        [e for e in events(job / "logs") if e["event"] == "rank_started"], what="rank_started events")]
    p.send_signal(signal.SIGHUP)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGHUP
    from harness import pid_alive
    wait_for(lambda: not any(pid_alive(x) for x in pids), timeout=30, what="ranks to die with the agent")
    assert not list(job.glob(f"got_{signal.SIGHUP}_*"))


def test_signals_to_handle_is_what_ranks_see(job):
    write(job / "t.py", DUMP)
    r = run_vigil(["run", "--signals-to-handle", "SIGTERM,SIGUSR2", "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    assert r.returncode == 0, r.stderr
    assert dumps(job)["dump_0_0.json"]["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGUSR2"


IGNORES_TERM = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(os.environ["OUT_DIR"], "ready_" + os.environ["RANK"]), "w").close()
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("how", ["flag", "underscore", "PET", "TORCH_ELASTIC"])
def test_shutdown_timeout_is_the_grace_before_sigkill(job, how):
    write(job / "t.py", IGNORES_TERM)
    args, env = {
        "flag": (["--shutdown-timeout", "1"], {}),
        "underscore": (["--shutdown_timeout=1"], {}),
        "PET": ([], {"PET_SHUTDOWN_TIMEOUT": "1"}),
        "TORCH_ELASTIC": ([], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "1"}),
    }[how]
    p = start_vigil(["run", "--nproc-per-node", "2", "--log-dir", "logs", *args, "t.py"], cwd=job,
                    env=base_env(OUT_DIR=job, **env))
    wait_for(lambda: (job / "ready_0").exists() and (job / "ready_1").exists(), what="ranks ready")
    p.send_signal(signal.SIGTERM)
    # The default grace is 30 s; only the 1 s given ends the job inside this bound.
    p.communicate(timeout=20)
    assert p.returncode == 128 + signal.SIGTERM
    ev = events(job / "logs")
    stop = next(e for e in ev if e["event"] == "stop")
    assert stop["signal"] == signal.SIGTERM and stop["grace_ms"] == 1000, stop
    esc = next(e for e in ev if e["event"] == "escalate")
    assert esc["signal"] == signal.SIGKILL and len(esc["pids"]) == 2


def test_shutdown_timeout_and_term_timeout_must_agree(job):
    write(job / "t.py", PRINTS)
    r = run_vigil(["run", "--shutdown-timeout", "5", "--term-timeout", "6", "t.py"], cwd=job)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "--term-timeout" in line and "--shutdown-timeout" in line, line


DUPS = """
import os, sys
r, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
for w in ("apple", "banana", "or,ange"):
    print(w, r, attempt, flush=True)
print("warn:", r, attempt, file=sys.stderr, flush=True)
print("fine", r, attempt, file=sys.stderr, flush=True)
open(os.path.join(os.environ["OUT_DIR"], "printed_%s_%s" % (r, attempt)), "w").close()
if attempt == "0" and r == "0":
    import time
    # Fail only once rank 1 has printed, or stopping it could cut its lines short.
    while not os.path.exists(os.path.join(os.environ["OUT_DIR"], "printed_1_0")):
        time.sleep(0.01)
    sys.exit(3)
"""


@pytest.mark.parametrize("how", ["flag", "PET"])
def test_duplicate_filters_copy_matching_lines_per_attempt(job, how):
    write(job / "t.py", DUPS)
    args, env = {
        "flag": (["--duplicate-stdout-filters", "apple,or,,ange", "--duplicate_stderr_filters=warn"], {}),
        "PET": ([], {"PET_DUPLICATE_STDOUT_FILTERS": "apple,or,,ange", "PET_DUPLICATE_STDERR_FILTERS": "warn"}),
    }[how]
    r = run_vigil(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", "logs",
                   "--log-line-prefix-template", "<${rank}> ", *args, "t.py"], cwd=job, env=base_env(OUT_DIR=job, **env))
    assert r.returncode == 0, r.stderr
    (rd,) = run_dirs(job / "logs")
    for attempt in (0, 1):
        d = rd / f"attempt_{attempt}"
        out = sorted((d / "filtered_stdout.log").read_text().splitlines())
        assert out == [f"<{k}> {w} {k} {attempt}" for k in (0, 1) for w in ("apple", "or,ange")], out
        err = sorted((d / "filtered_stderr.log").read_text().splitlines())
        assert err == [f"<{k}> warn: {k} {attempt}" for k in (0, 1)], err
        # The rank's own logs keep everything.
        assert "banana" in (d / "0" / "stdout.log").read_text()


def test_no_filters_no_filtered_files(job):
    write(job / "t.py", PRINTS)
    r = run_vigil(["run", "--log-dir", "logs", "--duplicate-stdout-filters", "", "t.py"], cwd=job)
    assert r.returncode == 0, r.stderr
    (rd,) = run_dirs(job / "logs")
    assert not list(rd.rglob("filtered_*"))


@pytest.mark.parametrize("visible,var,expect", [
    (None, None, ["0", "1", "2"]),
    ("5,6,7", "CUDA_VISIBLE_DEVICES", ["5", "6", "7"]),
    ("3,2,1", "HIP_VISIBLE_DEVICES", ["3", "2", "1"]),
])
@pytest.mark.parametrize("how", ["flag", "underscore", "PET"])
def test_virtual_local_rank(job, visible, var, expect, how):
    write(job / "t.py", DUMP)
    env = {"OUT_DIR": job}
    if visible:
        env[var] = visible
    args = {"flag": ["--virtual-local-rank"], "underscore": ["--virtual_local_rank"], "PET": []}[how]
    if how == "PET":
        env["PET_VIRTUAL_LOCAL_RANK"] = "1"
    r = run_vigil(["run", "--nproc-per-node", "3", *args, "t.py"], cwd=job, env=base_env(**env))
    assert r.returncode == 0, r.stderr
    d = dumps(job)
    for rank in range(3):
        got = d[f"dump_{rank}_0.json"]
        assert got["LOCAL_RANK"] == "0" and got["RANK"] == str(rank), got
        assert got["CUDA_VISIBLE_DEVICES"] == expect[rank], got
        if var == "HIP_VISIBLE_DEVICES":
            assert got["HIP_VISIBLE_DEVICES"] == expect[rank], got


def test_without_virtual_local_rank_nothing_changes(job):
    write(job / "t.py", DUMP)
    r = run_vigil(["run", "--nproc-per-node", "2", "t.py"], cwd=job,
                  env=base_env(OUT_DIR=job, CUDA_VISIBLE_DEVICES="5,6"))
    assert r.returncode == 0, r.stderr
    d = dumps(job)
    assert [d[f"dump_{k}_0.json"]["LOCAL_RANK"] for k in (0, 1)] == ["0", "1"]
    assert {d[f"dump_{k}_0.json"]["CUDA_VISIBLE_DEVICES"] for k in (0, 1)} == {"5,6"}


def test_virtual_local_rank_with_too_few_devices_is_refused(job):
    write(job / "t.py", DUMP)
    r = run_vigil(["run", "--nproc-per-node", "3", "--virtual-local-rank", "t.py"], cwd=job,
                  env=base_env(OUT_DIR=job, CUDA_VISIBLE_DEVICES="5,6"))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "--virtual-local-rank" in line and "CUDA_VISIBLE_DEVICES=5,6" in line, line
    assert not dumps(job)


@pytest.mark.parametrize("args,env", [
    (["--event-log-handler", "null"], {}),
    (["--event_log_handler=console"], {}),
    (["--event-log-handler", "dynamic_rendezvous"], {}),
    ([], {"PET_EVENT_LOG_HANDLER": "console"}),
])
def test_event_log_handler_is_accepted_and_the_event_log_still_written(job, args, env):
    write(job / "t.py", PRINTS)
    r = run_vigil(["run", "--log-dir", "logs", *args, "t.py"], cwd=job, env=base_env(**env))
    assert r.returncode == 0, r.stderr
    assert any(e["event"] == "cycle_start" for e in events(job / "logs"))


@pytest.mark.parametrize("mode", ["node", "socket", "exclusive", "core-complex"])
def test_numa_binding_without_a_gpu_runs_unbound_with_a_note(job, mode):
    # Binding itself is tested with the fake NVML in test_gpu_node.py.
    write(job / "t.py", PRINTS)
    r = run_vigil(["run", "--numa_binding" if mode == "socket" else "--numa-binding", mode, "t.py"], cwd=job)
    assert r.returncode == 0, r.stderr
    notes = [l for l in r.stderr.splitlines() if "--numa-binding" in l]
    assert len(notes) == 1 and f"--numa-binding {mode}: GPU telemetry off" in notes[0], r.stderr
    assert notes[0].endswith("ranks start unbound"), r.stderr


@pytest.mark.parametrize("args", [
    ["--numa-binding", "everything"],
    ["--event-log-handler", "syslog"],
    ["--signals-to-handle", "SIGKILL"],
    ["--signals-to-handle", "SIGNOPE"],
    ["--shutdown-timeout", "-1"],
    ["--shutdown-timeout", "1e30"],
])
def test_bad_values_of_the_new_flags(job, args):
    write(job / "t.py", DUMP)
    r = run_vigil(["run", *args, "t.py"], cwd=job, env=base_env(OUT_DIR=job))
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("vigil: error:") and args[0] in line, line
    assert not dumps(job)


@pytest.mark.parametrize("var,value,main_ran", [
    ("PET_MODULE", "1", "module"), ("PET_MODULE", "0", "file"), ("PET_STANDALONE", "1", "file"),
])
def test_switches_from_pet_variables_take_torchruns_integers(scripts, var, value, main_ran):
    job = scripts
    target = "pkg.train" if main_ran == "module" else "train.py"
    r = run_vigil(["run", target], cwd=job, env=base_env(OUT_DIR=job, **{var: value}))
    assert r.returncode == 0, r.stderr
    assert dumps(job)["dump_0_0.json"]["main"] == "__main__"


def test_a_switch_from_pet_that_is_not_an_integer_is_refused(scripts):
    r = run_vigil(["run", "train.py"], cwd=scripts, env=base_env(OUT_DIR=scripts, PET_NO_PYTHON="yes please"))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "--no-python" in line and "give 1 (on) or 0 (off)" in line, line


# --- every flag of the installed torchrun ----------------------------------------------------------

# A plausible value for each torchrun flag that takes one (dash spelling). A torchrun release that
# adds a flag fails the test below until the flag is known here and vigil accepts it.
PLAUSIBLE = {
    "--nnodes": "1", "--nproc-per-node": "2", "--rdzv-backend": "c10d", "--rdzv-endpoint": "localhost:0",
    "--rdzv-id": "job7", "--rdzv-conf": "join_timeout=60", "--max-restarts": "1", "--monitor-interval": "0.5",
    "--event-log-handler": "console", "--role": "trainer", "--log-dir": "logs", "--redirects": "3",
    "--tee": "3", "--log-line-prefix-template": "[${rank}]:", "--local-ranks-filter": "0",
    "--duplicate-stdout-filters": "ran", "--duplicate-stderr-filters": "ran", "--node-rank": "0",
    "--master-addr": "127.0.0.1", "--master-port": "FREE", "--local-addr": "127.0.0.1", "--logs-specs": "default",
    "--signals-to-handle": "SIGTERM,SIGINT,SIGUSR1", "--shutdown-timeout": "5", "-r": "3", "-t": "3",
}
OK = """
import os, sys
print("ran", os.environ["RANK"], sys.argv[1:])
open(os.path.join(os.environ["OUT_DIR"], "ran_" + os.environ["RANK"]), "w").close()
"""


def torchrun_options():
    """(option strings, takes a value, its choices) for every option `torchrun --help` lists."""
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        if os.environ.get("VIGIL_REQUIRE_TORCH") == "1":
            raise RuntimeError("VIGIL_REQUIRE_TORCH=1 but torch is not importable: pip install torch")
        pytest.skip("torch is not installed (set VIGIL_REQUIRE_TORCH=1 to make this an error)")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--help"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    text = r.stdout.split("options:", 1)[1]
    opts = []
    for line in text.splitlines():
        m = re.match(r"^  (-[^ ].*?)(?:  +\S.*)?$", line)
        if not m:
            continue
        strings, value, choices = [], False, []
        for part in m.group(1).split(", "):
            name, _, metavar = part.partition(" ")
            strings.append(name)
            if metavar:
                value = True
                if metavar.startswith("{"):
                    choices = metavar.strip("{}").split(",")
        opts.append((strings, value, choices))
    return opts


def test_vigil_accepts_every_flag_of_the_installed_torchrun(job):
    opts = torchrun_options()
    names = {s for strings, _, _ in opts for s in strings}
    # The parse found the whole list, both spellings included.
    assert {"--nproc-per-node", "--nproc_per_node", "--max-restarts", "--no-python", "-m", "--tee",
            "--signals-to-handle", "--virtual-local-rank"} <= names, names
    write(job / "ok.py", OK)
    write(job / "okmod.py", OK)
    rejected = []
    for i, (strings, takes_value, choices) in enumerate(opts):
        for flag in strings:
            if flag in ("-h", "--help"):
                r = run_vigil(["run", flag], cwd=job)
                if r.returncode != 0 or "--nproc-per-node" not in r.stdout:
                    rejected.append((flag, r.stderr.strip()))
                continue
            norm = flag if flag.startswith("--") is False else "--" + flag[2:].replace("_", "-")
            if norm == "--print-completion":
                # As under torchrun, it prints a completion script and exits without running anything.
                r = run_vigil(["run", flag, "bash"], cwd=job)
                if r.returncode != 0 or "complete" not in r.stdout:
                    rejected.append((flag, r.stderr.strip()))
                continue
            out = job / f"out_{i}_{flag.strip('-')}"
            out.mkdir()
            if takes_value:
                value = choices[0] if choices else PLAUSIBLE.get(norm)
                assert value is not None, f"torchrun has a new flag {flag}: add a plausible value to PLAUSIBLE"
                if value == "FREE":
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", 0))
                        value = str(s.getsockname()[1])
                head = [flag, value, "ok.py"]
            elif norm in ("-m", "--module"):
                head = [flag, "okmod"]
            elif norm == "--no-python":
                head = [flag, sys.executable, "ok.py"]
            elif norm == "--run-path":
                head = [flag, str(job / "ok.py")]
            else:
                head = [flag, "ok.py"]
            r = run_vigil(["run", *head, "--arg"], cwd=job, env=base_env(OUT_DIR=out), timeout=120)
            if r.returncode != 0 or not (out / "ran_0").exists():
                rejected.append((" ".join(head), r.returncode, r.stderr.strip()[-300:]))
    assert not rejected, rejected


def test_nemo_run_ft_launcher_line_with_port_zero(job, tmp_path):
    # NeMo-Run's single-node ft_launcher line, as it writes it.
    link = tmp_path / "ft_launcher"
    link.symlink_to(vigil_bin())
    write(job / "t.py", CONNECT)
    r = subprocess.run([str(link), "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "1234",
                        "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
                        "--ft-param-rank_heartbeat_timeout", "600", "--ft-param-initial_rank_heartbeat_timeout", "1200",
                        "t.py", "--nnodes", "8"], cwd=job, env=base_env(OUT_DIR=job), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    d = dumps(job)
    assert len(d) == 2 and {v["MASTER_PORT"] for v in d.values()} != {"0"}
    assert all(v["argv"] == ["--nnodes", "8"] for v in d.values()), d

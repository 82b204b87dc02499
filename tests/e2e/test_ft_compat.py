"""ft_launcher command lines run unchanged under vigil (docs/ft_launcher.md)."""
import json
import subprocess
from pathlib import Path

from harness import base_env, run_vigil, vigil_bin, write

DUMP_TIMEOUTS = """
import json, os, sys, time
import vigil
vigil.heartbeat(0)
t0 = time.time()
while vigil.timeouts() is None and time.time() - t0 < 30:
    time.sleep(0.01)
with open(os.path.join(os.environ["OUT_DIR"], "t_%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"timeouts": vigil.timeouts(), "argv": sys.argv[1:], "world": os.environ["WORLD_SIZE"]}, f)
"""


def test_nemo_run_line_through_an_ft_launcher_symlink(job, tmp_path):
    link = tmp_path / "ft_launcher"
    link.symlink_to(vigil_bin())
    write(job / "t.py", DUMP_TIMEOUTS)
    write(job / "ft.yaml", "fault_tolerance:\n  rank_heartbeat_timeout: 7\n  rank_section_timeouts:\n    step: 30\n"
                           "  rank_out_of_section_timeout: 90\n")
    # NeMo-Run's spelling (underscores after --ft-), a YAML config and torchrun flags together.
    r = subprocess.run(
        [str(link), "--ft-cfg-path", "ft.yaml", "--ft-rank_heartbeat_timeout", "300",
         "--ft-initial_rank_heartbeat_timeout", "1800", "--ft-workload-check-interval", "5", "--max-restarts", "3",
         "--rdzv-backend", "c10d", "--nproc-per-node", "2", "--node-rank", "0", "t.py", "--ft-rank_heartbeat_timeout",
         "5", "--cfg", "x"],
        cwd=job, env=base_env(OUT_DIR=job), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--ft-workload-check-interval" in r.stderr and "no effect" in r.stderr
    for rank in (0, 1):
        d = json.loads((job / f"t_{rank}.json").read_text())
        t = d["timeouts"]
        assert t["heartbeat_ms"] == 300_000, "the command line beats the YAML file"
        assert t["initial_ms"] == 1_800_000
        assert t["sections"] == {"step": 30_000} and t["out_of_section_ms"] == 90_000
        assert d["argv"] == ["--ft-rank_heartbeat_timeout", "5", "--cfg", "x"], "script arguments are untouched"
        assert d["world"] == "2"


def test_dash_spellings_and_explicit_vigil_flags_win(job):
    write(job / "t.py", DUMP_TIMEOUTS)
    r = run_vigil(["run", "--ft-rank-heartbeat-timeout=40", "--heartbeat-timeout", "20",
                   "--ft-rank-section-timeouts", "step:11,checkpointing:22", "t.py"],
                  cwd=job, env=base_env(OUT_DIR=job))
    assert r.returncode == 0, r.stderr
    t = json.loads((job / "t_0.json").read_text())["timeouts"]
    assert t["heartbeat_ms"] == 20_000
    assert t["sections"] == {"step": 11_000, "checkpointing": 22_000}


def test_ft_errors_are_one_clear_line(job):
    write(job / "t.py", "print('never')\n")
    for args, needle in [
        (["run", "--ft-bogus-flag", "1", "t.py"], "--ft-bogus-flag"),
        (["run", "--ft-safety-factor", "abc", "t.py"], "abc"),
        (["run", "--ft-cfg-path", "missing.yaml", "t.py"], "--ignore-missing-fault-tol-cfg"),
    ]:
        r = run_vigil(args, cwd=job)
        assert r.returncode == 2, r.stderr
        first = r.stderr.strip().splitlines()[0]
        assert first.startswith("vigil: error:") and needle in first, first
        assert "never" not in r.stdout
    r = run_vigil(["run", "--ft-cfg-path", "missing.yaml", "--ignore-missing-fault-tol-cfg", "t.py"], cwd=job)
    assert r.returncode == 0, r.stderr
    assert "[default0]:never" in r.stdout


def test_the_ft_launcher_program_prints_nvrx_restarter_lines(job):
    # The `ft_launcher` binary (for installs without a symlink) runs vigil under that name, so
    # it prints NVRx's [NestedRestarter] lines as a symlink does; `vigil run` does not.
    ft = Path(vigil_bin()).with_name("ft_launcher")
    write(job / "t.py", "import vigil\nvigil.heartbeat(0)\nvigil.close()\n")
    r = subprocess.run([str(ft), "--nproc-per-node", "1", "t.py"], cwd=job, env=base_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    states = [line.split("state=", 1)[1] for line in r.stdout.splitlines() if "[NestedRestarter]" in line]
    assert states == ["initialize", "handling stage=starting", "aborted"], r.stdout
    r = run_vigil(["run", "t.py"], cwd=job)
    assert r.returncode == 0 and "NestedRestarter" not in r.stdout + r.stderr


def test_ft_launcher_help_and_version_speak_ft_launchers_names(job, tmp_path):
    """Field finding 45: `ft_launcher --help` described `ft_launcher run` and vigil's names, and
    `--version` was an error. Through a symlink and through the `ft_launcher` binary."""
    link = tmp_path / "ft_launcher"
    link.symlink_to(vigil_bin())
    for ft in (link, Path(vigil_bin()).with_name("ft_launcher")):
        r = subprocess.run([str(ft), "--version"], cwd=job, env=base_env(), capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("ft_launcher (vigil "), r.stdout
        assert "compatible with ft_launcher of NVIDIA Resiliency Extension (NVRx) 0.7" in r.stdout, r.stdout
        r = subprocess.run([str(ft), "--nnodes", "1", "--help"], cwd=job, env=base_env(), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "Usage: ft_launcher [OPTIONS] <TRAINING_SCRIPT> [ARGS]..." in r.stdout, r.stdout[:2000]
        assert "ft_launcher run" not in r.stdout and "NVRx) 0.7" in r.stdout
        # The ft_launcher spelling of its flags, and what each becomes.
        assert "--ft-rank-heartbeat-timeout <VALUE>\n          vigil run's --heartbeat-timeout" in r.stdout
        assert "--ft-cfg-path <FILE>" in r.stdout
        assert "--nproc-per-node" in r.stdout, "torchrun's flags, which ft_launcher takes too"
        # After the script, --help is the script's.
        write(job / "t.py", "import sys\nprint('script got', sys.argv[1:])\n")
        r = subprocess.run([str(ft), "t.py", "--help"], cwd=job, env=base_env(), capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert "Usage: ft_launcher" not in r.stdout

"""What an install promises (docs/install.md): `vigil --version` names the release and commit,
`ft_launcher` beside the binary runs it as `vigil run`, and a rank library of another protocol
version is refused with one line naming the side to upgrade. The wheel itself is built, checked
with auditwheel and run from a fresh venv by scripts/wheel.sh."""
import re
import subprocess
from pathlib import Path

from harness import base_env, run_vigil, vigil_bin, write

# A rank library that speaks the next protocol version: as if `pip install` had upgraded the
# shim and not the binary.
NEWER_SHIM = """
import os, sys
import vigil, vigil._protocol as p
p.VERSION += 1
p._REGISTER_HEADER = p._header(p.REGISTER, 16)  # its first frame carries the new version
if sys.argv[1] == "no-env":
    os.environ.pop("VIGIL_PROTOCOL", None)
vigil.heartbeat()
print("connected:", vigil.is_connected(), flush=True)
"""


def test_version_names_release_commit_and_protocol(tmp_path):
    p = subprocess.run([vigil_bin(), "--version"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    m = re.fullmatch(r"vigil (\d+\.\d+\.\d+) \(([0-9a-f]{7,40}|unknown commit), rank protocol (\d+)\)\n", p.stdout)
    assert m, p.stdout
    inside = subprocess.run(["git", "rev-parse", "--git-dir"], capture_output=True, cwd=Path(__file__).parent)
    if inside.returncode == 0 and m.group(2) != "unknown commit":
        # Built from a checkout: it names one of its commits (HEAD's when freshly built).
        known = subprocess.run(["git", "cat-file", "-e", m.group(2) + "^{commit}"], capture_output=True,
                               cwd=Path(__file__).parent)
        assert known.returncode == 0, f"{m.group(2)} is not a commit of this checkout"


def test_ft_launcher_binary_runs_vigil_run_with_ft_launchers_flags(tmp_path):
    ft = Path(vigil_bin()).with_name("ft_launcher")
    assert ft.exists(), f"{ft}: cargo build builds ft_launcher beside vigil"
    script = write(tmp_path / "t.py", "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n")
    p = subprocess.run([str(ft), "--nproc-per-node", "2", "--ft-rank_heartbeat_timeout", "60", str(script)],
                       cwd=tmp_path, env=base_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0 of 2" in p.stdout and "rank 1 of 2" in p.stdout, p.stdout


def test_newer_rank_library_is_refused_before_it_connects(tmp_path):
    script = write(tmp_path / "t.py", NEWER_SHIM)
    p = run_vigil(["run", "--nproc-per-node", "1", str(script), "env"], cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "connected: False" in p.stdout, p.stdout
    lines = [l for l in p.stderr.splitlines() if "rank protocol" in l]
    assert len(lines) == 1, p.stderr
    assert "speaks rank protocol 1 and this rank library 2" in lines[0], lines
    assert "upgrade the vigil binary" in lines[0], lines


def test_agent_refuses_a_frame_of_another_protocol_naming_the_side_to_upgrade(tmp_path):
    # Without VIGIL_PROTOCOL (an agent's environment scrubbed by the program) the shim connects and
    # the agent refuses its first frame.
    script = write(tmp_path / "t.py", NEWER_SHIM)
    p = run_vigil(["run", "--nproc-per-node", "1", str(script), "no-env"], cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    refused = [l for l in p.stderr.splitlines() if "refused a connection" in l]
    assert len(refused) == 1, p.stderr
    assert "rank protocol version 2 is not this vigil's (1)" in refused[0], refused
    assert "upgrade the vigil binary" in refused[0], refused

"""agent/build.rs in a checkout without `.git/packed-refs` (field finding 48): cargo reruns a build
script on every build for a `rerun-if-changed` path that does not exist, and so recompiled the
agent on every no-op `cargo build`. Cheap check, without cargo: the script alone is compiled with
rustc and run in a fresh git repository that has no packed-refs; every path it asks cargo to watch
must exist. (Two `cargo build`s of a temporary clone would show the same, at minutes a run.)"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import REPO

BUILD_RS = Path(os.environ.get("VIGIL_BUILD_RS", REPO / "agent" / "build.rs"))


def test_every_path_the_build_script_watches_exists_in_a_clone_without_packed_refs(tmp_path):
    if not shutil.which("rustc") or not shutil.which("git"):
        pytest.skip("needs rustc and git")
    exe = tmp_path / "build-script"
    subprocess.run(["rustc", "--edition=2021", "-o", str(exe), str(BUILD_RS)], check=True, timeout=300,
                   capture_output=True)
    repo = tmp_path / "clone"
    repo.mkdir()
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)}
    env.pop("VIGIL_COMMIT", None)
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True, text=True)
    git("init", "-q", "-b", "main")
    (repo / "f").write_text("x\n")
    git("add", "f")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    assert not (repo / ".git" / "packed-refs").exists()
    out = subprocess.run([str(exe)], cwd=repo, env=env, check=True, capture_output=True, text=True,
                         timeout=60).stdout
    watched = [l.split("=", 1)[1] for l in out.splitlines() if l.startswith("cargo:rerun-if-changed=")]
    assert watched, out
    missing = [p for p in watched if not (repo / p).exists()]
    assert not missing, f"watched but missing (cargo reruns the script on every build): {missing}"
    # A new commit is still noticed: the branch's ref (or HEAD) is among the watched paths.
    assert any(p.endswith("refs/heads/main") or p.endswith("HEAD") for p in watched), watched
    commit = git("rev-parse", "--short=12", "HEAD").stdout.strip()
    assert f"cargo:rustc-env=VIGIL_COMMIT={commit}" in out, out

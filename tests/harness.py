"""Shared harness for vigil's end-to-end tests: the real binary, real child processes."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHIM = REPO / "python-shim"


def require_torch():
    """Skips the calling module without torch, unless VIGIL_REQUIRE_TORCH=1 (CI), which makes a
    missing torch an error."""
    try:
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the machine
        if os.environ.get("VIGIL_REQUIRE_TORCH") == "1":
            raise RuntimeError("VIGIL_REQUIRE_TORCH=1 but torch is not importable: pip install torch")
        pytest.skip("torch is not installed (set VIGIL_REQUIRE_TORCH=1 to make this an error)", allow_module_level=True)


def vigil_bin() -> str:
    path = os.environ.get("VIGIL_BIN") or str(REPO / "target" / "debug" / "vigil")
    if not os.access(path, os.X_OK):
        pytest.fail(f"vigil binary {path} not found: run `cargo build` first or set VIGIL_BIN")
    return path


def base_env(**extra):
    env = dict(os.environ)
    # Ranks run the interpreter that runs the tests, with the in-tree shim importable.
    env["PYTHON_EXEC"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SHIM), env.get("PYTHONPATH")]))
    for k in list(env):
        if k.startswith("PET_") or k.startswith("SLURM_") or k.startswith("VIGIL_"):
            del env[k]
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_vigil(args, cwd, env=None, timeout=120, **kw):
    return subprocess.run(
        [vigil_bin(), *args],
        cwd=cwd,
        env=env or base_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def start_vigil(args, cwd, env=None, **kw):
    return subprocess.Popen(
        [vigil_bin(), *args],
        cwd=cwd,
        env=env or base_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def wait_for(pred, timeout=30.0, what="condition"):
    """Polls an observable condition with a generous bound; the bound is a failure, not a timing goal."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def run_dirs(log_dir: Path):
    """Run directories (`vigil_<id or script>_<time>_<hex>`), not a job's state (`vigil-job-<id>`)."""
    return sorted(p for p in Path(log_dir).iterdir() if p.is_dir() and p.name.startswith("vigil_"))


def events(log_dir: Path):
    (d,) = run_dirs(log_dir)
    return [json.loads(l) for l in (d / "events.jsonl").read_text().splitlines() if l.strip()]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def send_junk(port: int, data: bytes, timeout: float = 30.0):
    """Connects to 127.0.0.1:`port`, sends `data` (not the store's handshake) and reads until
    the other end closes the connection."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        s.settimeout(timeout)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def read_events(path: Path):
    """The event log at `path` as far as it is written (empty if not yet there)."""
    try:
        return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    except (FileNotFoundError, ValueError):
        return []


def of(ev, name, **match):
    return [e for e in ev if e["event"] == name and all(e.get(k) == v for k, v in match.items())]


def one(ev, name, **match):
    found = of(ev, name, **match)
    assert len(found) == 1, (name, match, [e["event"] for e in ev])
    return found[0]


class StoreService:
    """`vigil store` on loopback, its stdout read line by line."""

    def __init__(self, job, *args, env=None):
        self.proc = start_vigil(["store", "--listen", "127.0.0.1:0", *args], cwd=job,
                                env=base_env(**(env or {})))
        first = self.proc.stdout.readline()
        assert first.startswith("listening on 127.0.0.1:"), (first, self.proc.stderr.read())
        self.port = int(first.rsplit(":", 1)[1])
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.reader.join(timeout=5)
        return rc, self.proc.stderr.read()

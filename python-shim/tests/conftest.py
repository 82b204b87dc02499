import os
import queue
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# VIGIL_SHIM_FROM_INSTALL=1 (scripts/wheel.sh): test the installed `vigil` package (the wheel's),
# not this checkout's python-shim/.
if os.environ.get("VIGIL_SHIM_FROM_INSTALL") == "1":
    SHIM_DIR = ""
else:
    SHIM_DIR = os.path.join(REPO_DIR, "python-shim")
    sys.path.insert(0, SHIM_DIR)

from vigil import _protocol  # noqa: E402

if os.environ.get("VIGIL_SHIM_FROM_INSTALL") == "1":
    assert _protocol.__file__.startswith(sys.prefix), "VIGIL_SHIM_FROM_INSTALL=1 but vigil comes from " + _protocol.__file__

CLOSED = object()


class AgentConn:
    """One accepted rank connection; a thread decodes what the rank sends."""

    def __init__(self, sock):
        self.sock = sock
        self.msgs = queue.Queue()
        self.decoder = _protocol.rank_decoder()
        self.raw = bytearray()
        self.reading = threading.Event()
        self.reading.set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            self.reading.wait()
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.msgs.put(CLOSED)
                return
            self.raw += data
            self.decoder.feed(data)
            try:
                for m in self.decoder.messages():
                    self.msgs.put(m)
            except _protocol.DecodeError as e:
                self.msgs.put(e)
                return

    def next(self, timeout=5.0):
        try:
            return self.msgs.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no message from the rank within %.1f s" % timeout) from None

    def expect(self, *expected, timeout=5.0):
        got = [self.next(timeout) for _ in expected]
        assert got == list(expected)
        return got

    def drain(self, timeout=5.0):
        """Every message until the rank closes the connection."""
        out = []
        while True:
            m = self.next(timeout)
            if m is CLOSED:
                return out
            out.append(m)

    def send(self, msg):
        self.sock.sendall(_protocol.encode(msg))

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class FakeAgent:
    """A Unix socket server standing in for the vigil agent."""

    def __init__(self, path):
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        self.conns = queue.Queue()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                s, _ = self.listener.accept()
            except OSError:
                return
            self.conns.put(AgentConn(s))

    def accept(self, timeout=5.0):
        try:
            return self.conns.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no rank connected within %.1f s" % timeout) from None

    def no_more_connections(self, wait=0.3):
        try:
            self.conns.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    def close(self):
        self.listener.close()


@pytest.fixture
def agent(tmp_path):
    a = FakeAgent(str(tmp_path / "agent.sock"))
    yield a
    a.close()


def child_env(agent=None, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    if SHIM_DIR:
        env["PYTHONPATH"] = SHIM_DIR
    else:
        env.pop("PYTHONPATH", None)
    env.setdefault("RANK", "0")
    env.setdefault("LOCAL_RANK", "0")
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    if agent is not None:
        env["VIGIL_SOCKET"] = agent.path
    env.update({k: str(v) for k, v in extra.items()})
    return env


def spawn(code, env, **kw):
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def finish(proc, timeout=20):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, "child failed (%s):\n%s\n%s" % (proc.returncode, out, err)
    return out, err

"""vigil-store-server against the real torch.distributed TCPStore client (and
vigil's Rust client against torch's own server).

The binary is taken from $VIGIL_STORE_SERVER, or built with
`cargo build -p vigil-store --bins --examples` and found under
$CARGO_TARGET_DIR/debug (default: <repo>/target/debug).
Without torch these tests skip, unless VIGIL_REQUIRE_TORCH=1 (then they fail).
"""
import datetime
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

try:
    import torch  # noqa: F401
    import torch.distributed as dist

    TORCH_ERROR = None if dist.is_available() else "torch.distributed is not available"
except Exception as exc:  # pragma: no cover - depends on the machine
    dist = None
    TORCH_ERROR = f"cannot import torch: {exc!r}"


@pytest.fixture(autouse=True)
def _need_torch():
    if TORCH_ERROR is None:
        return
    if os.environ.get("VIGIL_REQUIRE_TORCH") == "1":
        pytest.fail(f"VIGIL_REQUIRE_TORCH=1 but {TORCH_ERROR}")
    pytest.skip(TORCH_ERROR)


def td(seconds):
    return datetime.timedelta(seconds=seconds)


# --------------------------------------------------------------------------- binaries


def _target_dir():
    return Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")


@pytest.fixture(scope="session")
def binaries():
    """Paths of vigil-store-server and the client_check example."""
    server = os.environ.get("VIGIL_STORE_SERVER")
    check = os.environ.get("VIGIL_STORE_CLIENT_CHECK")
    if server and not check:
        candidate = Path(server).parent / "examples" / "client_check"
        check = str(candidate) if candidate.exists() else None
    if not server or not check:
        build = subprocess.run(
            ["cargo", "build", "-q", "-p", "vigil-store", "--bins", "--examples"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert build.returncode == 0, f"cargo build failed:\n{build.stderr}"
        debug = _target_dir() / "debug"
        server = server or str(debug / "vigil-store-server")
        check = check or str(debug / "examples" / "client_check")
    for p in (server, check):
        assert os.access(p, os.X_OK), f"{p} is not an executable"
    return {"server": server, "check": check}


class Server:
    def __init__(self, binary, *extra):
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", "0", *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on 127.0.0.1:"), f"first line was {line!r}"
        self.port = int(line.rsplit(":", 1)[1])
        assert self.port > 0

    def client(self, use_libuv=True, timeout=10):
        return dist.TCPStore(
            "127.0.0.1",
            self.port,
            is_master=False,
            wait_for_workers=False,
            timeout=td(timeout),
            use_libuv=use_libuv,
        )

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """Closes stdin (the server's stop signal) and returns its exit code."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def server(binaries):
    s = Server(binaries["server"])
    yield s
    assert s.alive(), "the server died during the test"
    assert s.stop() == 0, s.proc.stderr.read()


def run_py(code, *args, timeout=60, env=None):
    """Runs a Python snippet in a fresh interpreter (torch calls can hold the GIL)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return out


SETTER = """
import sys, time, datetime
import torch.distributed as dist
port, delay, op, key, value = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
s = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=30))
if op == "add":
    value = int(value)
s.set("setter/ready", "1")
time.sleep(delay)
getattr(s, op)(key, value)
print("done")
"""


def start_setter(port, delay, op, key, value):
    """Another process that, `delay` s after connecting, runs `op(key, value)`."""
    proc = run_py(SETTER, port, delay, op, key, value)
    return proc


# --------------------------------------------------------------------------- basic ops


@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv-client", "classic-client"])
def test_basic_operations(server, use_libuv):
    s = server.client(use_libuv=use_libuv)
    assert s.libuvBackend == use_libuv
    s.set("a", "1")
    assert s.get("a") == b"1"
    s.set("bin", bytes(range(256)))
    assert s.get("bin") == bytes(range(256))
    assert s.add("n", 5) == 5
    assert s.add("n", -8) == -3
    assert s.get("n") == b"-3"
    assert s.check(["a", "n"]) is True
    assert s.check(["a", "missing"]) is False
    s.wait(["a", "n"])
    s.wait(["a"], td(1))
    assert s.num_keys() == 3
    assert s.delete_key("bin") is True
    assert s.delete_key("bin") is False
    assert s.num_keys() == 2
    s.append("ap", "x")
    s.append("ap", "yz")
    assert s.get("ap") == b"xyz"
    s.multi_set(["m1", "m2"], ["v1", "v2"])
    assert s.multi_get(["m2", "m1"]) == [b"v2", b"v1"]
    assert sorted(s.list_keys()) == ["a", "ap", "m1", "m2", "n"]


def test_compare_set_semantics(server):
    s = server.client()
    assert s.compare_set("cs", "", "x") == b"x"  # missing + empty expected: created
    assert s.get("cs") == b"x"
    assert s.compare_set("ghost", "e", "x") == b"e"  # missing + non-empty: untouched
    assert s.check(["ghost"]) is False
    assert s.compare_set("cs", "x", "y") == b"y"  # equal: swapped
    assert s.compare_set("cs", "nope", "z") == b"y"  # different: unchanged
    assert s.get("cs") == b"y"


def test_wait_times_out(server):
    s = server.client()
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="timeout"):
        s.wait(["never"], td(0.3))
    assert time.monotonic() - start >= 0.3
    # The connection is still in sync after CANCEL_WAIT.
    assert s.add("after", 2) == 2
    s.set("never", "now")
    s.wait(["never"], td(1))
    assert s.get("never") == b"now"


def test_get_times_out_with_the_store_timeout(binaries, server):
    s = server.client(timeout=1)
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError):
        s.get("missing")
    assert 0.9 <= time.monotonic() - start < 10


def test_wait_released_by_another_clients_set(server):
    s = server.client(timeout=30)
    setter = start_setter(server.port, 0.5, "set", "late", "here")
    s.wait(["setter/ready"], td(30))
    start = time.monotonic()
    s.wait(["late"], td(30))
    waited = time.monotonic() - start
    assert s.get("late") == b"here"
    assert 0.3 <= waited < 20, waited
    assert finish(setter).strip() == "done"


def test_get_released_by_another_clients_add(server):
    s = server.client(timeout=30)
    setter = start_setter(server.port, 0.3, "add", "counter", 7)
    assert s.get("counter") == b"7"
    finish(setter)


def test_multi_get_waits_for_all_keys(server):
    s = server.client(timeout=30)
    s.set("first", "1")
    setter = start_setter(server.port, 0.3, "set", "second", "2")
    assert s.multi_get(["first", "second"]) == [b"1", b"2"]
    finish(setter)


# --------------------------------------------------------------------------- queues, barrier


def test_queues(server):
    s = server.client()
    s.queue_push("q", "one")
    s.queue_push("q", b"two")
    assert s.queue_len("q") == 2
    assert s.queue_pop("q") == b"one"
    assert s.queue_pop("q", block=False) == b"two"
    assert s.queue_len("q") == 0
    with pytest.raises(dist.QueueEmptyError):
        s.queue_pop("q", block=False)
    assert s.queue_len("never") == 0
    # Queues are not keys.
    assert s.num_keys() == 0


def test_blocking_queue_pop_released_by_a_push(server):
    s = server.client(timeout=30)
    pusher = start_setter(server.port, 0.3, "queue_push", "jobs", "job-1")
    assert s.queue_pop("jobs") == b"job-1"
    finish(pusher)


def test_queue_ops_need_the_libuv_client(server):
    s = server.client(use_libuv=False)
    with pytest.raises(NotImplementedError):
        s.queue_push("q", "x")


BARRIER = """
import sys, datetime
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=30))
s.barrier("bar", 3)
print("passed")
"""


def test_barrier(server):
    s = server.client(timeout=30)
    others = [run_py(BARRIER, server.port) for _ in range(2)]
    s.barrier("bar", 3)
    for p in others:
        assert finish(p).strip() == "passed"
    assert s.get("bar") == b"3"
    with pytest.raises(dist.DistStoreError, match="timeout"):
        s.barrier("lonely", 2, td(0.2))
    assert s.add("alive", 1) == 1


# --------------------------------------------------------------------------- same answers as torch


def _script(s):
    """Runs one sequence of operations; returns every answer (or error type)."""
    out = []

    def do(name, fn):
        try:
            out.append((name, fn()))
        except Exception as exc:  # noqa: BLE001 - the type is the answer
            out.append((name, type(exc).__name__))

    do("set", lambda: s.set("a", "1"))
    do("get", lambda: s.get("a"))
    do("add", lambda: s.add("n", 5))
    do("add2", lambda: s.add("n", -3))
    do("get-n", lambda: s.get("n"))
    do("add-set", lambda: (s.set("m", "40"), s.add("m", 2))[1])
    do("cs-new", lambda: s.compare_set("cs", "", "x"))
    do("cs-missing", lambda: s.compare_set("cs2", "e", "x"))
    do("cs-swap", lambda: s.compare_set("cs", "x", "y"))
    do("cs-miss", lambda: s.compare_set("cs", "q", "z"))
    do("cs-empty-on-present", lambda: s.compare_set("cs", "", "w"))
    do("check-yes", lambda: s.check(["a", "cs"]))
    do("check-no", lambda: s.check(["a", "cs2"]))
    do("num", lambda: s.num_keys())
    do("del", lambda: s.delete_key("a"))
    do("del-again", lambda: s.delete_key("a"))
    do("append", lambda: (s.append("ap", "1"), s.append("ap", "2"), s.get("ap"))[2])
    do("mset", lambda: s.multi_set(["k1", "k2"], ["v1", "v2"]))
    do("mget", lambda: s.multi_get(["k2", "k1"]))
    do("wait-timeout", lambda: s.wait(["zzz"], td(0.2)))
    do("after-timeout", lambda: s.add("n", 1))
    do("qpush", lambda: s.queue_push("q", "x"))
    do("qlen", lambda: s.queue_len("q"))
    do("qpop", lambda: s.queue_pop("q"))
    do("qpop-empty", lambda: s.queue_pop("q", False))
    do("barrier", lambda: s.barrier("b", 1))
    do("list", lambda: sorted(s.list_keys()))
    do("num-end", lambda: s.num_keys())
    do("empty-value", lambda: (s.set("e", ""), s.get("e"))[1])
    return out


@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv-client", "classic-client"])
def test_answers_match_torchs_own_server(server, use_libuv):
    ours = _script(server.client(use_libuv=use_libuv))
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=td(10))
    client = dist.TCPStore(
        "127.0.0.1", master.port, is_master=False, wait_for_workers=False,
        timeout=td(10), use_libuv=use_libuv,
    )
    theirs = _script(client)
    assert ours == theirs
    assert ("wait-timeout", "DistStoreError") in ours


# --------------------------------------------------------------------------- process groups

GLOO_WORKER = """
import os, sys, datetime
import torch
import torch.distributed as dist
rank, world, port, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if mode == "store":
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
else:
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
dist.barrier()
print(f"rank {dist.get_rank()} sum {t.item()}")
dist.destroy_process_group()
"""


def _gloo_job(port, mode, world=2, extra_env=None):
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            GLOO_SOCKET_IFNAME="lo",
        )
        env.update(extra_env or {})
        procs.append(run_py(GLOO_WORKER, rank, world, port, mode, env=env))
    outs = [finish(p, timeout=120) for p in procs]
    expected = float(sum(range(1, world + 1)))
    for rank, out in enumerate(outs):
        assert f"rank {rank} sum {expected}" in out, out


def test_init_process_group_with_tcpstore_on_our_server(server):
    _gloo_job(server.port, "store")
    s = server.client()
    # The ranks' own TCPStore clients counted themselves in (raw key "init/",
    # outside the "/" namespace) and the group exchanged its addresses here.
    assert s.num_keys() >= 3


def test_init_process_group_env_with_agent_store(server):
    _gloo_job(
        server.port,
        "env",
        extra_env={"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"},
    )
    # torch 2.15 gives every rank a plain TCPStore client of the agent's store
    # (older releases wrapped it in a PrefixStore "/worker/attempt_N"): the
    # process group's address exchange happened on our server.
    s = server.client()
    keys = s.list_keys()
    assert any(k.startswith("default_pg/") or "/worker/attempt_0/" in k for k in keys), keys
    # Both ranks also counted themselves in under torch's raw "init/" key,
    # which list_keys() hides (no "/" prefix) but num_keys() counts.
    assert s.num_keys() == len(keys) + 1


# --------------------------------------------------------------------------- vigil's Rust client


def test_rust_client_against_torchs_own_server(binaries):
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=td(30))
    r = subprocess.run(
        [binaries["check"], f"127.0.0.1:{master.port}"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "all operations ok" in r.stdout
    assert master.get("rust/from_rust") == b"hello torch"
    assert master.get("rust/n") == b"4"
    assert master.get("rust/bar") == b"2"


def test_rust_client_against_our_server(binaries, server):
    r = subprocess.run(
        [binaries["check"], f"127.0.0.1:{server.port}"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    s = server.client()
    assert s.get("rust/from_rust") == b"hello torch"
    assert s.get("rust/ap") == b"abcd"


# --------------------------------------------------------------------------- robustness


def _raw(port, payload):
    """Sends raw bytes; returns what the server answered before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(payload)
        data = b""
        while True:
            chunk = c.recv(4096)
            if not chunk:
                return data
            data += chunk


def test_malformed_input_drops_only_that_connection(server):
    s = server.client()
    s.set("keep", "1")
    validate = struct.pack("<BI", 0, 0x3C85F7CE)
    assert _raw(server.port, b"GET / HTTP/1.1\r\n\r\n") == b""
    assert _raw(server.port, struct.pack("<BI", 0, 0xDEADBEEF)) == b""
    # 0x7f: no opcode of torch or vigil (vigil's own are 0x60-0x66).
    assert _raw(server.port, validate + bytes([0x7F])) == b""
    assert _raw(server.port, validate + struct.pack("<BQ", 3, 2**63)) == b""
    # A valid ping before garbage is answered, then the connection is dropped.
    assert _raw(server.port, validate + struct.pack("<BI", 13, 1234) + b"\xff") == struct.pack("<I", 1234)
    assert server.alive()
    assert s.get("keep") == b"1"
    assert s.add("still", 1) == 1
    assert server.client().get("keep") == b"1"


def test_many_clients(server):
    clients = [server.client() for _ in range(64)]
    for i, c in enumerate(clients):
        c.add("total", i)
    assert clients[0].get("total") == str(sum(range(64))).encode()


def test_sigterm_stops_the_server_and_frees_the_port(binaries):
    s = Server(binaries["server"])
    s.client().set("k", "v")
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=10) == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", s.port))


def test_stdin_eof_stops_the_server(binaries):
    s = Server(binaries["server"])
    assert s.stop() == 0


def test_bad_arguments_exit_2(binaries):
    r = subprocess.run([binaries["server"], "--port", "nope"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2
    assert "bad --port" in r.stderr

"""vigil's store under attack (fault-findings 8 and the attacks of the hardening issue).

Found by attack: the store listened on every address with no authentication, let any client list
and write the agents' `/vigil/` control keys, and kept 4 x 200 MB values (1 GB RSS, 0.8 GB after
the client left). Every test runs the real binary with real ranks and talks to its store over
real sockets, with the c10d TCPStore protocol as torch's client speaks it.
"""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from harness import base_env, events, pid_alive, run_vigil, start_vigil, wait_for, write  # noqa: E402
from test_multinode import Nodes, free_port, markers, of  # noqa: E402

SECRET = "test-secret-0123456789abcdef"

# Every rank records its pid and environment, then works until the test releases it.
WORKER = """
import json, os, pathlib, time
out = pathlib.Path(os.environ["OUT_DIR"])
rank = os.environ["RANK"]
json.dump(dict(os.environ), open(out / f"env_{rank}.json", "w"))
(out / f"tmp_{rank}").write_text(str(os.getpid()))
os.rename(out / f"tmp_{rank}", out / f"ran_{rank}")
while not (out / "release").exists():
    time.sleep(0.05)
"""


class Raw:
    """A TCPStore client speaking the bytes torch's client sends (VALIDATE first)."""

    def __init__(self, addr, validate=True):
        self.s = socket.create_connection(addr, timeout=30)
        if validate:
            self.s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE))

    @staticmethod
    def b(x):
        return struct.pack("<Q", len(x)) + x

    def send(self, data):
        self.s.sendall(data)

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def set(self, k, v):
        self.send(b"\x01" + self.b(k) + self.b(v))

    def ping(self):
        self.send(b"\x0d" + struct.pack("<I", 0x1234))
        assert struct.unpack("<I", self.recv_exact(4))[0] == 0x1234

    def get(self, k):
        self.send(b"\x03" + self.b(k))
        (n,) = struct.unpack("<Q", self.recv_exact(8))
        return self.recv_exact(n)

    def delete(self, k):
        self.send(b"\x08" + self.b(k))
        return struct.unpack("<q", self.recv_exact(8))[0]

    def list_keys(self):
        self.send(b"\x11")
        (n,) = struct.unpack("<q", self.recv_exact(8))
        keys = []
        for _ in range(n):
            (m,) = struct.unpack("<Q", self.recv_exact(8))
            keys.append(self.recv_exact(m))
        return keys

    def closed(self):
        """True once the server has closed this connection (EOF or reset) within 30 s."""
        try:
            while True:
                if not self.s.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self):
        self.s.close()


def store_addr(log_dir):
    def addr():
        try:
            ev = events(log_dir)
        except (ValueError, FileNotFoundError):
            return None
        n = of(ev, "nodes")
        return n and n[0]["store"]

    host, port = wait_for(addr, timeout=60, what="the store's address in the event log").rsplit(":", 1)
    return host, int(port)


def listening(port):
    """Local addresses listening on `port` (from /proc/net/tcp and tcp6)."""
    found = []
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = open(name).read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            f = line.split()
            ip_hex, port_hex = f[1].split(":")
            if f[3] == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                if width == 8:
                    found.append(socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16))))
                else:
                    raw = bytes.fromhex(ip_hex)
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    found.append(socket.inet_ntop(socket.AF_INET6, raw))
    return found


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def local_ipv4():
    """A non-loopback IPv4 address of this machine, or None."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for a in out.split():
        if "." in a and not a.startswith("127."):
            return a
    return None


def one_node(job, extra=(), env=None):
    write(job / "worker.py", WORKER)
    p = start_vigil(["run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"), *extra, "worker.py"],
                    cwd=job, env=base_env(OUT_DIR=job, **(env or {})))
    wait_for(lambda: markers(job, "ran_"), timeout=60, what="the rank running")
    return p


def finish(p, job, timeout=60):
    (job / "release").write_text("")
    out, err = p.communicate(timeout=timeout)
    return p.returncode, err


def test_one_node_store_listens_on_loopback_only(job):
    ip = local_ipv4()
    extra = ["--master-addr", ip] if ip else []
    p = one_node(job, extra)
    try:
        host, port = store_addr(job / "logs")
        assert listening(port) == ["127.0.0.1"], listening(port)
        env = json.loads((job / "env_0.json").read_text())
        # The rank is told its node's door, on loopback only, which answers c10d.
        door = int(env["MASTER_PORT"])
        assert env["MASTER_ADDR"] == "127.0.0.1" and door != port, (env["MASTER_PORT"], port)
        assert listening(door) == ["127.0.0.1"], listening(door)
        Raw(("127.0.0.1", door)).ping()
        rc, err = finish(p, job)
        assert rc == 0, err
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_several_nodes_store_listens_on_master_addr_only(job):
    write(job / "worker.py", WORKER)
    nodes = Nodes(job, 2, ["worker.py"], nproc=1, env={"VIGIL_STORE_SECRET": SECRET})
    try:
        wait_for(lambda: len(markers(job, "ran_")) == 2, timeout=60, what="both ranks running")
        assert listening(nodes.port) == ["127.0.0.1"], listening(nodes.port)
        (job / "release").write_text("")
        res = nodes.wait()
        assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    finally:
        nodes.kill()


def door_addr(job, rank=0):
    """Where rank `rank`'s torch client reaches the store: its node's door (MASTER_ADDR, MASTER_PORT)."""
    env = json.loads(wait_for(lambda: (job / f"env_{rank}.json").exists() and (job / f"env_{rank}.json").read_text(),
                              timeout=60, what="the rank's environment"))
    return env["MASTER_ADDR"], int(env["MASTER_PORT"])


def test_control_keys_are_closed_to_clients_without_the_secret(job):
    """One node (a secret of its own): a client that did not prove the secret is closed at its
    first request; a rank's connection (through the door) uses its own keys and never vigil's."""
    p = one_node(job)
    try:
        c = Raw(store_addr(job / "logs"))
        c.set(b"/mine", b"1")
        assert c.closed(), "a request before the proof closes the connection"
        r = Raw(door_addr(job))
        r.set(b"/mine", b"1")
        keys = r.list_keys()
        assert b"/mine" in keys and not [k for k in keys if k.startswith(b"/vigil/")], keys
        r.set(b"/vigil/c0/end", b'{"lost":{"reason":"forged"}}')
        assert r.closed(), "a forged control key closes the rank's connection"
        r2 = Raw(door_addr(job))
        assert r2.get(b"/mine") == b"1", "other clients go on"
        rc, err = finish(p, job)
        assert rc == 0, err
        # The first closing is on the console (one line per 10 s at most).
        assert "before the connection proved the job's secret" in err, err
        assert not of(events(job / "logs"), "cycle_ended", end="lost")
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_secret_never_reaches_the_ranks(job):
    write(job / "worker.py", WORKER)
    nodes = Nodes(job, 2, ["worker.py"], nproc=1, env={"VIGIL_STORE_SECRET": SECRET})
    try:
        wait_for(lambda: len(markers(job, "ran_")) == 2, timeout=60, what="both ranks running")
        c = Raw(door_addr(job, 1))
        assert not [k for k in c.list_keys() if k.startswith(b"/vigil/")]
        (job / "release").write_text("")
        res = nodes.wait()
        assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
        for r in range(2):
            env = json.loads((job / f"env_{r}.json").read_text())
            assert "VIGIL_STORE_SECRET" not in env
            assert SECRET not in json.dumps(env)
    finally:
        nodes.kill()


def test_a_short_secret_is_refused_up_front(job):
    write(job / "ok.py", "")
    r = run_vigil(["run", "--nproc-per-node", "1", "--log-dir", str(job / "logs"), "ok.py"], cwd=job,
                  env=base_env(VIGIL_STORE_SECRET="short"))
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "VIGIL_STORE_SECRET" in lines[0] and "openssl rand" in lines[0], r.stderr
    assert "panicked" not in r.stderr


def test_a_node_with_another_secret_is_refused_clearly(job):
    write(job / "worker.py", WORKER)
    nodes = Nodes(job, 2, ["worker.py"], nproc=1, extra=["--join-timeout", "20"],
                  per_node=lambda i: [], env={"VIGIL_STORE_SECRET": SECRET})
    try:
        # A third agent with a wrong secret, claiming a node rank: refused before it claims anything.
        (job / "intruder" / "logs").mkdir(parents=True)
        r = run_vigil(["run", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                       "--master-port", str(nodes.port), "--nproc-per-node", "1",
                       "--log-dir", str(job / "intruder" / "logs"), "worker.py"],
                      cwd=job, env=base_env(OUT_DIR=job / "intruder", VIGIL_STORE_SECRET="wrong-secret-0123456789"),
                      timeout=60)
        assert r.returncode == 2, r.stderr
        assert "refused this agent's secret" in r.stderr and "VIGIL_STORE_SECRET" in r.stderr, r.stderr
        wait_for(lambda: len(markers(job, "ran_")) == 2, timeout=60, what="both ranks running")
        (job / "release").write_text("")
        res = nodes.wait()
        assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    finally:
        nodes.kill()


def test_values_and_total_are_bounded_and_memory_comes_back(job):
    p = one_node(job)
    try:
        addr = door_addr(job)
        base = rss_mb(p.pid)
        # Four 200 MB values: each refused before it is buffered.
        for _ in range(4):
            c = Raw(addr)
            try:
                c.set(b"/huge", b"\0" * (200 << 20))
            except (BrokenPipeError, ConnectionResetError):
                pass
            assert c.closed()
        assert rss_mb(p.pid) < base + 64, (base, rss_mb(p.pid))
        # 15 MiB values until the store is full (256 MiB in all): the one over is refused.
        c = Raw(addr)
        stored = 0
        try:
            for i in range(40):
                c.set(b"/v%d" % i, bytes([i]) * (15 << 20))
                c.ping()
                stored += 1
        except (BrokenPipeError, ConnectionResetError, ConnectionError):
            pass
        assert 10 <= stored <= 17, stored
        peak = rss_mb(p.pid)
        assert peak < base + 400, (base, peak)
        # The values are deleted: the memory goes back to the system.
        d = Raw(addr)
        assert d.get(b"/v0") == bytes([0]) * (15 << 20)
        for i in range(stored):
            assert d.delete(b"/v%d" % i) == 1
        d.close()
        wait_for(lambda: rss_mb(p.pid) < base + 64, timeout=30,
                 what=f"RSS back near {base:.0f} MB (peak {peak:.0f} MB)")
        rc, err = finish(p, job)
        assert rc == 0, err
        assert "value of 209715200 bytes exceeds the limit" in err, err
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_attacks_on_the_store_leave_the_job_unaffected(job):
    write(job / "worker.py", WORKER)
    nodes = Nodes(job, 2, ["worker.py"], extra=["--node-timeout", "5"], env={"VIGIL_STORE_SECRET": SECRET})
    held = []
    try:
        wait_for(lambda: len(markers(job, "ran_")) == 4, timeout=60, what="all four ranks running")
        addr = ("127.0.0.1", nodes.port)
        # Garbage, a request before VALIDATE, and a 2^63 length prefix: each closes only its connection.
        for data in (os.urandom(4096), b"\x03" + struct.pack("<Q", 1) + b"k",
                     b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x01" + struct.pack("<Q", 1 << 63)):
            c = Raw(addr, validate=False)
            c.send(data)
            assert c.closed()
        # A thousand idle connections, half of them validated, held while the job goes on.
        for i in range(1000):
            held.append(Raw(addr, validate=i % 2 == 0))
        # A third agent claiming a taken node rank, with the job's own secret: refused.
        (job / "third" / "logs").mkdir(parents=True)
        r = run_vigil(["run", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                       "--master-port", str(nodes.port), "--nproc-per-node", "2",
                       "--log-dir", str(job / "third" / "logs"), "worker.py"],
                      cwd=job, env=base_env(OUT_DIR=job / "third", VIGIL_STORE_SECRET=SECRET), timeout=60)
        assert r.returncode != 0 and "node rank 1 is already taken" in r.stderr, r.stderr
        # The job's agents still answer each other: nothing ended.
        assert [p.poll() for p in nodes.procs] == [None, None]
        (job / "release").write_text("")
        res = nodes.wait()
        assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
        for i in range(2):
            ev = nodes.events(i)
            assert [e["cycle"] for e in of(ev, "cycle_start")] == [0]
            assert of(ev, "cycle_ended", cycle=0, end="done")
            assert ev[-1]["outcome"] == "succeeded"
    finally:
        for c in held:
            c.close()
        nodes.kill()


def test_several_nodes_without_a_secret_share_one_through_the_state_directory(job):
    """No VIGIL_STORE_SECRET, a --state-dir both nodes see: node rank 0 writes store.secret (0600) and
    both agents prove it; a plain client is still kept out of the control keys."""
    import stat
    write(job / "worker.py", WORKER)
    state = job / "state"
    nodes = Nodes(job, 2, ["worker.py"], nproc=1, extra=["--state-dir", str(state)])
    try:
        wait_for(lambda: len(markers(job, "ran_")) == 2, timeout=60, what="both ranks running")
        secret = state / "store.secret"
        assert secret.is_file() and stat.S_IMODE(secret.stat().st_mode) == 0o600, oct(secret.stat().st_mode)
        assert len(secret.read_text().strip()) >= 32
        c = Raw(("127.0.0.1", nodes.port))
        c.set(b"/vigil/c0/end", b'{"lost":{"reason":"forged"}}')
        assert c.closed(), "a forged control key closes the connection"
        (job / "release").write_text("")
        res = nodes.wait()
        assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
        assert not any("is not set" in e for _, _, e in res), [e for _, _, e in res]
        for r in range(2):
            assert "VIGIL_STORE_SECRET" not in json.loads((job / f"env_{r}.json").read_text())
    finally:
        nodes.kill()


def test_a_node_that_cannot_read_the_state_directorys_secret_names_the_fix(job):
    write(job / "worker.py", WORKER)
    nodes = Nodes(job, 2, ["worker.py"], nproc=1, extra=["--join-timeout", "3"],
                  per_node=lambda i: ["--state-dir", str(job / f"state{i}")])
    try:
        rc = nodes.procs[1].wait(timeout=60)
        err = nodes.procs[1].stderr.read()
        assert rc == 2, err
        lines = [l for l in err.splitlines() if "error" in l]
        assert len(lines) == 1, err
        assert str(job / "state1" / "store.secret") in lines[0], err
        assert "--state-dir they share" in lines[0] and "VIGIL_STORE_SECRET=$(openssl rand -hex 32)" in lines[0], err
    finally:
        nodes.kill()

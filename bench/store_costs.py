#!/usr/bin/env python3
"""Per-request costs of the real store, for the scale simulation (bench/scale_sim.py).

Starts the real `vigil-store-server` (one thread, as node rank 0's agent hosts it) and drives it
over real TCP from this process with a small stdlib client of the store's wire protocol
(store/src/protocol.rs). What it measures is the server's CPU time (the scheduler's nanosecond count of its threads,
/proc/PID/task/*/schedstat, so other load on the machine inflates wall time but not this), divided by the number
of requests: the store's service time per request kind, and per byte for values. Every client
keeps one request in flight per connection, as vigil's agents do, over `--conns` connections.

    cargo build --release -p vigil-store --bin vigil-store-server
    python3 bench/store_costs.py [--server target/release/vigil-store-server] [--json out.json]

Prints a table (microseconds of server CPU per request) and, with --json, the same numbers as the
calibration file bench/scale_sim.py reads (`--costs`).

PROTOCOL 3's requests are measured when the server knows them: RENEW (0x62, one-way) and SWEEP
(0x63) on main's server, tagged mode (0x64: a `u32` tag before each request, replies framed
`u32 tag, u64 len, bytes`) and WAIT_GET (0x65) where the server has them. A server that closes
the connection on one of these opcodes gets a one-line note and those costs are left out of the
JSON; bench/scale_sim.py then stands in the file's own GET and wake-up costs for them and says so.
"""

import argparse
import json
import os
import selectors
import socket
import struct
import subprocess
import sys
import time

MAGIC = 0x3C85F7CE
OP = {
    "validate": 0, "set": 1, "compare_set": 2, "get": 3, "add": 4, "check": 5, "wait": 6,
    "multi_get": 10, "cancel_wait": 12, "ping": 13, "auth_challenge": 0x60, "renew": 0x62,
    "sweep": 0x63, "tagged": 0x64, "wait_get": 0x65,
}


def b(x: bytes) -> bytes:
    return struct.pack("<Q", len(x)) + x


def key(k: str) -> bytes:
    # StoreClient and torch's client put "/" in front of the user's key.
    return b(b"/" + k.encode())


def req_set(k, v):
    return bytes([OP["set"]]) + key(k) + b(v)


def req_get(k):
    return bytes([OP["get"]]) + key(k)


def req_add(k, d):
    return bytes([OP["add"]]) + key(k) + struct.pack("<q", d)


def req_wait(ks):
    return bytes([OP["wait"]]) + struct.pack("<Q", len(ks)) + b"".join(key(k) for k in ks)


def req_multi_get(ks):
    return bytes([OP["multi_get"]]) + struct.pack("<Q", len(ks)) + b"".join(key(k) for k in ks)


def req_cas(k, expected, desired):
    return bytes([OP["compare_set"]]) + key(k) + b(expected) + b(desired)


def req_renew(k):
    return bytes([OP["renew"]]) + key(k)


def req_sweep(prefix):
    return bytes([OP["sweep"]]) + key(prefix)


def tagged(tag: int, inner: bytes) -> bytes:
    """PROTOCOL 3's framing: TAGGED, a u32 tag, then one ordinary request."""
    return bytes([OP["tagged"]]) + struct.pack("<I", tag) + inner


def req_wait_get(k):
    # One key, counted like WAIT's (always 1).
    return bytes([OP["wait_get"]]) + struct.pack("<Q", 1) + key(k)


def cpu_s(pid: int) -> float:
    """Seconds on a CPU of every thread of `pid` (the scheduler's nanosecond count)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass
    return total / 1e9


class Conn:
    """A blocking socket with exact reads; one request in flight."""

    def __init__(self, addr):
        self.s = socket.create_connection(addr)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The agent's handshake: VALIDATE, PING (echoed nonce), AUTH_CHALLENGE.
        self.s.sendall(bytes([OP["validate"]]) + struct.pack("<I", MAGIC)
                       + bytes([OP["ping"]]) + struct.pack("<I", 7))
        assert struct.unpack("<I", self.exact(4))[0] == 7, "ping answered another nonce"
        self.s.sendall(bytes([OP["auth_challenge"]]))
        self.exact(33)

    def exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.s.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the store closed the connection")
            out += chunk
        return bytes(out)

    def value(self) -> bytes:
        (n,) = struct.unpack("<Q", self.exact(8))
        return self.exact(n)

    def frame(self) -> bytes:
        """One tagged reply: u32 tag, u64 length, the inner reply's bytes."""
        self.exact(4)
        (n,) = struct.unpack("<Q", self.exact(8))
        return self.exact(n)


def knows(addr, request: bytes, reader) -> bool:
    """Whether the server serves `request` (sent on a fresh connection after the handshake) with
    the reply `reader` expects, rather than closing the connection on an unknown opcode."""
    c = Conn(addr)
    c.s.settimeout(5)
    try:
        c.s.sendall(request)
        reader(c)
        return True
    except (ConnectionError, socket.timeout, struct.error):
        return False
    finally:
        c.s.close()


def reply_reader(kind: str, nkeys: int = 1):
    """How many bytes the reply of `kind` has, read from the socket as it comes."""
    def read(c: Conn):
        if kind in ("add",):
            c.exact(8)
        elif kind in ("wait", "check"):
            c.exact(1)
        elif kind in ("get", "compare_set"):
            c.value()
        elif kind == "multi_get":
            for _ in range(nkeys):
                c.value()
        elif kind == "set":
            pass
        elif kind == "frame":
            c.frame()
        elif kind == "sweep":
            (n,) = struct.unpack("<q", c.exact(8))
            for _ in range(n):
                c.value()
    return read


def burst(conns, make_req, kind, per_conn, nkeys=1):
    """Each connection sends `per_conn` requests one after another (request, reply, next); all
    connections at once. `set` has no reply: it is sent together with an ADD whose cost is
    measured separately and subtracted by the caller."""
    read = reply_reader(kind, nkeys)
    sel = selectors.DefaultSelector()
    left = {}
    for i, c in enumerate(conns):
        c.s.sendall(make_req(i, 0))
        left[c] = per_conn - 1
        sel.register(c.s, selectors.EVENT_READ, (i, c))
    done = 0
    while done < len(conns):
        for k, _ in sel.select():
            i, c = k.data
            read(c)
            if left[c] == 0:
                sel.unregister(c.s)
                done += 1
                continue
            j = per_conn - left[c]
            left[c] -= 1
            c.s.sendall(make_req(i, j))
    sel.close()


def measure(pid, conns, make_req, kind, per_conn, nkeys=1, reps=3):
    """Median server CPU microseconds per request over `reps` bursts."""
    samples = []
    for _ in range(reps):
        t0 = cpu_s(pid)
        burst(conns, make_req, kind, per_conn, nkeys)
        samples.append((cpu_s(pid) - t0) / (len(conns) * per_conn) * 1e6)
    samples.sort()
    return samples[len(samples) // 2]


def measure_diff(pid, a, b, per_conn, reps=5):
    """Median over `reps` rounds of (cost of `a`) - (cost of `b`), the two measured one after the
    other in each round, so that a change in the machine's load falls on both; `a` and `b` are
    (conns, make_req, kind). What one request of `a` costs beyond one of `b`."""
    diffs = []
    for _ in range(reps):
        diffs.append(measure(pid, *a, per_conn, reps=1) - measure(pid, *b, per_conn, reps=1))
    return sorted(diffs)[len(diffs) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="target/release/vigil-store-server")
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--ops", type=int, default=40000, help="requests per measurement")
    ap.add_argument("--runs", type=int, default=1, help="measure everything this many times, "
                    "each against a new server, and keep each cost's median")
    ap.add_argument("--json", help="write the costs here for bench/scale_sim.py --costs")
    a = ap.parse_args()
    if not os.path.exists(a.server):
        sys.exit(f"no {a.server}: build it first (cargo build --release -p vigil-store "
                 "--bin vigil-store-server) or name it with --server")
    if a.runs < 1:
        sys.exit("--runs takes a count of 1 or more (--runs 5)")
    runs = []
    for _ in range(a.runs):
        p = subprocess.Popen([a.server, "--host", "127.0.0.1", "--port", "0", "--threads", "1"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            line = p.stdout.readline()
            host, port = line.strip().rsplit(" ", 1)[1].rsplit(":", 1)
            addr = (host, int(port))
            runs.append(run(p.pid, addr, a))
        finally:
            p.terminate()
            p.wait()
    out = {k: sorted(r[k] for r in runs)[len(runs) // 2] if k != "meta" else v
           for k, v in runs[0].items()}
    out["meta"]["runs"] = a.runs
    for note in out["meta"]["skipped"]:
        print(f"note: not measured: {note}", file=sys.stderr)
    print("| request | server CPU |")
    print("|---|---|")
    for k, v in out.items():
        if k.startswith("per_byte"):
            print(f"| {k} | {v * 1e3:.3f} ns per byte |")
        elif isinstance(v, (int, float)):
            print(f"| {k} | {v:.2f} us per request |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


def run(pid, addr, a):
    out = {}
    # Connect + handshake (accept, VALIDATE, PING, AUTH_CHALLENGE), and closing.
    t0 = cpu_s(pid)
    n_conn = 1000
    cs = [Conn(addr) for _ in range(n_conn)]
    out["connect"] = (cpu_s(pid) - t0) / n_conn * 1e6
    t0 = cpu_s(pid)
    for c in cs:
        c.s.close()
    time.sleep(0.3)
    out["close"] = (cpu_s(pid) - t0) / n_conn * 1e6

    conns = [Conn(addr) for _ in range(a.conns)]
    per = max(1, a.ops // a.conns)
    info = b'{"nproc":8,"host":"node-00123","pid":123456}'
    conns[0].s.sendall(req_set("vigil/c0/go", b"x"))
    out["add"] = measure(pid, conns, lambda i, j: req_add("vigil/c0/joined", 1), "add", per)
    out["add_own_key"] = measure(pid, conns, lambda i, j: req_add(f"vigil/alive/{i}", 1), "add", per)
    both = measure(pid, conns, lambda i, j: req_set(f"vigil/c0/join/{i}", info)
                   + req_add("vigil/c0/joined", 1), "add", per)
    out["set"] = max(0.0, both - out["add"])
    out["wait_ready"] = measure(pid, conns, lambda i, j: req_wait(["vigil/c0/go"]), "wait", per)
    # GET and COMPARE_SET against the value's size: the per-byte cost is the slope.
    sizes = [16, 4096, 65536]
    gets = {}
    for s in sizes:
        conns[0].s.sendall(req_set("vigil/v", b"x" * s))
        gets[s] = measure(pid, conns, lambda i, j: req_get("vigil/v"), "get",
                          max(1, min(per, 4_000_000 // (s * a.conns) + 1)))
    out["get"] = gets[sizes[0]]
    for sz, v in gets.items():
        out[f"get_{sz}B"] = v
    out["per_byte_out"] = (gets[sizes[-1]] - gets[sizes[0]]) / (sizes[-1] - sizes[0])
    cas = {}
    for s in [16, 65536]:
        v = b"y" * s
        cas[s] = measure(pid, conns[:8], lambda i, j: req_cas(f"vigil/cas/{i}/{j}", b"", v),
                         "compare_set", max(1, min(per, 2_000_000 // (s * 8) + 1)))
    out["compare_set"] = cas[16]
    out["compare_set_65536B"] = cas[65536]
    # A value in and out: the slope minus what the way out costs is the way in.
    out["per_byte_in"] = max(0.0, (cas[65536] - cas[16]) / (65536 - 16) - out["per_byte_out"])
    # MULTI_GET of every node's join record: per key.
    for n in (1024, 4096):
        for i in range(n):
            conns[0].s.sendall(req_set(f"vigil/c9/join/{i}", info))
        ks = [f"vigil/c9/join/{i}" for i in range(n)]
        r = req_multi_get(ks)
        out[f"multi_get_{n}_per_key"] = measure(pid, conns[:1], lambda i, j: r, "multi_get",
                                               20, nkeys=n) / n
    out["multi_get_per_key"] = out["multi_get_4096_per_key"]
    # Wake-ups: P connections parked in WAIT on one key, one SET releases all of them.
    P = 1000
    parked = [Conn(addr) for _ in range(P)]
    wake = []
    for r in range(3):
        k = f"vigil/wake/{r}"
        for c in parked:
            c.s.sendall(req_wait([k]))
        time.sleep(0.3)
        t0 = cpu_s(pid)
        conns[0].s.sendall(req_set(k, b""))
        for c in parked:
            c.exact(1)
        wake.append((cpu_s(pid) - t0) / P * 1e6)
    # The parking itself (the WAIT that does not return) is about the cost of one that does.
    out["wake"] = sorted(wake)[1]
    skipped = protocol3(pid, addr, a, conns, parked, per, out)
    # The same ADD with 4,096 more idle connections and 8,192 more keys: does N matter?
    idle = [Conn(addr) for _ in range(3096)]
    out["add_with_4096_conns"] = measure(pid, conns, lambda i, j: req_add("vigil/c0/joined", 1),
                                         "add", per)
    for c in idle + parked + conns:
        c.s.close()
    out["meta"] = {"conns": a.conns, "ops": a.ops, "server": a.server,
                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "skipped": skipped}
    return out


def protocol3(pid, addr, a, conns, parked, per, out):
    """PROTOCOL 3's requests (RENEW, SWEEP, tagged mode, WAIT_GET), each kind only where the
    server knows it. Returns the notes for the kinds it left out."""
    skipped = []
    if knows(addr, req_renew("vigil/probe") + req_add("vigil/probe", 0), reply_reader("add")):
        # The liveness period's pair, as an agent sends it: RENEW its counter (one-way) and read
        # node rank 0's (ADD 0), one packet; the ADD's cost is subtracted, as for SET.
        out["renew"] = measure_diff(
            pid, (conns, lambda i, j: req_renew(f"vigil/alive/{i}") + req_add("vigil/alive/0", 0),
                  "add"), (conns, lambda i, j: req_add("vigil/alive/0", 0), "add"), per)
        # The way the brief's "batch" reads it: many RENEWs in one packet and one ADD to be sure
        # they were served. Cheaper (one read for many); for reference, the simulation uses the
        # pair above.
        k = 200
        batch = b"".join(req_renew(f"vigil/alive/{i}") for i in range(k))
        both = measure(pid, conns, lambda i, j: batch + req_add("vigil/alive/0", 0), "add",
                       max(1, per // k))
        out["renew_batched"] = max(0.0, (both - out["add"]) / k)
        # SWEEP of a prefix nothing was renewed under (the request alone), then of N renewed
        # counters (every one renewed again before each sweep, so none is stale: the reply is
        # empty and what is left is the scan).
        out["sweep"] = measure(pid, conns, lambda i, j: req_sweep(f"vigil/none/{i}/"), "sweep",
                               per)
        c = conns[0]
        for n in (4096, 10000):
            renew_all = b"".join(req_renew(f"vigil/s{n}/{i}") for i in range(n))
            samples = []
            for _ in range(5):
                c.s.sendall(renew_all + req_add("vigil/sync", 0))
                c.exact(8)
                t0 = cpu_s(pid)
                c.s.sendall(req_sweep(f"vigil/s{n}/"))
                (stale,) = struct.unpack("<q", c.exact(8))
                assert stale == 0, f"{stale} counters stale right after renewing them all"
                samples.append((cpu_s(pid) - t0) * 1e6)
            out[f"sweep_{n}_per_key"] = max(0.0, (sorted(samples)[2] - out["sweep"]) / n)
        out["sweep_per_key"] = out["sweep_10000_per_key"]
    else:
        skipped.append("RENEW (0x62) and SWEEP (0x63): the server closed the connection")
    probe = tagged(1, req_get("vigil/v"))
    if knows(addr, probe, reply_reader("frame")):
        # A tagged GET next to the untagged one above (the same 16-byte value): the framing.
        conns[0].s.sendall(req_set("vigil/v", b"x" * 16))
        tagged_conns = [Conn(addr) for _ in range(a.conns)]
        out["get_tagged"] = measure(pid, tagged_conns, lambda i, j: tagged(i, req_get("vigil/v")),
                                    "frame", per)
        # The framing alone: tagged and untagged GETs measured in turns (the untagged on
        # connections of their own: a tagged connection takes no untagged request).
        out["tagged"] = measure_diff(
            pid, (tagged_conns, lambda i, j: tagged(i, req_get("vigil/v")), "frame"),
            (conns, lambda i, j: req_get("vigil/v"), "get"), per)
        out["add_tagged"] = measure(pid, tagged_conns,
                                    lambda i, j: tagged(i, req_add("vigil/c0/joined", 1)),
                                    "frame", per)
        # Tagged SET and ADD as an agent sends them in PROTOCOL 3, each a round trip of its own
        # (a tagged SET is answered with an empty frame; untagged, it rode with the ADD).
        out["set_tagged"] = measure(pid, tagged_conns, lambda i, j: tagged(
            i, req_set(f"vigil/c0/join/{i}", b'{"nproc":8,"host":"node-00123","pid":123456}')),
            "frame", per)
        # WAIT_GET of a key that exists: answered at once with its value.
        out["wait_get"] = measure(pid, tagged_conns,
                                  lambda i, j: tagged(i, req_wait_get("vigil/v")), "frame", per)
        # A WAIT_GET that parks (the key is absent) and its CANCEL_WAIT, one packet; answered by
        # the cancel's frame alone. The cancel is what is left after the parking, which costs
        # about what an answered WAIT_GET does.
        out["park_cancel"] = measure(pid, tagged_conns, lambda i, j: tagged(
            7, req_wait_get(f"vigil/absent/{i}")) + tagged(7, bytes([OP["cancel_wait"]])),
            "frame", per)
        out["cancel_wait"] = max(0.0, out["park_cancel"] - out["wait_get"])
        # Wake-ups with the value pushed: P connections parked in WAIT_GET on one key, one SET of
        # a verdict-sized value (90 bytes) answers all of them.
        verdict = b"v" * 90
        wake = []
        for r in range(3):
            k = f"vigil/wakeget/{r}"
            for i, c in enumerate(parked):
                c.s.sendall(tagged(i, req_wait_get(k)))
            time.sleep(0.3)
            t0 = cpu_s(pid)
            conns[0].s.sendall(req_set(k, verdict))
            for c in parked:
                c.frame()
            wake.append((cpu_s(pid) - t0) / len(parked) * 1e6)
        out["wake_get"] = sorted(wake)[1]
        for c in tagged_conns:
            c.s.close()
    else:
        skipped.append("tagged mode (0x64) and WAIT_GET (0x65): the server closed the "
                       "connection (built before them); bench/scale_sim.py stands in GET and "
                       "wake-up costs")
    return skipped


if __name__ == "__main__":
    main()

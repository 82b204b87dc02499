#!/usr/bin/env python3
"""SIMULATED: vigil's rendezvous at 1,024 to 100,000 nodes, as a discrete-event simulation.

Nothing here runs vigil. The store on node rank 0 is a queue served by its threads (one, as the
agent hosts it), each request costing the store CPU that bench/store_costs.py measured on the real
`vigil-store-server` (--costs, a JSON file it wrote; built-in defaults are one such measurement);
agents are sources of requests, a network latency away, that follow the protocol step by step
(docs/scale-model.md lists the steps and what each moves), and node rank 0 makes its decisions
(the assignment, the verdict) as in agent/src/job/rendezvous. Four protocols and a what-if:

* `now`: PROTOCOL 1: three connections per agent and a new one each attempt, a verdict with
  every node's rank offset (O(N) bytes) read by every agent with a WAIT, a WAIT and a GET, node
  rank 0 reading every liveness counter with its own ADD.
* `v2`: PROTOCOL 2, before: `now` with the verdict of O(1) bytes (ranks per slot, the standbys'
  slots as exceptions; wire.rs `WireGo`), every request and connection as in `now`.
* `v3`: the protocol as it is now (PROTOCOL 3): one long-lived connection per agent in the
  store's tagged mode (every request carries a tag, replies come back framed), WAIT_GET (parked
  until the key exists, answered with its value: pushed), the same joins, counts and verdict as
  `v2`, no connection per attempt; liveness by one-way RENEWs and node rank 0's one SWEEP; each
  agent's SET of its join record goes out in one packet with its ADD (`MuxClient::set_and_add`,
  both replies awaited together).
* `v3s`: `v3` with the SET awaited before the ADD is sent, as an agent of a job with hot spares
  joins (it reads the attempt's members between the two); not in the default table.
* `o1`: the proposal of issue 26 that goes further: one request per agent to join (its record
  and the count), the wake-ups registered once and pushed, no reply to a join.

For each N it prints join time (every agent asks to join attempt 0, optionally spread over
--join-spread, to the last one holding its assignment), failure to every node holding its next
assignment (node N-1 reports a failure to the last agent holding attempt 1's assignment; the
ranks' own stopping is left out, it is the same for every protocol), bytes the store sends and
receives per attempt, store CPU per attempt, and the store CPU and node rank 0's sweep per
liveness period.

    python3 bench/scale_sim.py [--costs costs.json] [--nodes 1024,10000,100000] [--protocol v2,v3]

--agent-threads K puts all agents on K shared threads with --client-us of CPU per reply (how
`cargo bench -p vigil --bench rendezvous` runs them on one machine); left out, every agent has a
machine of its own, as in a real job.
"""

import argparse
import collections
import heapq
import json
import math
import random
import sys
from dataclasses import dataclass, field

# Store CPU per request (microseconds) and per byte, measured by bench/store_costs.py on the real
# vigil-store-server (release build, one thread) on the 2-core development machine, 2026-11-26
# 18:03 UTC, load average 2-3 (python3 bench/store_costs.py --runs 5: 64 connections, 40,000
# requests a kind, median of 3 bursts, median of 5 runs each against a new server), the server
# a local merge of main's store (f5f6c80: RENEW, SWEEP) with the tagged mode of branch h-mux
# (4c343aa: TAGGED, WAIT_GET), every kind from the one measurement. (An earlier one, the same
# way on main's server before either: connect 25.25, close 16.66, add 3.21, set 1.97,
# wait_ready 2.51, get 2.89, compare_set 3.06, wake 5.57, multi_get_per_key 0.25; the same kinds
# measured 10-70% higher today on a busier machine, docs/benchmarks.md.)
DEFAULT_COSTS = {
    "connect": 27.74, "close": 11.04, "add": 4.78, "set": 0.43, "wait_ready": 4.81, "get": 5.07,
    "compare_set": 5.45, "wake": 5.72, "multi_get_per_key": 0.22, "per_byte_out": 0.000296,
    "per_byte_in": 0.0,
}
# PROTOCOL 3's requests, from the same measurement: RENEW one-way (sent with an ADD, whose cost
# is subtracted, as SET's), SWEEP's request and its scan per renewed counter, the tagged framing
# (a tagged GET less an untagged one, in turns), tagged SET and ADD each a round trip of its
# own, WAIT_GET answered at once, a parked WAIT_GET's push with a 90-byte value, a tagged
# CANCEL_WAIT (a parked WAIT_GET and its cancel in one packet, less an answered WAIT_GET).
PROTOCOL3_COSTS = {
    "renew": 0.73, "sweep": 4.87, "sweep_per_key": 0.06, "tagged": 0.05, "set_tagged": 5.61,
    "add_tagged": 6.47, "wait_get": 5.58, "wake_get": 6.12, "cancel_wait": 0.47,
}
DEFAULT_COSTS.update(PROTOCOL3_COSTS)
# What a costs file written before these were measured stands in for each: the nearest request
# the same file measured.
PROTOCOL3_STAND_INS = {
    "renew": "set", "sweep": "get", "sweep_per_key": "multi_get_per_key", "tagged": None,
    "set_tagged": "get", "add_tagged": "add", "wait_get": "get", "wake_get": "wake",
    "cancel_wait": "wait_ready",
}

# Key names as the store holds them ("/" + the agent's key, wire.rs `key`).
JOB_KEY = "/vigil/job"
NODE_INFO_LEN = len('{"nproc":8,"host":"node-00123","pid":123456}')
END_LEN = len('{"end":"failed","node":12345,"reason":"rank 3 exited with status 1 (signal)"}')
JOB_SHAPE_LEN = len('{"protocol":1,"job":"12345678","nnodes":10000,"active":10000,"nproc":8}')


def verdict_len(n: int, nproc: int = 8, cycle: int = 1, max_restarts: int = 3) -> int:
    """Bytes of `Verdict::Go` as serde_json writes it (wire.rs): every node's rank offset."""
    offsets = ",".join(str(i * nproc) for i in range(n))
    return len(f'{{"go":{{"cycle":{cycle},"world_size":{n * nproc},"offsets":[{offsets}],'
               f'"max_restarts":{max_restarts},"calculated":null}}}}')


def o1_verdict_len(n: int, nproc: int = 8, exceptions: int = 0) -> int:
    """The proposed verdict: world size, the uniform ranks per node, and the exceptions
    (node, offset) pairs, each at most 24 bytes."""
    base = len(f'{{"go":{{"cycle":1,"world_size":{n * nproc},"nproc":{nproc},"nodes":{n},'
               f'"except":[],"max_restarts":3,"calculated":null}}}}')
    return base + 24 * exceptions


def key_len(k: str) -> int:
    return len(k)


# Request and reply sizes on the wire (store/src/protocol.rs): one opcode byte, u64-length
# strings and values, i64 counters; SET has no reply, WAIT answers one byte.
def req_bytes(kind: str, key: str = "", value: int = 0, nkeys: int = 1, expected: int = 0) -> int:
    k = 8 + len(key)
    return {
        "set": 1 + k + 8 + value, "get": 1 + k, "add": 1 + k + 8, "check": 1 + 8 + nkeys * k,
        "wait": 1 + 8 + nkeys * k, "multi_get": 1 + 8 + nkeys * k,
        "compare_set": 1 + k + 8 + expected + 8 + value, "connect": 5 + 5 + 1,
        "renew": 1 + k + 8, "join": 1 + k + 8 + value,
        "wait_get": 1 + 8 + k, "cancel": 1, "sweep": 1 + k,
    }[kind]


def reply_bytes(kind: str, value: int = 0, nkeys: int = 1) -> int:
    return {
        "set": 0, "get": 8 + value, "add": 8, "check": 1, "wait": 1,
        "multi_get": nkeys * (8 + value), "compare_set": 8 + value, "connect": 4 + 33,
        "renew": 0, "join": 0, "push": 8 + value, "wait_get": 8 + value, "cancel": 1,
    }[kind]


# Tagged mode (PROTOCOL 3): TAGGED and a u32 tag before each request; every reply but a one-way
# request's is a frame, u32 tag and u64 length before the reply's bytes (an empty one for SET).
TAG_IN = 1 + 4
TAG_OUT = 4 + 8


PARKED = object()  # a WAIT the store holds: no reply until its key is set


@dataclass(order=True)
class Event:
    t: float
    seq: int
    fn: object = field(compare=False)


class Sim:
    """The event loop, the store (a FIFO queue served by `threads` servers) and the keys."""

    def __init__(self, costs, threads=1, latency=50e-6, jitter=0.0, nic_bps=None,
                 agent_threads=None, client_s=0.0, client_per_byte=0.0, seed=1):
        self.c = costs
        self.now = 0.0
        self.q = []
        self.seq = 0
        self.free_at = [0.0] * threads
        self.lat = latency
        self.jitter = jitter
        self.nic_bps = nic_bps
        self.nic_free = 0.0
        self.rng = random.Random(seed)
        self.keys = {}
        self.waiters = {}
        self.cpu = 0.0
        self.bytes_in = 0
        self.bytes_out = 0
        self.ops = 0
        self.kinds = collections.Counter()
        self.agent_threads = agent_threads
        self.host_free = [0.0] * (agent_threads or 0)
        self.client_s = client_s
        self.client_per_byte = client_per_byte
        self.client_cpu = 0.0
        self.replies = 0
        self.reply_bytes = 0

    def at(self, t, fn):
        self.seq += 1
        heapq.heappush(self.q, Event(t, self.seq, fn))

    def run(self):
        while self.q:
            e = heapq.heappop(self.q)
            self.now = e.t
            e.fn()

    def net(self):
        return self.lat + (self.rng.uniform(0, self.jitter) if self.jitter else 0.0)

    def cost(self, kind, b_in=0, b_out=0, nkeys=1):
        c = self.c
        us = {
            "set": c["set"], "get": c["get"], "add": c["add"], "wait": c["wait_ready"],
            "check": c["wait_ready"], "compare_set": c["compare_set"], "connect": c["connect"],
            "close": c["close"], "multi_get": c["multi_get_per_key"] * nkeys + c["get"],
            "wake": c["wake"], "park": c["wait_ready"], "renew": c["renew"],
            "join": c["add"], "push": c["wake"], "scan": c["multi_get_per_key"] * nkeys,
            "wait_get": c["wait_get"], "wake_get": c["wake_get"], "cancel": c["cancel_wait"],
            "set_tagged": c["set_tagged"], "add_tagged": c["add_tagged"],
        }[kind]
        return us * 1e-6 + b_in * c["per_byte_in"] * 1e-6 + b_out * c["per_byte_out"] * 1e-6

    def serve(self, arrive, service, done):
        """Queue a job arriving at `arrive` that takes `service` s of store CPU; `done(t)` runs
        when it is served."""
        def start():
            i = min(range(len(self.free_at)), key=self.free_at.__getitem__)
            t = max(self.now, self.free_at[i]) + service
            self.free_at[i] = t
            self.cpu += service
            self.at(t, lambda: done(t))
        self.at(arrive, start)

    def send_out(self, t, nbytes):
        """When `nbytes` leaving the store at `t` are through its network card."""
        self.bytes_out += nbytes
        if not self.nic_bps:
            return t
        self.nic_free = max(t, self.nic_free) + nbytes * 8 / self.nic_bps
        return self.nic_free

    def client(self, agent, t, nbytes):
        """When the agent has handled a reply of `nbytes` that reached it at `t`."""
        work = self.client_s + nbytes * self.client_per_byte
        self.client_cpu += work
        self.replies += 1
        self.reply_bytes += nbytes
        if not self.agent_threads:
            return t + work
        h = agent % self.agent_threads
        self.host_free[h] = max(t, self.host_free[h]) + work
        return self.host_free[h]

    def request(self, agent, kind, key="", value=0, nkeys=1, expected=0, reply_value=None,
                then=None, effect=None, t0=None, tagged=False, arrive=None, rides=False):
        """Agent sends one request at `t0` (default now); the store serves it (running `effect`,
        which may set keys, when served) and `then(t)` runs when the agent has the reply.
        `tagged`: in the store's tagged mode (PROTOCOL 3), framed both ways, a SET answered.
        `arrive`: when it reaches the store (requests sent together arrive together, in order).
        `rides`: a tagged SET sent in one packet with the next request, costing what a SET
        riding with an ADD was measured to cost (plus the framing), not a round trip's."""
        t0 = self.now if t0 is None else t0
        b_in = req_bytes(kind, key, value, nkeys, expected)
        self.ops += 1
        self.kinds[kind] += 1
        rv = value if reply_value is None else reply_value
        b_out = reply_bytes(kind, rv, nkeys) \
            if kind in ("get", "multi_get", "compare_set", "wait_get") else reply_bytes(kind)
        if tagged:
            b_in += TAG_IN
            b_out += TAG_OUT if kind != "renew" else 0
        self.bytes_in += b_in
        if tagged and rides:
            svc = self.cost(kind, b_in, b_out) + self.c["tagged"] * 1e-6
        elif tagged and kind in ("set", "add"):
            svc = self.cost(f"{kind}_tagged", b_in, b_out)
        else:
            svc = self.cost(kind, b_in, b_out, nkeys)
            # The framing, where the cost was measured untagged (WAIT_GET, CANCEL_WAIT and the
            # tagged SET and ADD were measured tagged; RENEW is one-way, its tag 5 bytes more).
            if tagged and kind not in ("wait_get", "cancel", "renew"):
                svc += self.c["tagged"] * 1e-6

        def done(t):
            res = effect() if effect else None
            if then is None or res is PARKED:
                return
            if b_out == 0 and kind in ("set", "renew", "join"):
                return
            arrive = self.send_out(t, b_out) + self.net()
            self.at(self.client(agent, arrive, b_out), lambda: then(self.now, res))
        self.serve(t0 + self.net() if arrive is None else arrive, svc, done)

    def setkey(self, k, v):
        """A key is created: every connection parked on it is woken (store CPU each)."""
        self.keys[k] = v
        for agent, kind, b_out, cb in self.waiters.pop(k, []):
            self.ops += 1
            self.kinds[kind] += 1
            svc = self.cost(kind, 0, b_out)

            def woke(t, agent=agent, cb=cb, b_out=b_out):
                arrive = self.send_out(t, b_out) + self.net()
                self.at(self.client(agent, arrive, b_out), lambda: cb(self.now))
            self.serve(self.now, svc, woke)

    def park(self, agent, k, then, push_value=None):
        """WAIT on `k` (now: a WAIT request; o1: registered once, pushed with its value)."""
        if push_value is None:
            def parked():
                if k in self.keys:
                    return None
                self.wait_on(k, agent, "wake", then)
                return PARKED
            self.request(agent, "wait", k, then=lambda t, _: then(t), effect=parked)
        else:
            if k in self.keys:
                self.at(self.now, lambda: then(self.now))
            else:
                self.wait_on(k, agent, "push", then, push_value)

    def wait_on(self, k, agent, kind, then, vlen=0):
        """Parks `agent` on `k`; when `k` is set the store answers it (`kind`: "wake", the one
        byte of a WAIT; "push", o1's value; "wake_get", a tagged WAIT_GET's value) and `then(t)`
        runs when the agent has it."""
        b_out = {"wake": 1, "push": reply_bytes("push", vlen),
                 "wake_get": TAG_OUT + reply_bytes("wait_get", vlen)}[kind]
        self.waiters.setdefault(k, []).append((agent, kind, b_out, then))

    def wait_get(self, agent, k, vlen, then):
        """PROTOCOL 3's WAIT_GET on the agent's one connection: answered at once with the value
        when `k` exists, else parked under its tag and pushed with the value when `k` is set."""
        def parked():
            if k in self.keys:
                return None
            self.wait_on(k, agent, "wake_get", then, vlen)
            return PARKED
        self.request(agent, "wait_get", k, reply_value=vlen, tagged=True,
                     then=lambda t, _: then(t), effect=parked)


def rendezvous_now(s: Sim, n, cycle, held, nproc=8, compact=False):
    """One attempt of PROTOCOL 1 (mod.rs `join`, `all_joined`, `waiter`), or of PROTOCOL 2 with
    `compact` (the same requests, an O(1) verdict). Returns `start(i)`, agent i asking to join
    now; `held[i]` is set to when agent i holds its assignment."""
    V = o1_verdict_len(n, nproc) if compact else verdict_len(n, nproc, cycle)
    c = f"/vigil/c{cycle}"
    joined = {"n": 0}

    def get_after_wait(agent, k, vlen, then):
        # StoreClient::get is a WAIT (answered at once) and then the GET.
        s.request(agent, "wait", k, then=lambda t, _: s.request(
            agent, "get", k, reply_value=vlen, then=lambda t2, _: then(t2)))

    def add_joined():
        joined["n"] += 1
        return joined["n"]

    def start(i):
        # The stop waiter: a new connection every attempt (the last one closes), parked.
        if cycle > 0:
            s.kinds["close"] += 1
            s.serve(s.now + s.net(), s.cost("close"), lambda t: None)
        s.request(i, "connect", then=lambda t, _: s.request(i, "wait", f"{c}/stop"))
        s.request(i, "set", f"{c}/join/{i}", NODE_INFO_LEN)
        s.request(i, "add", f"{c}/joined", then=lambda t, r: after_add(i, r), effect=add_joined)

    def after_add(i, count):
        if count == n:
            s.request(i, "set", f"{c}/all", 0, effect=lambda: s.setkey(f"{c}/all", 0))
        if i == 0:
            s.park(0, f"{c}/all", lambda t: get_after_wait(0, f"{c}/all", 0, head_all))
        else:
            s.park(i, f"{c}/go", lambda t: get_after_wait(i, f"{c}/go", V, lambda t2: hold(i)))

    def head_all(t):
        # CHECK go; clear the last attempt's keys (under the store's lock); MULTI_GET every
        # join record; COMPARE_SET the verdict (its value comes back).
        def cleared(t):
            s.request(0, "multi_get", f"{c}/join/{n - 1}", nkeys=n, reply_value=NODE_INFO_LEN,
                      then=lambda t2, _: propose(t2))
        s.request(0, "check", f"{c}/go", then=lambda t, _: s.serve(
            s.now, s.cost("scan", nkeys=3 * n) if cycle > 0 else 0.0, cleared))

    def propose(t):
        s.request(0, "compare_set", f"{c}/go", V, reply_value=V,
                  effect=lambda: s.setkey(f"{c}/go", V), then=lambda t2, _: hold(0))

    def hold(i):
        held[i] = s.now
        # Parked on the attempt's end for the rest of it.
        s.request(i, "wait", f"{c}/end")

    return start


def rendezvous_v3(s: Sim, n, cycle, held, nproc=8, pipeline=False):
    """One attempt of PROTOCOL 3: every request tagged on the agent's one connection (no
    connect, no close); SET of the join record (answered, an empty frame: awaited before the
    ADD), ADD to the count (the last SETs `all`), WAIT_GET of the verdict (pushed with it);
    then WAIT_GET `end` and `stop` parked for the attempt and the last attempt's stop wait
    cancelled. Node rank 0 parks a WAIT_GET on `all` and decides as in PROTOCOL 2.
    `pipeline` (protocol `v3`, PROTOCOL 3 without hot spares): the SET and the ADD go out in one
    packet and their replies come back together; without it (`v3s`, a job with hot spares) the
    SET is answered before the ADD is sent."""
    V = o1_verdict_len(n, nproc)
    c = f"/vigil/c{cycle}"
    joined = {"n": 0}

    def add_joined():
        joined["n"] += 1
        return joined["n"]

    def start(i):
        if pipeline:
            at = s.now + s.net()
            s.request(i, "set", f"{c}/join/{i}", NODE_INFO_LEN, tagged=True, arrive=at,
                      rides=True, then=lambda t, _: None)
            s.request(i, "add", f"{c}/joined", tagged=True, effect=add_joined, arrive=at,
                      then=lambda t, r: after_add(i, r))
            return
        s.request(i, "set", f"{c}/join/{i}", NODE_INFO_LEN, tagged=True, then=lambda t, _:
                  s.request(i, "add", f"{c}/joined", tagged=True, effect=add_joined,
                            then=lambda t2, r: after_add(i, r)))

    def after_add(i, count):
        def wait():
            if i == 0:
                s.wait_get(0, f"{c}/all", 0, head_all)
            else:
                s.wait_get(i, f"{c}/go", V, lambda t: hold(i))
        if count == n:
            s.request(i, "set", f"{c}/all", 0, tagged=True,
                      effect=lambda: s.setkey(f"{c}/all", 0), then=lambda t, _: wait())
        else:
            wait()

    def head_all(t):
        # CHECK go; clear the last attempt's keys (under the store's lock); MULTI_GET every
        # join record; COMPARE_SET the verdict (its value comes back).
        def cleared(t):
            s.request(0, "multi_get", f"{c}/join/{n - 1}", nkeys=n, reply_value=NODE_INFO_LEN,
                      tagged=True, then=lambda t2, _: propose(t2))
        s.request(0, "check", f"{c}/go", tagged=True, then=lambda t, _: s.serve(
            s.now, s.cost("scan", nkeys=3 * n) if cycle > 0 else 0.0, cleared))

    def propose(t):
        s.request(0, "compare_set", f"{c}/go", V, reply_value=V, tagged=True,
                  effect=lambda: s.setkey(f"{c}/go", V), then=lambda t2, _: hold(0))

    def hold(i):
        held[i] = s.now
        # Parked for the attempt (the failure's END is pushed to the end wait: simulate()), and
        # the last attempt's stop wait cancelled (answered with one byte in a frame).
        s.request(i, "wait_get", f"{c}/end", tagged=True)
        s.request(i, "wait_get", f"{c}/stop", tagged=True)
        if cycle > 0:
            s.request(i, "cancel", tagged=True, then=lambda t, _: None)

    return start


def rendezvous_o1(s: Sim, n, cycle, held, nproc=8):
    """One attempt of the proposed protocol: one JOIN request per agent (its record and the
    count), the store wakes node rank 0 when the count is N; node rank 0 reads the records once
    (one MULTI_GET, O(N) bytes to it alone) and sets an O(1) verdict, pushed to every agent."""
    V = o1_verdict_len(n, nproc)
    c = f"/vigil/c{cycle}"
    joined = {"n": 0}

    def join_effect():
        joined["n"] += 1
        if joined["n"] == n:
            s.setkey(f"{c}/all", 0)

    def start(i):
        if i == 0:
            s.park(0, f"{c}/all", head_all, push_value=0)
        else:
            s.park(i, f"{c}/go", lambda t: hold(i), push_value=V)
        s.request(i, "join", f"{c}/join/{i}", NODE_INFO_LEN, effect=join_effect)

    def head_all(t):
        s.request(0, "multi_get", f"{c}/join/{n - 1}", nkeys=n, reply_value=NODE_INFO_LEN,
                  then=lambda t2, _: s.request(0, "set", f"{c}/go", V,
                                               effect=lambda: s.setkey(f"{c}/go", V)) or hold(0))

    def hold(i):
        held[i] = s.now

    return start


@dataclass
class Result:
    n: int
    protocol: str
    join_s: float
    failure_s: float
    bytes_per_attempt: int
    cpu_per_attempt_s: float
    ops_per_attempt: int
    liveness_cpu_s: float
    sweep_s: float
    join_cpu_s: float
    ops_by_kind: dict


def simulate(n, protocol, costs, *, threads=1, latency=50e-6, jitter=0.0, nic_bps=None,
             join_spread=0.0, agent_threads=None, client_s=0.0, client_per_byte=0.0,
             nproc=8, seed=1):
    s = Sim(costs, threads, latency, jitter, nic_bps, agent_threads, client_s, client_per_byte,
            seed)
    attempt = {
        "now": rendezvous_now,
        "v2": lambda *a: rendezvous_now(*a, compact=True),
        "v3": lambda *a: rendezvous_v3(*a, pipeline=True),
        "v3s": rendezvous_v3,
        "o1": rendezvous_o1,
    }[protocol]
    rng = random.Random(seed)
    starts = [rng.uniform(0, join_spread) if join_spread else 0.0 for _ in range(n)]
    held0 = [None] * n
    start0 = attempt(s, n, 0, held0, nproc)
    for i in range(n):
        s.at(starts[i], lambda i=i: start0(i))
    s.run()
    assert all(h is not None for h in held0), "an agent never held attempt 0's assignment"
    join = max(held0)
    # A failure: node N-1 reports it; every agent, woken by the end, joins attempt 1.
    s.now = t_fail = s.now + 1.0
    cpu0, in0, out0, ops0 = s.cpu, s.bytes_in, s.bytes_out, s.ops
    kinds0 = collections.Counter(s.kinds)
    s.free_at = [max(f, t_fail) for f in s.free_at]
    held1 = [None] * n
    start1 = attempt(s, n, 1, held1, nproc)
    end = "/vigil/c0/end"
    for i in range(n):
        if protocol in ("now", "v2"):
            # Parked in WAIT on c0/end; woken, it reads the end (WAIT + GET) and joins.
            s.wait_on(end, i, "wake", lambda t, i=i: s.request(i, "wait", end, then=lambda t2, _:
                      s.request(i, "get", end, reply_value=END_LEN, then=lambda t3, _: start1(i))))
        elif protocol in ("v3", "v3s"):
            # Its WAIT_GET on c0/end is answered with the end: no GET after it.
            s.wait_on(end, i, "wake_get", lambda t, i=i: start1(i), END_LEN)
        else:
            s.wait_on(end, i, "push", lambda t, i=i: start1(i), END_LEN)
    tagged = protocol in ("v3", "v3s")
    if protocol != "o1":
        s.request(n - 1, "set", f"/vigil/failed/0/{n - 1}", 0, tagged=tagged)
    s.request(n - 1, "compare_set", end, END_LEN, reply_value=END_LEN, tagged=tagged,
              effect=lambda: s.setkey(end, END_LEN))
    s.run()
    assert all(h is not None for h in held1), "an agent never held attempt 1's assignment"
    failure = max(held1) - t_fail
    live_cpu, sweep = liveness(n, protocol, costs, latency)
    return Result(n, protocol, join, failure, (s.bytes_in - in0) + (s.bytes_out - out0),
                  s.cpu - cpu0, s.ops - ops0, live_cpu, sweep, cpu0,
                  dict(s.kinds - kinds0))


def liveness(n, protocol, costs, latency):
    """Store CPU per liveness period, and node rank 0's sweep (how long its round takes).

    now, v2: every other agent ADDs to its own counter and reads node rank 0's (2 ADDs); node rank 0
    ADDs to its own and then reads each of the N-1 others with an ADD of 0, one round trip each.
    v3: every agent one tagged RENEW (one-way), every agent but node rank 0 one tagged ADD of 0
    of node rank 0's counter (a round trip), node rank 0 one tagged SWEEP (the store scans the N
    renewed counters, answers the stale ones: none here).
    o1: every agent sends one renewal (no reply); node rank 0 asks once for the stale ones (the
    store scans N entries)."""
    c = costs
    if protocol in ("now", "v2"):
        cpu = (2 * (n - 1) + n) * c["add"] * 1e-6
        sweep = n * (2 * latency + c["add"] * 1e-6)
    elif protocol in ("v3", "v3s"):
        one_sweep = (c["sweep"] + c["tagged"] + c["sweep_per_key"] * n) * 1e-6
        cpu = (n * c["renew"] + (n - 1) * c["add_tagged"]) * 1e-6 + one_sweep
        sweep = 2 * latency + one_sweep
    else:
        cpu = n * c["set"] * 1e-6 + (c["get"] + c["multi_get_per_key"] * n) * 1e-6
        sweep = 2 * latency + (c["get"] + c["multi_get_per_key"] * n) * 1e-6
    return cpu, sweep


def load_costs(path):
    """The built-in costs, or a file bench/store_costs.py wrote. A file without PROTOCOL 3's
    requests (written before they were measured, or against a server without them) stands in
    its own nearest ones (PROTOCOL3_STAND_INS) and says so in one line on stderr."""
    costs = dict(DEFAULT_COSTS)
    if path:
        with open(path) as f:
            got = json.load(f)
        missing = [k for k in DEFAULT_COSTS if k not in got and k not in PROTOCOL3_COSTS]
        if missing:
            sys.exit(f"{path} lacks {', '.join(missing)}: write it with "
                     "python3 bench/store_costs.py --json FILE")
        stand_in = [k for k in PROTOCOL3_COSTS if k not in got]
        for k in stand_in:
            got[k] = got[PROTOCOL3_STAND_INS[k]] if PROTOCOL3_STAND_INS[k] else 0.0
        if stand_in:
            print(f"note: {path} has no " + ", ".join(
                f"{k} (used: {PROTOCOL3_STAND_INS[k] or 0})" for k in stand_in)
                + "; measure them with a server that has them (bench/store_costs.py)",
                file=sys.stderr)
        costs.update({k: max(0.0, float(got[k])) for k in DEFAULT_COSTS})
    return costs


PROTOCOLS = ("now", "v2", "v3", "v3s", "o1")


def fmt_bytes(b):
    for unit, d in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= d:
            return f"{b / d:.1f} {unit}"
    return f"{b} B"


def main():
    ap = argparse.ArgumentParser(description="SIMULATED rendezvous at scale (see the docstring)")
    ap.add_argument("--costs", help="JSON from bench/store_costs.py --json (default: built in)")
    ap.add_argument("--nodes", default="1024,2048,4096,4900,10000,100000")
    ap.add_argument("--protocol", default="now,v2,v3,o1")
    ap.add_argument("--latency-us", type=float, default=50.0, help="one way, agent to store")
    ap.add_argument("--jitter-us", type=float, default=20.0, help="added to each message, 0 to it")
    ap.add_argument("--nic-gbps", type=float, default=100.0, help="the store's network card; 0: "
                    "no limit (loopback)")
    ap.add_argument("--store-threads", type=int, default=1)
    ap.add_argument("--join-spread-ms", type=float, default=0.0,
                    help="agents ask to join attempt 0 spread uniformly over this long")
    ap.add_argument("--agent-threads", type=int, default=0,
                    help="all agents share this many threads (0: a machine each)")
    ap.add_argument("--client-us", type=float, default=0.0, help="agent CPU per reply")
    ap.add_argument("--client-ns-per-byte", type=float, default=0.0, help="agent CPU per byte")
    ap.add_argument("--store-factor", type=float, default=1.0,
                    help="multiplies every store cost: the ratio of the store CPU real agents "
                    "used (cargo bench -p vigil --bench scale_check) to what this simulation "
                    "predicts for the same run, which the per-request costs alone leave out")
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    try:
        sizes = [int(x) for x in a.nodes.split(",")]
        protos = a.protocol.split(",")
        assert all(p in PROTOCOLS for p in protos) and all(x >= 2 for x in sizes)
    except (ValueError, AssertionError):
        sys.exit("--nodes takes counts of 2 or more (1024,10000) and --protocol some of "
                 + ",".join(PROTOCOLS))
    costs = {k: v * a.store_factor for k, v in load_costs(a.costs).items()}
    rows = []
    print("SIMULATED (bench/scale_sim.py): the store as a queue with measured per-request costs")
    print(f"latency {a.latency_us:g} us one way (+0-{a.jitter_us:g} us), store NIC "
          f"{a.nic_gbps:g} Gb/s, {a.store_threads} store thread(s), join spread "
          f"{a.join_spread_ms:g} ms, store costs x{a.store_factor:g}, "
          + (f"agents on {a.agent_threads} shared thread(s)" if a.agent_threads
             else "an agent per machine"))
    print("| nodes | protocol | join | failure to all hold next | bytes per attempt | "
          "store CPU per attempt | store operations per attempt | liveness: store CPU per period | "
          "node rank 0's sweep |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        for p in protos:
            r = simulate(n, p, costs, threads=a.store_threads, latency=a.latency_us * 1e-6,
                         jitter=a.jitter_us * 1e-6,
                         nic_bps=a.nic_gbps * 1e9 if a.nic_gbps else None,
                         join_spread=a.join_spread_ms * 1e-3,
                         agent_threads=a.agent_threads or None, client_s=a.client_us * 1e-6,
                         client_per_byte=a.client_ns_per_byte * 1e-9, nproc=a.nproc)
            rows.append(r.__dict__)
            print(f"| {n} | {p} | {r.join_s * 1e3:.1f} ms | {r.failure_s * 1e3:.1f} ms | "
                  f"{fmt_bytes(r.bytes_per_attempt)} | {r.cpu_per_attempt_s * 1e3:.1f} ms | "
                  f"{r.ops_per_attempt} | {r.liveness_cpu_s * 1e3:.1f} ms | "
                  f"{r.sweep_s * 1e3:.1f} ms |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"costs": costs, "args": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

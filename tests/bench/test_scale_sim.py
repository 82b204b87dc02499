"""The scale simulation's own invariants (bench/scale_sim.py), so that it can be wrong and fail:
latencies add up hop by hop, cost scales time, bytes follow the wire encoding."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("scale_sim", ROOT / "bench" / "scale_sim.py")
sim = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(sim)

ZERO = {k: 0.0 for k in sim.DEFAULT_COSTS}
L = 100e-6


def run(n, protocol, costs=None, **kw):
    kw.setdefault("latency", L)
    return sim.simulate(n, protocol, costs or ZERO, **kw)


@pytest.mark.parametrize("protocol,hops", [("now", 18), ("o1", 6)])
def test_free_store_join_is_its_network_hops(protocol, hops):
    # With a store that costs nothing, joining is one-way trips only. now: ADD (2), SET all (1),
    # node rank 0's wake (1), WAIT+GET of all (4), CHECK (2), MULTI_GET (2), COMPARE_SET (1),
    # the others' wake (1), WAIT+GET of the verdict (4). o1: JOIN (1), push to node rank 0 (1),
    # MULTI_GET (2), SET go (1), push (1).
    for n in (2, 64):
        r = run(n, protocol)
        assert r.join_s == pytest.approx(hops * L, rel=1e-9)
        assert r.cpu_per_attempt_s == 0.0


def test_failure_adds_the_end_round_trips():
    # now: COMPARE_SET end (1), wake (1), WAIT + GET end (4), then a join (18).
    assert run(8, "now").failure_s == pytest.approx((6 + 18) * L, rel=1e-9)
    # o1: COMPARE_SET end (1), pushed (1), then a join (6).
    assert run(8, "o1").failure_s == pytest.approx((2 + 6) * L, rel=1e-9)


@pytest.mark.parametrize("protocol", ["now", "o1"])
def test_doubling_every_cost_doubles_time_without_latency(protocol):
    one = run(16, protocol, sim.DEFAULT_COSTS, latency=0.0)
    two = run(16, protocol, {k: 2 * v for k, v in sim.DEFAULT_COSTS.items()}, latency=0.0)
    assert one.join_s > 0
    assert two.join_s == pytest.approx(2 * one.join_s, rel=1e-6)
    assert two.failure_s == pytest.approx(2 * one.failure_s, rel=1e-6)
    assert two.cpu_per_attempt_s == pytest.approx(2 * one.cpu_per_attempt_s, rel=1e-6)


def test_one_store_thread_is_a_bottleneck_two_share_it():
    # Everything at once and no latency: the join cannot end before one store thread woke every
    # agent and answered its WAIT and its GET of the verdict, one after another.
    c = sim.DEFAULT_COSTS
    n = 512
    one = run(n, "now", c, latency=0.0)
    per_agent = c["wake"] + c["wait_ready"] + c["get"] + c["per_byte_out"] * sim.verdict_len(n)
    assert one.join_s >= n * per_agent * 1e-6
    two = run(512, "now", sim.DEFAULT_COSTS, latency=0.0, threads=2)
    assert two.join_s < one.join_s
    assert two.join_cpu_s == pytest.approx(one.join_cpu_s, rel=1e-6)


def test_verdict_is_serde_json_of_every_offset():
    assert sim.verdict_len(3, 8, 1) == len(
        '{"go":{"cycle":1,"world_size":24,"offsets":[0,8,16],"max_restarts":3,'
        '"calculated":null}}')


@pytest.mark.parametrize("n,measured", [(1024, 5.4e6), (4096, 96e6)])
def test_now_moves_what_field_finding_29_measured(n, measured):
    # Field finding 29, counted on real runs: 5.4 MB at 1,024 agents, 96 MB at 4,096.
    b = run(n, "now").bytes_per_attempt
    assert b == pytest.approx(measured, rel=0.1)
    # O(N^2): every agent reads the whole verdict; the rest is O(N).
    rest = b - n * sim.verdict_len(n)
    assert 0 < rest < 1000 * n


def test_o1_moves_constant_bytes_per_agent():
    small = run(256, "o1").bytes_per_attempt / 256
    big = run(4096, "o1").bytes_per_attempt / 4096
    assert big == pytest.approx(small, rel=0.15)
    assert big < 1000


def test_liveness_sweep_is_linear_now_and_one_round_trip_o1():
    c = sim.DEFAULT_COSTS
    cpu, sweep = sim.liveness(1000, "now", c, L)
    assert sweep == pytest.approx(1000 * (2 * L + c["add"] * 1e-6))
    cpu1, sweep1 = sim.liveness(1000, "o1", c, L)
    assert sweep1 < 2 * L + 1e-3
    assert cpu1 < cpu


def test_costs_file_missing_a_kind_is_one_clear_line(tmp_path):
    f = tmp_path / "costs.json"
    f.write_text(json.dumps({"add": 1.0}))
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "scale_sim.py"), "--costs", str(f),
                        "--nodes", "4"], capture_output=True, text=True)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "lacks" in err[0] and "store_costs.py" in err[0]


def test_prints_a_simulated_table():
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "scale_sim.py"), "--nodes", "4,64"],
                       capture_output=True, text=True, check=True)
    assert p.stdout.startswith("SIMULATED")
    rows = [l for l in p.stdout.splitlines() if l.startswith("| 4 ") or l.startswith("| 64 ")]
    assert len(rows) == 6, p.stdout  # now, v2 and o1 for each size


def test_protocol_2_makes_the_same_requests_with_an_o1_verdict():
    """v2 is protocol 1 with the compact verdict: the same requests, the verdict's bytes no longer
    N per agent, so the bytes per attempt grow as N, not N^2."""
    costs = sim.DEFAULT_COSTS
    now = {n: sim.simulate(n, "now", costs) for n in (256, 1024)}
    v2 = {n: sim.simulate(n, "v2", costs) for n in (256, 1024)}
    for n in (256, 1024):
        assert v2[n].ops_per_attempt == now[n].ops_per_attempt
        assert v2[n].bytes_per_attempt < now[n].bytes_per_attempt
    # 4x the nodes: about 4x the bytes for v2, about 16x for protocol 1.
    assert v2[1024].bytes_per_attempt / v2[256].bytes_per_attempt < 5
    assert now[1024].bytes_per_attempt / now[256].bytes_per_attempt > 10

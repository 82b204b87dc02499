"""Straggler scores across nodes (docs/stragglers.md): two agents x two ranks, one rank slow.

Node rank 0 gathers every node's summary through the store and prints NVRx's report; with
--stop-if-straggler the job stops at one agreed step and is requeued without the slow node.
"""
import re

import pytest

from harness import base_env, events, of, run_vigil, write
from test_multinode import Nodes

# Every rank times its steps; the rank named by SLOW_RANK takes 4x as long. A rank stops when the
# agent names a stop step, else after `steps` steps.
TRAIN = """
import os, sys, time, pathlib, vigil
rank = int(os.environ["RANK"])
slow = int(os.environ.get("SLOW_RANK", "-1"))
steps = int(sys.argv[1])
for step in range(steps):
    t0 = time.perf_counter()
    time.sleep(0.04 if rank == slow else 0.01)
    vigil.step_timing(step, time.perf_counter() - t0)
    if vigil.should_stop(step):
        pathlib.Path(os.environ["OUT_DIR"], f"ckpt{rank}").write_text(str(step))
        sys.exit(0)
"""

WORST_LINE = re.compile(r"^Rank=(\d+) Node=(\S+) Score=(\d\.\d\d)$")


def report_blocks(stderr):
    """Each report's lines, from "GPU relative performance:" to its processing time."""
    blocks, cur = [], None
    for line in stderr.splitlines():
        line = line.split("]:", 1)[-1] if line.startswith("[vigil") else line
        if line == "GPU relative performance:":
            cur = [line]
        elif cur is not None:
            cur.append(line)
            if line.startswith("Straggler report processing time:"):
                blocks.append(cur)
                cur = None
    return blocks


def node_name(i):
    # Each agent names its node as Slurm would; outside Slurm it would be the (shared) hostname.
    return {"SLURMD_NODENAME": f"n{i}"}


def test_one_slow_rank_is_reported_in_nvrx_format_with_its_rank_and_node(job):
    write(job / "train.py", TRAIN)
    nodes = Nodes(job, 2, ["train.py", "200"], nproc=2, extra=["--straggler-report-interval", "1"],
                  env={"SLOW_RANK": "3"}, per_node_env=node_name)
    res = nodes.wait(timeout=120)
    assert [r[0] for r in res] == [0, 0], [r[2][-2000:] for r in res]
    blocks = report_blocks(res[0][2])
    assert blocks, res[0][2][-3000:]
    # The other node prints no report: node rank 0 scores the whole job.
    assert not report_blocks(res[1][2])
    b = blocks[-1]
    assert b[1] == "Worst performing 4/4 ranks:", b
    m = WORST_LINE.match(b[2])
    assert m and m.group(1) == "3", b
    assert float(m.group(3)) < 0.5, b
    assert "GPU individual performance:" in b
    assert b[-1].startswith("Straggler report processing time: ") and b[-1].endswith(" sec."), b
    stragglers = [l for l in b if l.startswith("Rank=") and "relative=" in l]
    assert [l.split()[0] for l in stragglers] == ["Rank=3"], b
    # The event log has every rank's scores, and which node rank 3 is on.
    rec = of(nodes.events(0), "straggler_report")[-1]
    by_rank = {r["rank"]: r for r in rec["ranks"]}
    assert sorted(by_rank) == [0, 1, 2, 3]
    assert by_rank[3]["node_rank"] == 1 and by_rank[0]["node_rank"] == 0
    assert rec["stragglers"] == [3]
    assert m.group(2) == by_rank[3]["host"] == "n1"
    assert all(r["host"] == "n0" for r in rec["ranks"] if r["node_rank"] == 0)


def test_stop_if_straggler_checkpoints_at_one_step_and_requeues_without_the_slow_node(job):
    write(job / "train.py", TRAIN)
    # Outside Slurm the node list only names the nodes (no SLURM_JOB_ID: nothing is submitted).
    nodes = Nodes(job, 2, ["train.py", "100000"], nproc=2,
                  extra=["--straggler-report-interval", "1", "--stop-if-straggler", "--rdzv-id", "st"],
                  env={"SLOW_RANK": "3", "SLURM_JOB_NODELIST": "n[0-1]"}, per_node_env=node_name)
    res = nodes.wait(timeout=120)
    assert [r[0] for r in res] == [75, 75], [r[2][-2000:] for r in res]
    ev0 = nodes.events(0)
    agreed = of(ev0, "stop_agreed")
    assert agreed and agreed[0]["trigger"] == "straggler", agreed
    step = agreed[0]["step"]
    # Every rank checkpointed at the one agreed step.
    assert [int((job / f"ckpt{r}").read_text()) for r in range(4)] == [step] * 4
    import json
    ledger = [json.loads(l) for l in (job / "node0" / "logs" / "vigil-job-st" / "ledger.jsonl").read_text().splitlines()]
    assert ledger[-1]["stop_trigger"] == "straggler"
    assert ledger[-1]["decision"] == "requeue"
    assert ledger[-1]["excluded"] == ["n1"], ledger[-1]


SECTIONS_ONLY = """
import os, sys, time, vigil
rank = int(os.environ["RANK"])
for step in range(int(sys.argv[1])):
    with vigil.section("step"):
        time.sleep(0.04 if rank == 1 else 0.01)
    with vigil.section("data"):
        time.sleep(0.001)
"""


def test_a_job_that_only_opens_a_step_section_is_scored(job):
    write(job / "train.py", SECTIONS_ONLY)

    r = run_vigil(["run", "--nproc-per-node", "2", "--straggler-report-interval", "1",
                   "--log-dir", str(job / "logs"), "train.py", "120"], cwd=job, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    blocks = report_blocks(r.stderr)
    assert blocks, r.stderr[-2000:]
    assert WORST_LINE.match(blocks[-1][2]).group(1) == "1", blocks[-1]
    rec = of(events(job / "logs"), "straggler_report")[-1]
    slow = next(x for x in rec["ranks"] if x["rank"] == 1)
    # The "step" section's ~40 ms, not the "data" section's 1 ms.
    assert 0.03 < slow["median_s"] < 0.2, slow


# --- What the GPUs were doing (the FAKE NVML library, tests/fakes/nvml.py) -----------------------

from fakes.nvml import gpu, nvml_env, write_nvml  # noqa: E402


def test_a_throttled_gpu_is_named_as_the_stragglers_cause(job):
    write(job / "train.py", TRAIN)
    # Two GPUs; the slow rank's (local rank 1 -> GPU 1) is held back by HW slowdown and power brake.
    fake = write_nvml(job / "nvml.json", [
        gpu(0),
        gpu(1, sm_clock_mhz=1110, throttle_reasons=0x88, temperature_c=88, power_w=690),
    ])
    env = nvml_env(base_env(OUT_DIR=job, SLOW_RANK="1"), fake)
    r = run_vigil(["run", "--nproc-per-node", "2", "--straggler-report-interval", "1",
                   "--log-dir", str(job / "logs"), "train.py", "300"], cwd=job, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    blocks = report_blocks(r.stderr)
    assert blocks, r.stderr[-2000:]
    lines = [l for l in blocks[-1] if l.startswith("Rank=1 ") and "relative=" in l]
    assert len(lines) == 1, blocks[-1]
    assert lines[0].endswith(
        "GPU 1: SM clock 1,110 of 1,980 MHz, throttled by HW slowdown and power brake, 88 C, power 690 of 700 W"
    ), lines[0]
    ev = events(job / "logs")
    assert of(ev, "gpu_telemetry")[0]["on"] is True
    assert "HW slowdown" in of(ev, "straggler_report")[-1]["gpus"]["1"]


def test_without_nvml_the_report_says_there_is_no_gpu_telemetry(job):
    write(job / "train.py", TRAIN)
    env = base_env(OUT_DIR=job, SLOW_RANK="1", VIGIL_NVML_LIB=str(job / "no-such-libnvidia-ml.so"))
    r = run_vigil(["run", "--nproc-per-node", "2", "--straggler-report-interval", "1",
                   "--log-dir", str(job / "logs"), "train.py", "150"], cwd=job, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [l for l in report_blocks(r.stderr)[-1] if l.startswith("Rank=1 ") and "relative=" in l]
    assert lines and lines[0].endswith("no GPU telemetry"), lines
    off = of(events(job / "logs"), "gpu_telemetry")
    assert off and off[0]["on"] is False and off[0]["why"], off


LONG = """
import os, sys, time, pathlib, vigil
rank = int(os.environ["RANK"])
pathlib.Path(os.environ["OUT_DIR"], f"up{rank}").write_text("")
for step in range(100000):
    time.sleep(0.02)
    vigil.heartbeat(step)
"""


@pytest.mark.parametrize("fault", ["xid", "ecc"])
def test_a_gpu_fault_stops_the_job_and_requeues_it_without_the_node(job, fault):
    write(job / "train.py", LONG)
    fakes = [write_nvml(job / f"nvml{i}.json", [gpu(0), gpu(1)]) for i in range(2)]
    nodes = Nodes(job, 2, ["train.py"], nproc=2,
                  extra=["--max-restarts", "3", "--rdzv-id", "xid"],
                  env={"SLURM_JOB_NODELIST": "n[0-1]"},
                  per_node_env=lambda i: {**node_name(i), **nvml_env({}, fakes[i])})
    try:
        from harness import wait_for
        wait_for(lambda: all((job / f"up{r}").exists() for r in range(4)), timeout=60, what="ranks up")
        if fault == "xid":
            # GPU 1 of node 1 falls off the bus.
            write_nvml(fakes[1], [gpu(0), gpu(1)], events=[{"gpu": 1, "xid": 79}])
        else:
            # GPU 1 of node 1 reports uncorrectable ECC errors (seen by the next sample).
            write_nvml(fakes[1], [gpu(0), gpu(1, ecc_uncorrected_volatile=2)])
        res = nodes.wait(timeout=120)
    finally:
        nodes.kill()
    # Not restarted in place, though restarts were left: both ask to be requeued.
    assert [r[0] for r in res] == [75, 75], [r[2][-2000:] for r in res]
    ev1 = nodes.events(1)
    reason = of(ev1, "node_fault")[0]["reason"]
    if fault == "xid":
        xid = of(ev1, "gpu_xid")
        assert xid and xid[0]["xid"] == 79 and xid[0]["critical"] is True, xid
        assert reason.startswith("GPU 1: critical XID 79"), reason
    else:
        assert reason.startswith("GPU 1: 2 uncorrectable ECC"), reason
    assert len(of(nodes.events(0), "cycle_start")) == 1
    import json
    ledger = [json.loads(l) for l in (job / "node0" / "logs" / "vigil-job-xid" / "ledger.jsonl").read_text().splitlines()]
    assert ledger[-1]["decision"] == "requeue" and ledger[-1]["excluded"] == ["n1"], ledger[-1]

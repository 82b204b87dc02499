"""NVRx's timeout rules under vigil, end to end (docs/hangs.md, docs/ft_launcher.md).

Code written for NVRx runs after `import nvidia_resiliency_ext.fault_tolerance as ft` became
`import vigil.compat as ft`. Each test starts the real agent with real rank processes and
reproduces a fault an attack found (fault-findings 6, 13, 15); bounds are generous failure
limits, never timing goals.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import base_env, events, of, run_dirs, run_vigil, write  # noqa: E402

# NVRx's examples/fault_tolerance/fault_tol_cfg_heartbeats.yaml and fault_tol_cfg_sections.yaml.
HEARTBEATS_YAML = """fault_tolerance:
    initial_rank_heartbeat_timeout: null
    rank_heartbeat_timeout: null
    log_level: "DEBUG"
"""
SECTIONS_YAML = """fault_tolerance:
    initial_rank_heartbeat_timeout: null
    rank_heartbeat_timeout: null
    rank_section_timeouts:
        init: 20
        step: 10
        checkpoint: 30
    rank_out_of_section_timeout: 30
    log_level: "DEBUG"
"""


def rank_log(log_dir: Path, attempt: int, local_rank: int, stream: str) -> str:
    (d,) = run_dirs(log_dir)
    return (d / f"attempt_{attempt}" / str(local_rank) / f"{stream}.log").read_text()


def calculated(evs):
    return [e for e in evs if e["event"] == "timeouts_updated" and e["source"] == "calculated"]


def hangs(evs):
    return [e for e in evs if e["event"] == "hang"]


def test_configured_timeout_stays_until_the_code_asks(job):
    # 20 quick heartbeats, then a 3 s checkpoint pause: NVRx keeps the configured 30 s, so the
    # pause is fine. (vigil used to recalculate 1.0 s after 16 heartbeats and kill the job.)
    write(job / "t.py", """
import time
import vigil.compat as ft
c = ft.RankMonitorClient()
c.init_workload_monitoring()
for _ in range(20):
    c.send_heartbeat()
    time.sleep(0.01)
time.sleep(3)  # saving a checkpoint
c.send_heartbeat()
print("hb", c.hb_timeouts.initial, c.hb_timeouts.subsequent, c.hb_timeouts.were_calculated, flush=True)
c.shutdown_workload_monitoring()
""")
    r = run_vigil(["run", "--nproc-per-node", "2", "--log-dir", "logs", "--ft-rank-heartbeat-timeout", "30",
                   "--ft-initial-rank-heartbeat-timeout", "60", "t.py"], cwd=job, env=base_env())
    evs = events(job / "logs")
    assert r.returncode == 0, (r.stderr, hangs(evs))
    assert hangs(evs) == [] and calculated(evs) == []
    for lr in (0, 1):
        assert "hb 60.0 30.0 False" in rank_log(job / "logs", 0, lr, "stdout")


HEARTBEATS = """
import json, logging, os, sys, time
import vigil.compat as ft
logging.basicConfig(level=logging.INFO)
c = ft.RankMonitorClient()
c.init_workload_monitoring()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 0:
    assert not c.hb_timeouts.are_valid, c.hb_timeouts  # null: off until calculated
    for _ in range(5):
        c.send_heartbeat()
        time.sleep(0.3)
    assert c.calculate_and_set_hb_timeouts()
    assert c.hb_timeouts.are_valid and c.hb_timeouts.were_calculated
    if os.environ["RANK"] == "1":
        print("Simulating fault: rank_hung; rank to fail: 1", file=sys.stderr, flush=True)
        time.sleep(600)
    while True:
        c.send_heartbeat()
        time.sleep(0.05)
# The next attempt starts with the calculated timeouts, without asking again.
deadline = time.time() + 30
while not c.hb_timeouts.are_valid:
    assert time.time() < deadline, c.hb_timeouts
    time.sleep(0.01)
c.send_heartbeat()
with open("hb_%s.json" % os.environ["RANK"], "w") as f:
    json.dump([c.hb_timeouts.initial, c.hb_timeouts.subsequent], f)
"""


def test_null_heartbeat_timeouts_are_calculated_when_asked_and_then_catch_a_hang(job):
    write(job / "ft.yaml", HEARTBEATS_YAML)
    write(job / "t.py", HEARTBEATS)
    r = run_vigil(["run", "--ft-cfg-path", "ft.yaml", "--nproc-per-node", "2", "--max-restarts", "1",
                   "--log-dir", "logs", "t.py"], cwd=job, env=base_env(), timeout=180)
    evs = events(job / "logs")
    assert r.returncode == 0, (r.stderr, hangs(evs))
    (calc,) = calculated(evs)
    (hang,) = hangs(evs)
    assert evs.index(calc) < evs.index(hang)
    assert (hang["cycle"], hang["rank"], hang["timeout"]) == (0, 1, "heartbeat")
    assert abs(hang["limit_ms"] - calc["timeouts"]["heartbeat"] * 1000) <= 1
    assert "Updated heartbeat timeouts: HeartbeatTimeouts(initial=" in rank_log(job / "logs", 0, 0, "stderr")
    assert "Simulating fault" in rank_log(job / "logs", 0, 1, "stderr")
    for rank in (0, 1):
        initial, subsequent = json.loads((job / f"hb_{rank}.json").read_text())
        assert abs(initial - calc["timeouts"]["initial"]) < 0.002
        assert abs(subsequent - calc["timeouts"]["heartbeat"]) < 0.002


def test_too_little_observed_raises_or_is_skipped_as_in_nvrx(job):
    write(job / "t.py", """
import vigil.compat as ft
c = ft.RankMonitorClient()
c.init_workload_monitoring()
c.send_heartbeat()  # one heartbeat: no gap observed yet
assert c.calculate_and_set_hb_timeouts(skip_if_not_ready=True) is False
try:
    c.calculate_and_set_hb_timeouts()
except ft.RankMonitorClientError as e:
    print("raised:", e, flush=True)
assert not c.hb_timeouts.are_valid
""")
    r = run_vigil(["run", "--nproc-per-node", "2", "--log-dir", "logs", "t.py"], cwd=job, env=base_env())
    assert r.returncode == 0, r.stderr
    for lr in (0, 1):
        assert "raised: Not enough data to compute timeouts." in rank_log(job / "logs", 0, lr, "stdout")


SECTIONS = """
import logging, os, sys, time
import vigil.compat as ft
logging.basicConfig(level=logging.INFO)
c = ft.RankMonitorClient()
c.init_workload_monitoring()
c.start_section("init")
time.sleep(0.2)
c.end_section("init")
for _ in range(6):
    c.start_section("step")
    time.sleep(0.1)
    c.end_section("step")
c.start_section("checkpoint")
time.sleep(0.2)
c.end_section("checkpoint")
assert c.calculate_and_set_section_timeouts()
st = c.section_timeouts
assert set(st.calculated_sections) == {"init", "step", "checkpoint"} and st.is_out_of_section_calculated
if os.environ["RANK"] == "1":
    c.start_section("step")
    print("Simulating fault: rank_hung; rank to fail: 1", file=sys.stderr, flush=True)
    time.sleep(600)
while True:  # until stopped
    c.start_section("step")
    time.sleep(0.05)
    c.end_section("step")
"""


def test_sections_example_config_calculates_the_sections_it_names_and_catches_a_hung_step(job):
    # NVRx's sections example names its sections init/step/checkpoint (not "checkpointing"); no
    # heartbeat is ever sent, and the null heartbeat timeouts must not get in the way.
    write(job / "ft.yaml", SECTIONS_YAML)
    write(job / "t.py", SECTIONS)
    r = run_vigil(["run", "--ft-cfg-path", "ft.yaml", "--nproc-per-node", "2", "--log-dir", "logs", "t.py"],
                  cwd=job, env=base_env(), timeout=180)
    evs = events(job / "logs")
    (calc,) = calculated(evs)
    assert set(calc["timeouts"]["sections"]) == {"init", "step", "checkpoint"}
    assert calc["timeouts"]["sections"]["step"] < 10, "calculated from the 0.1 s steps, not the configured 10 s"
    assert calc["timeouts"]["initial"] is None and calc["timeouts"]["heartbeat"] is None
    (hang,) = hangs(evs)
    assert (hang["rank"], hang["timeout"]) == (1, {"section": "step"})
    assert abs(hang["limit_ms"] - calc["timeouts"]["sections"]["step"] * 1000) <= 1
    assert r.returncode != 0
    assert "Updated section timeouts: SectionTimeouts(section=" in rank_log(job / "logs", 0, 0, "stderr")


def test_flags_mode_waits_for_the_sections_the_job_configured(job):
    # vigil's own flags with --calculate-timeouts: calculated on its own once every rank sent 16
    # heartbeats and closed each configured section, whatever it is called ("checkpoint" here).
    write(job / "t.py", """
import time
import vigil
for i in range(20):
    with vigil.section("step"):
        time.sleep(0.01)
    vigil.heartbeat(i)
with vigil.section("checkpoint"):
    time.sleep(0.2)
vigil.heartbeat(20)
deadline = time.time() + 60
while vigil.timeouts()["sections"]["checkpoint"] == 600000:
    assert time.time() < deadline, "never calculated"
    time.sleep(0.02)
""")
    r = run_vigil(["run", "--log-dir", "logs", "--calculate-timeouts", "--heartbeat-timeout", "60",
                   "--section-timeouts", "step=60,checkpoint=600", "t.py"], cwd=job, env=base_env())
    assert r.returncode == 0, r.stderr
    (calc,) = calculated(events(job / "logs"))
    assert calc["timeouts"]["sections"]["checkpoint"] < 600


def test_a_sections_only_job_is_not_held_to_a_heartbeat_timeout(job):
    # No heartbeat is ever sent; the initial heartbeat timeout (2 s) must not fire while the
    # rank works through its sections for 4 s.
    write(job / "t.py", """
import time
import vigil
for _ in range(4):
    with vigil.section("step"):
        time.sleep(1)
""")
    r = run_vigil(["run", "--log-dir", "logs", "--initial-heartbeat-timeout", "2", "--heartbeat-timeout", "2",
                   "--section-timeouts", "step=30", "t.py"], cwd=job, env=base_env())
    evs = events(job / "logs")
    assert r.returncode == 0, (r.stderr, hangs(evs))
    assert hangs(evs) == []


def test_a_hangs_gap_is_not_learned(job):
    # Fault 6: a rank hangs 3 s (past the 2 s heartbeat timeout), then wakes up and heartbeats on
    # while it is being stopped. Its gap must not become a calculated (and saved) timeout.
    write(job / "t.py", """
import signal, time
import vigil
signal.signal(signal.SIGTERM, lambda *a: None)  # keeps heartbeating while being stopped
for i in range(5):
    vigil.heartbeat(i)
    time.sleep(0.01)
time.sleep(3)
for i in range(5, 40):
    vigil.heartbeat(i)
    time.sleep(0.01)
time.sleep(2)
""")
    r = run_vigil(["run", "--log-dir", "logs", "--heartbeat-timeout", "2", "--workers-stop-timeout", "8",
                   "t.py"], cwd=job, env=base_env())
    evs = events(job / "logs")
    assert r.returncode != 0
    (hang,) = hangs(evs)
    assert hang["timeout"] == "heartbeat"
    assert calculated(evs) == []
    (d,) = run_dirs(job / "logs")
    assert not (d / "timeouts.json").exists()


def test_workload_control_shutdown_ends_the_job_without_another_attempt(job):
    write(job / "t.py", """
import os, sys
import vigil.compat as ft
c = ft.RankMonitorClient()
c.init_workload_monitoring()
c.send_workload_control_request(ft.WorkloadControlRequest(ft.WorkloadAction.Continue, "all good"))
c.send_workload_control_request(ft.WorkloadControlRequest(ft.WorkloadAction.ShutdownWorkload, "bad data"))
try:
    c.send_workload_control_request("shutdown")
except ft.RankMonitorClientError as e:
    print("refused:", e, flush=True)
sys.exit(3)
""")
    r = run_vigil(["run", "--max-restarts", "3", "--rdzv-id", "wl", "--log-dir", "logs", "t.py"], cwd=job,
                  env=base_env())
    # The rank failed with restarts left, but asked for no further attempt: none, and not requeued.
    assert r.returncode == 1, r.stderr
    evs = events(job / "logs")
    (wc,) = of(evs, "workload_control")
    assert (wc["action"], wc["description"], wc["rank"]) == ("shutdown_workload", "bad data", 0)
    assert len(of(evs, "cycle_start")) == 1
    assert "rank 0 asked to shut the workload down (bad data)" in r.stderr
    assert "not requeued: a rank asked to shut the workload down (ShutdownWorkload)" in r.stderr
    assert "refused: expected a WorkloadControlRequest" in rank_log(job / "logs", 0, 0, "stdout")


MULTI = """
import json, os, time
import vigil.compat as ft
c = ft.RankMonitorClient()
c.init_workload_monitoring()
gap = 0.3 if os.environ["RANK"] == "1" else 0.05
got = []
for _ in range(2):  # two calculations in one attempt: two rounds
    for _ in range(4):
        c.send_heartbeat()
        time.sleep(gap)
    ok = c.calculate_and_set_hb_timeouts()
    got.append([ok, c.hb_timeouts.initial, c.hb_timeouts.subsequent])
with open(os.path.join(os.environ["OUT_DIR"], "calc_%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(got, f)
"""


def test_requests_across_nodes_get_the_job_wide_value_every_round(job):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
    from test_multinode import Nodes

    write(job / "t.py", MULTI)
    nodes = Nodes(job, 2, ["t.py"], nproc=1, extra=["--rdzv-id", "nvrx-multi"])
    res = nodes.wait(timeout=120)
    assert [rc for rc, _, _ in res] == [0, 0], [e for _, _, e in res]
    got = [json.loads((job / f"calc_{rank}.json").read_text()) for rank in (0, 1)]
    assert got[0] == got[1], "every node applies the job's value"
    for ok, initial, subsequent in got[0]:
        assert ok and initial is not None
        # Node 1's rank beats every 0.3 s (x5), node 0's every 0.05 s (the 1 s floor): the larger.
        assert subsequent > 1.2, got
    for i in range(2):
        assert len(calculated(nodes.events(i))) == 2


LIGHTNING = """
import sys, time, types
# A stand-in for Lightning's Callback base and Trainer: only what the callback touches.
for name in ("lightning", "lightning.pytorch", "lightning.pytorch.callbacks"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["lightning.pytorch.callbacks"].Callback = object
from vigil.lightning import FaultToleranceCallback
trainer = types.SimpleNamespace(strategy=None, global_step=0, current_epoch=0, max_steps=30,
                                max_epochs=None, should_stop=False)
cb = FaultToleranceCallback(calculate_timeouts=False)
cb.setup(trainer, None, "fit")
for step in range(1, 31):
    cb.on_train_batch_start(trainer, None, None, step - 1)
    trainer.global_step = step
    cb.on_train_batch_end(trainer, None, None, None, step - 1)
    if step == 20:
        time.sleep(3)  # saving a checkpoint outside any section
cb.teardown(trainer, None, "fit")
"""


def test_lightning_callback_without_calculate_timeouts_keeps_the_configured_ones(job):
    # NVRx's callback calculates nothing unless calculate_timeouts=True; vigil's used to
    # recalculate the configured 30 s to 1 s after 16 steps and kill the fit at the pause.
    write(job / "t.py", LIGHTNING)
    r = run_vigil(["run", "--log-dir", "logs", "--heartbeat-timeout", "30", "t.py"], cwd=job, env=base_env())
    evs = events(job / "logs")
    assert r.returncode == 0, (r.stderr, hangs(evs))
    assert calculated(evs) == []

"""vigil.lightning.StragglerDetectionCallback (NVRx's surface) against a fake agent: it times
batches into StepTiming messages, compares its arguments with the agent's settings, and stops at
the agreed step."""

import json

from conftest import child_env, finish, spawn

FAKE_LIGHTNING = """
import sys, types
for name in ("lightning", "lightning.pytorch", "lightning.pytorch.callbacks"):
    sys.modules[name] = types.ModuleType(name)
class Callback:
    pass
sys.modules["lightning.pytorch.callbacks"].Callback = Callback

class FakeStrategy:
    def __init__(self):
        self.checkpoint_io = types.SimpleNamespace()
        self.saved = []
    def save_checkpoint(self, ckpt, path):
        self.saved.append(path)
    def remove_checkpoint(self, path):
        pass

class FakeModelCheckpoint:
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    def __init__(self, dirpath):
        self.dirpath, self.save_last = dirpath, False

class FakeTrainer:
    # Only what the callbacks touch.
    def __init__(self, callbacks=(), checkpoint_callback=None):
        self.callbacks = list(callbacks)
        self.strategy = FakeStrategy()
        self.checkpoint_callback = checkpoint_callback
        self.global_step = 0
        self.current_epoch = 0
        self.max_steps = 100
        self.max_epochs = None
        self.should_stop = False
    def save_checkpoint(self, path):
        self.strategy.save_checkpoint({"global_step": self.global_step}, path)

def fit(trainer, batch_seconds, between=None):
    # Lightning's order of hooks for a fit of len(batch_seconds) batches.
    for cb in trainer.callbacks:
        cb.setup(trainer, None, "fit")
    for i, secs in enumerate(batch_seconds):
        for cb in trainer.callbacks:
            cb.on_train_batch_start(trainer, None, None, i)
        time.sleep(secs)
        trainer.global_step = i + 1
        for cb in trainer.callbacks:
            cb.on_train_batch_end(trainer, None, None, None, i)
        if between:
            between(i + 1)
        if trainer.should_stop:
            break
    for cb in trainer.callbacks:
        cb.teardown(trainer, None, "fit")
    return trainer.global_step

import json, time, logging, vigil
from vigil.lightning import StragglerDetectionCallback, FaultToleranceCallback
logging.basicConfig(level=logging.WARNING, format="%(message)s")
"""

AGENT_SETTINGS = {
    "VIGIL_STRAGGLER_INTERVAL": "300",
    "VIGIL_STRAGGLER_THRESHOLD": "0.7",
    "VIGIL_STOP_IF_STRAGGLER": "1",
}


def test_each_batch_is_timed_into_a_step_timing(agent):
    proc = spawn(
        FAKE_LIGHTNING
        + """
t = FakeTrainer([StragglerDetectionCallback()])
print(fit(t, [0.01, 0.3, 0.01]))
""",
        child_env(agent),
    )
    conn = agent.accept()
    out, err = finish(proc)
    msgs = conn.drain()
    assert out.strip() == "3" and "vigil" not in err
    timing = [m for m in msgs if m["type"] == "StepTiming"]
    assert [m["step"] for m in timing] == [1, 2, 3]
    # The slow batch is measured as slow (a lower bound only: the machine may be slower still).
    assert timing[1]["duration_us"] >= 300_000
    assert timing[1]["duration_us"] > timing[0]["duration_us"]
    # Nothing else but registering, the steps should_stop(step) reports and the signals it holds.
    assert {m["type"] for m in msgs} == {"Register", "StepTiming", "Progress", "HoldsSignals"}


def test_arguments_that_differ_from_the_agent_name_the_flag_once(agent):
    proc = spawn(
        FAKE_LIGHTNING
        + """
cb = StragglerDetectionCallback(
    report_time_interval=60, calc_relative_gpu_perf=True, calc_individual_gpu_perf=True,
    num_gpu_perf_scores_to_print=5, gpu_relative_perf_threshold=0.8,
    gpu_individual_perf_threshold=0.7, stop_if_detected=False, enable_ptl_logging=True)
t = FakeTrainer([cb])
fit(t, [0.0])
fit(t, [0.0])  # a second fit: no second warning
""",
        child_env(agent, **AGENT_SETTINGS),
    )
    agent.accept()
    _, err = finish(proc)
    lines = [line for line in err.splitlines() if line.startswith("vigil: StragglerDetectionCallback")]
    assert len(lines) == 4, err
    assert "report_time_interval=60" in lines[0] and "(300 s)" in lines[0]
    assert "`vigil run --straggler-report-interval 60`" in lines[0]
    assert "gpu_relative_perf_threshold=0.8" in lines[1] and "individual" not in lines[1].split("differs")[0]
    assert "`vigil run --straggler-threshold 0.8`" in lines[1]
    assert "stop_if_detected=False" in lines[2] and "remove `--stop-if-straggler`" in lines[2]
    assert "enable_ptl_logging" in lines[3] and "event log" in lines[3]


def test_stop_if_detected_without_the_agent_flag_says_to_add_it(agent):
    proc = spawn(
        FAKE_LIGHTNING
        + """
fit(FakeTrainer([StragglerDetectionCallback(stop_if_detected=True)]), [0.0])
""",
        child_env(agent, VIGIL_STOP_IF_STRAGGLER="0"),
    )
    agent.accept()
    _, err = finish(proc)
    assert err.count("vigil: StragglerDetectionCallback") == 1, err
    assert "add `--stop-if-straggler` to `vigil run`" in err


def test_matching_or_unknown_settings_say_nothing(agent):
    code = (
        FAKE_LIGHTNING
        + """
cb = StragglerDetectionCallback(report_time_interval=300.0, gpu_relative_perf_threshold=0.7,
                                gpu_individual_perf_threshold=0.7, stop_if_detected=True)
assert cb.differences() == [], cb.differences()
fit(FakeTrainer([cb]), [0.0])
print("ok")
"""
    )
    proc = spawn(code, child_env(agent, **AGENT_SETTINGS))
    agent.accept()
    out, err = finish(proc)
    assert out.strip() == "ok" and "StragglerDetectionCallback" not in err
    # An agent that exports no straggler settings: nothing to compare, nothing said.
    proc = spawn(code.replace("stop_if_detected=True", "stop_if_detected=False"), child_env(agent))
    agent.accept()
    out, err = finish(proc)
    assert out.strip() == "ok" and "StragglerDetectionCallback" not in err


def test_with_a_fault_tolerance_callback_each_step_is_timed_once(agent):
    proc = spawn(
        FAKE_LIGHTNING
        + """
t = FakeTrainer([FaultToleranceCallback(), StragglerDetectionCallback()])
fit(t, [0.0, 0.0, 0.0])
""",
        child_env(agent),
    )
    conn = agent.accept()
    finish(proc)
    msgs = conn.drain()
    assert [m["step"] for m in msgs if m["type"] == "StepTiming"] == [1, 2, 3]
    assert [m["step"] for m in msgs if m["type"] == "Progress"] == [1, 2, 3]


def test_the_fit_stops_at_the_agreed_step_with_a_checkpoint(agent):
    proc = spawn(
        FAKE_LIGHTNING
        + """
def wait_for_request(step):
    if step == 1:
        deadline = time.time() + 10
        while vigil.stop_step() is None:
            assert time.time() < deadline
            time.sleep(0.005)
t = FakeTrainer([StragglerDetectionCallback(stop_if_detected=True)],
                checkpoint_callback=FakeModelCheckpoint("/ck"))
last = fit(t, [0.0] * 10, between=wait_for_request)
print(json.dumps({"last": last, "saved": t.strategy.saved}))
""",
        child_env(agent, **AGENT_SETTINGS),
    )
    conn = agent.accept()
    while conn.next() != {"type": "Progress", "step": 1}:
        pass
    conn.send({"type": "StopRequest", "reason": "straggler", "at_step": 3})
    out, err = finish(proc)
    assert json.loads(out) == {"last": 3, "saved": ["/ck/last.ckpt"]}
    assert "asked to stop (straggler): stopping the fit at step 3" in err


def test_no_score_selected_is_an_error():
    proc = spawn(
        FAKE_LIGHTNING
        + """
try:
    StragglerDetectionCallback(calc_relative_gpu_perf=False, calc_individual_gpu_perf=False)
except ValueError as e:
    print(e)
""",
        child_env(None),
    )
    out, _ = finish(proc)
    assert "calc_relative_gpu_perf=True or calc_individual_gpu_perf=True" in out


def test_an_argument_that_is_not_a_number_is_named_not_fatal(agent):
    proc = spawn(
        FAKE_LIGHTNING
        + """
fit(FakeTrainer([StragglerDetectionCallback(report_time_interval="often")]), [0.0])
print("fit done")
""",
        child_env(agent, **AGENT_SETTINGS),
    )
    agent.accept()
    out, err = finish(proc)
    assert out.strip() == "fit done"
    assert "report_time_interval=often differs" in err and "--straggler-report-interval" in err


def test_under_the_real_agent_its_timings_are_scored_and_its_arguments_checked(tmp_path):
    """The real `vigil run`: what it exports is what the callback compares with, and the batches
    it times are what node rank 0 scores (rank 1's batches take 4x as long)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "tests"))
    from harness import base_env, events, of, run_vigil

    script = tmp_path / "train.py"
    script.write_text(
        FAKE_LIGHTNING
        + """
import os
slow = os.environ["RANK"] == "1"
cb = StragglerDetectionCallback(report_time_interval=1, gpu_relative_perf_threshold=0.7,
                                gpu_individual_perf_threshold=0.7)
# About 3 s of batches: reports come every second.
fit(FakeTrainer([cb]), [0.04 if slow else 0.01] * (75 if slow else 300))
"""
    )
    (tmp_path / "logs").mkdir()
    r = run_vigil(
        ["run", "--nproc-per-node", "2", "--straggler-report-interval", "1", "--straggler-threshold", "0.8",
         "--log-dir", "logs", "train.py"],
        cwd=tmp_path,
        env=base_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # Each rank warned once, naming the flag; the interval matched, so nothing about it.
    warnings = [l for l in r.stderr.splitlines() if "StragglerDetectionCallback:" in l]
    assert len(warnings) == 2, r.stderr[-3000:]
    assert all("`vigil run --straggler-threshold 0.7`" in w and "(0.8," in w for w in warnings), warnings
    reports = of(events(tmp_path / "logs"), "straggler_report")
    assert reports, r.stderr[-3000:]
    rec = reports[-1]
    scores = {x["rank"]: x for x in rec["ranks"]}
    assert sorted(scores) == [0, 1]
    assert scores[1]["relative"] < 0.5 and scores[0]["relative"] == 1.0
    assert rec["stragglers"] == [1]

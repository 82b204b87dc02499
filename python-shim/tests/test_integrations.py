"""vigil.compat (NVRx RankMonitorClient surface) and vigil.lightning against a fake agent."""

import json

import pytest
from conftest import child_env, finish, spawn

TIMEOUTS = {
    "type": "Timeouts",
    "initial_ms": 600000,
    "heartbeat_ms": 30000,
    "out_of_section_ms": 5000,
    "sections": [["setup", 900000], ["step", 20000], ["checkpointing", 120000]],
}


def _calc(heartbeat=False, out_of_section=False, all_sections=False, sections=()):
    return {"type": "CalculateTimeouts", "heartbeat": heartbeat, "out_of_section": out_of_section,
            "all_sections": all_sections, "sections": list(sections)}


def _answer(heartbeat=False, sections=False, out_of_section=False):
    return {"type": "TimeoutsCalculated", "heartbeat": heartbeat, "sections": sections,
            "out_of_section": out_of_section}


def test_rank_monitor_client_maps_onto_the_shim(agent):
    proc = spawn(
        """
import json, sys, time
import vigil.compat as ft
c = ft.RankMonitorClient()
try:
    c.send_heartbeat()
    sys.exit("heartbeat before init must raise")
except ft.RankMonitorClientError:
    pass
c.load_state_dict({"current_timeouts": {"heartbeat": {"initial": 1.0, "subsequent": 2.0, "were_calculated": True}}})
c.init_workload_monitoring()
c.send_heartbeat()
c.send_heartbeat({"ignored": 1})
c.start_section("step")
c.end_section("step")
c.end_all_sections()
before = [c.calculate_and_set_hb_timeouts(skip_if_not_ready=True), c.state_dict()]
try:
    c.calculate_and_set_hb_timeouts()
    sys.exit("not ready without skip_if_not_ready must raise")
except ft.RankMonitorClientError:
    pass
after = [c.calculate_and_set_hb_timeouts(), c.hb_timeouts.are_valid,
         c.calculate_and_set_section_timeouts(selected_sections=["step"]), c.state_dict()]
c.send_workload_control_request(ft.WorkloadControlRequest(ft.WorkloadAction.Continue, "fine"))
c.shutdown_workload_monitoring()
c.init_workload_monitoring()
c.send_heartbeat()
print(json.dumps({"before": before, "after": after}))
""",
        child_env(agent),
    )
    first = agent.accept()
    assert first.next()["type"] == "Register"
    assert [first.next() for _ in range(6)] == [
        _calc(),  # the announcement: this code calculates when it asks
        {"type": "Heartbeat", "step": None},
        {"type": "Heartbeat", "step": None},
        {"type": "SectionStart", "name": "step"},
        {"type": "SectionEnd", "name": "step"},
        {"type": "EndAllSections"},
    ]
    for _ in range(2):
        assert first.next() == _calc(heartbeat=True)
        first.send(_answer())
    assert first.next() == _calc(heartbeat=True)
    first.send(TIMEOUTS)
    first.send(_answer(heartbeat=True))
    assert first.next() == _calc(out_of_section=True, sections=["step"])
    first.send(_answer(sections=True, out_of_section=True))
    second = agent.accept()
    out, _ = finish(proc)
    assert first.drain() == []  # shutdown closed the first connection
    assert [m["type"] for m in second.drain()] == ["Register", "CalculateTimeouts", "Heartbeat"]
    got = json.loads(out)
    hb_loaded = {"initial": 1.0, "subsequent": 2.0, "were_calculated": True}
    assert got["before"] == [False, {"current_timeouts": {"heartbeat": hb_loaded}}]
    ok_hb, valid, ok_sections, state = got["after"]
    assert (ok_hb, valid, ok_sections) == (True, True, True)
    assert state == {
        "current_timeouts": {
            "heartbeat": {"initial": 600.0, "subsequent": 30.0, "were_calculated": True},
            "section": {
                "section": {"setup": 900.0, "step": 20.0, "checkpointing": 120.0},
                "out_of_section": 5.0,
                "calculated_sections": ["step"],
                "is_out_of_section_calculated": True,
            },
        }
    }


BLOCK_LIGHTNING = """
import sys
class _NoLightning:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("lightning", "pytorch_lightning"):
            raise ImportError("blocked for the test")
        return None
sys.meta_path.insert(0, _NoLightning())
"""


def test_lightning_callback_without_lightning_fails_only_when_created():
    proc = spawn(
        BLOCK_LIGHTNING
        + """
import vigil.lightning as vl
assert vl.LIGHTNING_AVAILABLE is False
try:
    vl.FaultToleranceCallback()
except ImportError as e:
    print(e)
else:
    sys.exit("no ImportError")
""",
        child_env(None),
    )
    out, _ = finish(proc)
    assert "needs PyTorch Lightning" in out and "lightning" in out


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

class FakeTrainer:
    # Only what the callback touches; save_checkpoint goes through the strategy, as in Lightning.
    def __init__(self, checkpoint_callback=None):
        self.strategy = FakeStrategy()
        self.checkpoint_callback = checkpoint_callback
        self.global_step = 0
        self.current_epoch = 0
        self.max_steps = 3
        self.max_epochs = None
        self.should_stop = False
    def save_checkpoint(self, path):
        assert not self.should_stop, "saved after the fit was told to stop"
        self.strategy.save_checkpoint({"global_step": self.global_step}, path)

class FakeModelCheckpoint:
    # The ModelCheckpoint surface that NeMo's PreemptionCallback uses.
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    def __init__(self, dirpath, save_last):
        self.dirpath, self.save_last, self.saved_last = dirpath, save_last, []
    def _monitor_candidates(self, trainer):
        return {"step": trainer.global_step}
    def _save_last_checkpoint(self, trainer, candidates):
        self.saved_last.append(candidates)
        trainer.save_checkpoint(self.dirpath + "/last-by-callback.ckpt")
"""


def test_lightning_callback_drives_heartbeats_sections_and_stop(agent):
    proc = spawn(
        FAKE_LIGHTNING
        + """
import json, time, vigil
from vigil.lightning import FaultToleranceCallback
cb = FaultToleranceCallback(autoresume=True, calculate_timeouts=True)
t = FakeTrainer()
cb.setup(t, None, "fit")
cb.on_train_start(t, None)
stopped_at = None
for step in range(1, 4):
    cb.on_train_batch_start(t, None, None, step - 1)
    t.global_step = step
    cb.on_train_batch_end(t, None, None, None, step - 1)
    if step == 1:
        t.strategy.save_checkpoint({}, "ckpt-1")
        deadline = time.time() + 10
        while not vigil.should_stop():
            assert time.time() < deadline
            time.sleep(0.005)
    if t.should_stop:
        stopped_at = step
        break
cb.teardown(t, None, "fit")
print(json.dumps({"stopped_at": stopped_at, "saved": t.strategy.saved}))
""",
        child_env(agent),
    )
    conn = agent.accept()
    msgs = []
    while not (msgs and msgs[-1] == {"type": "SectionEnd", "name": "checkpointing"}):
        msgs.append(conn.next())
    conn.send({"type": "StopRequest", "reason": "time limit", "at_step": 2})
    out, _ = finish(proc)
    msgs += conn.drain()
    got = json.loads(out)
    assert got == {"stopped_at": 2, "saved": ["ckpt-1"]}
    timing = [m for m in msgs if m["type"] == "StepTiming"]
    assert [m["step"] for m in timing] == [1, 2]
    assert all(0 <= m["duration_us"] < 5_000_000 for m in timing)
    assert [m for m in msgs if m["type"] != "StepTiming"] == [
        {"type": "Register", "rank": 0, "local_rank": 0, "pid": proc.pid, "cycle": 0},
        {"type": "SectionStart", "name": "setup"},
        {"type": "Heartbeat", "step": None},
        {"type": "Heartbeat", "step": None},
        {"type": "SectionEnd", "name": "setup"},
        {"type": "SectionStart", "name": "step"},
        {"type": "SectionEnd", "name": "step"},
        {"type": "Heartbeat", "step": 1},
        {"type": "HoldsSignals", "signals": (1 << 15) | (1 << 10) | (1 << 12)},  # SIGTERM, SIGUSR1, SIGUSR2
        {"type": "Progress", "step": 1},
        {"type": "SectionStart", "name": "checkpointing"},
        {"type": "SectionEnd", "name": "checkpointing"},
        {"type": "SectionStart", "name": "step"},
        {"type": "SectionEnd", "name": "step"},
        {"type": "Heartbeat", "step": 2},
        {"type": "Progress", "step": 2},
        {"type": "EndAllSections"},
        {"type": "Heartbeat", "step": None},
        # Stopped by the agent before max_steps: not finished, so no Finished message.
    ]


def test_lightning_callback_marks_a_completed_fit_finished(agent):
    proc = spawn(
        FAKE_LIGHTNING
        + """
from vigil.lightning import FaultToleranceCallback
cb = FaultToleranceCallback(autoresume=True, calculate_timeouts=False)
t = FakeTrainer()
cb.setup(t, None, "fit")
for step in range(1, 4):
    cb.on_train_batch_start(t, None, None, step - 1)
    t.global_step = step
    cb.on_train_batch_end(t, None, None, None, step - 1)
cb.teardown(t, None, "fit")
""",
        child_env(agent),
    )
    conn = agent.accept()
    finish(proc)
    msgs = conn.drain()
    assert [m["step"] for m in msgs if m["type"] == "Heartbeat"] == [None, 1, 2, 3, None]
    # calculate_timeouts=False: the agent is told to leave the configured timeouts alone.
    assert msgs[1]["type"] == "CalculateTimeouts" and not any(
        msgs[1][k] for k in ("heartbeat", "out_of_section", "all_sections", "sections"))
    assert msgs[-1] == {"type": "Finished"}


@pytest.mark.parametrize(
    "how,expected",
    [
        ("save_last", ["/ck/last-by-callback.ckpt"]),  # NeMo's way: the callback's own last save
        ("dirpath", ["/ck/last.ckpt"]),  # save_last off: trainer.save_checkpoint to <dirpath>/last.ckpt
        ("path", ["/explicit/stop.ckpt"]),  # stop_checkpoint_path wins
    ],
)
def test_lightning_callback_saves_at_the_agreed_step_then_stops_the_fit(agent, how, expected):
    proc = spawn(
        FAKE_LIGHTNING
        + "how = %r\n" % how
        + """
import json, time, vigil
from vigil.lightning import FaultToleranceCallback
mc = FakeModelCheckpoint("/ck", save_last=(how == "save_last"))
cb = FaultToleranceCallback(stop_checkpoint_path="/explicit/stop.ckpt" if how == "path" else None)
t = FakeTrainer(checkpoint_callback=mc)
t.max_steps = 10
cb.setup(t, None, "fit")
stopped_at = None
for step in range(1, 11):
    cb.on_train_batch_start(t, None, None, step - 1)
    t.global_step = step
    cb.on_train_batch_end(t, None, None, None, step - 1)
    if step == 1:
        deadline = time.time() + 10
        while vigil.stop_step() is None:
            assert time.time() < deadline
            time.sleep(0.005)
    if t.should_stop:
        stopped_at = step
        break
cb.teardown(t, None, "fit")
print(json.dumps({"stopped_at": stopped_at, "saved": t.strategy.saved, "by_callback": mc.saved_last}))
""",
        child_env(agent),
    )
    conn = agent.accept()
    msgs = []
    while {"type": "Progress", "step": 1} not in msgs:
        msgs.append(conn.next())
    conn.send({"type": "StopRequest", "reason": "time limit", "at_step": 3})
    out, _ = finish(proc)
    msgs += conn.drain()
    got = json.loads(out)
    assert got["stopped_at"] == 3 and got["saved"] == expected
    assert got["by_callback"] == ([{"step": 3}] if how == "save_last" else [])
    assert [m["step"] for m in msgs if m["type"] == "Progress"] == [1, 2, 3]
    # The save is the checkpointing section, right after step 3 was reported, and no Finished.
    tail = [m for m in msgs if m["type"] not in ("StepTiming",)]
    i = tail.index({"type": "Progress", "step": 3})
    assert tail[i + 1 : i + 3] == [
        {"type": "SectionStart", "name": "checkpointing"},
        {"type": "SectionEnd", "name": "checkpointing"},
    ]
    assert {"type": "Finished"} not in msgs


def test_lightning_callback_without_a_checkpoint_callback_stops_and_says_it_did_not_save(agent):
    proc = spawn(
        FAKE_LIGHTNING
        + """
import json, logging, time, vigil
from vigil.lightning import FaultToleranceCallback
logging.basicConfig(level=logging.WARNING, format="%(message)s")
cb = FaultToleranceCallback()
t = FakeTrainer()
cb.setup(t, None, "fit")
cb.on_train_batch_start(t, None, None, 0)
t.global_step = 1
cb.on_train_batch_end(t, None, None, None, 0)
deadline = time.time() + 10
while vigil.stop_step() is None:
    assert time.time() < deadline
    time.sleep(0.005)
cb.on_train_batch_start(t, None, None, 1)
t.global_step = 2
cb.on_train_batch_end(t, None, None, None, 1)
print(json.dumps([t.should_stop, t.strategy.saved]))
""",
        child_env(agent),
    )
    conn = agent.accept()
    while conn.next() != {"type": "Progress", "step": 1}:
        pass
    conn.send({"type": "StopRequest", "reason": "SIGTERM", "at_step": 2})
    out, err = finish(proc)
    assert json.loads(out) == [True, []]
    assert "stopping without a checkpoint" in err and "stop_checkpoint_path" in err


def test_an_empty_selection_of_sections_calculates_none_as_nvrx(agent):
    # NVRx: `selected_sections=[]` selects no section (only the out-of-section timeout here);
    # None selects every section observed.
    proc = spawn(
        """
import json
import vigil.compat as ft
c = ft.RankMonitorClient()
c.init_workload_monitoring()
print(json.dumps([c.calculate_and_set_section_timeouts(selected_sections=[]),
                  c.calculate_and_set_section_timeouts(selected_sections=[], calc_out_of_section=False),
                  sorted(c.section_timeouts.calculated_sections)]))
""",
        child_env(agent),
    )
    conn = agent.accept()
    assert conn.next()["type"] == "Register"
    assert conn.next() == _calc()
    assert conn.next() == _calc(out_of_section=True)
    conn.send(_answer(out_of_section=True))
    assert conn.next() == _calc()
    conn.send(_answer())
    out, _ = finish(proc)
    assert json.loads(out) == [True, True, []]

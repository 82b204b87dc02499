"""vigil.restartable's pure parts: the generation a process starts at, the state a replaced rank
receives, interrupting the main thread. (The whole path, with vigil and real torch ranks, is
tests/e2e/test_inprocess.py.)"""
import threading
import time

import pytest

import vigil
from vigil import _inprocess as ip


def test_a_state_is_sent_as_a_skeleton_and_its_tensors_and_rebuilt_the_same():
    torch = pytest.importorskip("torch")
    state = {"step": 7, "w": torch.arange(6.0).reshape(2, 3), "opt": [torch.ones(2), ("adam", 0.9)],
             "note": "plain"}
    tensors = []
    skeleton = ip._strip(state, tensors)
    assert len(tensors) == 2 and skeleton["step"] == 7 and skeleton["opt"][1] == ("adam", 0.9)
    slots = list(ip._slots(skeleton))
    assert [s.index for s in slots] == [0, 1]
    got = [t.clone() for t in tensors]
    back = ip._fill(skeleton, got)
    assert back["step"] == 7 and back["note"] == "plain"
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["opt"][0], state["opt"][0])


def test_generation_zero_and_a_state_no_peer_holds():
    g0 = ip.Generation(0, [])
    s = {"step": 1}
    assert g0.recover(s) is s, "nothing was replaced: every rank keeps its state"
    g1 = ip.Generation(1, [2])
    assert g1.recover(s, from_peer=False) is None, "every rank reloads its checkpoint"
    assert g1.replaced == (2,) and "generation=1" in repr(g1)


def no_agent_no_watcher(monkeypatch):
    monkeypatch.setattr(ip, "_announce", lambda g: None)
    monkeypatch.setattr(ip, "_install_prefix", lambda g: None)
    monkeypatch.setattr(ip, "_start_watcher", lambda: None)
    monkeypatch.setattr(ip, "_teardown", lambda *a: None)


def test_a_generation_interrupts_the_function_at_its_next_step_boundary_and_it_runs_again(monkeypatch):
    """The agent's message (here handed over as the reader would) interrupts the function at
    its next `should_stop`/`heartbeat`, once the step it was in is done (its state updated), and
    the wrapper calls it again with the next generation; no agent: vigil calls are no-ops."""
    no_agent_no_watcher(monkeypatch)
    calls, begun, done = [], [], []

    @vigil.restartable
    def train(gen):
        calls.append((gen.generation, gen.replaced))
        if gen.generation == 0:
            threading.Timer(0.2, ip.on_generation, [{"generation": 1, "replaced": [3]}]).start()
            step = 0
            while True:
                begun.append(step)
                time.sleep(0.01)  # the step's work, where the message comes
                done.append(step)
                vigil.heartbeat(step) if step % 2 else vigil.should_stop(step)
                step += 1
        return "done"

    assert train() == "done"
    assert calls == [(0, ()), (1, (3,))]
    # No step was cut short: every step begun was finished before the interrupt.
    assert len(done) > 5 and begun == done, (begun[-3:], done[-3:])


def test_a_function_that_reaches_no_step_boundary_is_interrupted_where_it_is(monkeypatch):
    """User code that waits (or a long compute) is interrupted by the watcher once
    `STEP_BOUNDARY_WAIT_S` has passed (here the watcher's check is run by a timer)."""
    no_agent_no_watcher(monkeypatch)
    monkeypatch.setattr(ip, "STEP_BOUNDARY_WAIT_S", 0.1)
    calls = []

    @vigil.restartable
    def train(gen):
        calls.append(gen.generation)
        if gen.generation == 0:
            threading.Timer(0.2, ip.on_generation, [{"generation": 1, "replaced": [3]}]).start()
            threading.Timer(0.1, ip._interrupt_if_due).start()  # too early: nothing announced
            threading.Timer(0.6, ip._interrupt_if_due).start()
            while True:  # Python code: the interrupt is delivered here
                time.sleep(0.01)
        return "done"

    assert train() == "done"
    assert calls == [0, 1]


def test_an_error_of_the_rank_itself_is_raised_when_no_generation_comes(monkeypatch):
    monkeypatch.setattr(ip, "_announce", lambda g: None)
    monkeypatch.setattr(ip, "_start_watcher", lambda: None)
    monkeypatch.setattr(ip, "FAILURE_WAIT_S", 0.1)

    @vigil.restartable
    def train(gen):
        raise RuntimeError("a bug of the rank's own")

    with pytest.raises(RuntimeError, match="own"):
        train()
    with pytest.raises(ValueError):
        vigil.restartable(lambda gen: (_ for _ in ()).throw(ValueError("not waited for")))()


def test_an_error_not_from_a_collective_fails_the_rank_at_once(monkeypatch, tmp_path):
    """docs/reliability.md violation 7: torch.save's own RuntimeError (here: no such directory;
    in the soak: a full one) is not a collective's: no generation is waited for."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(ip, "_announce", lambda g: None)
    monkeypatch.setattr(ip, "_start_watcher", lambda: None)
    monkeypatch.setattr(ip, "_pending", None)
    waited = []
    monkeypatch.setattr(ip, "_wait_for_generation", lambda s: waited.append(s) or False)

    @vigil.restartable
    def train(gen):
        torch.save({"w": torch.ones(2)}, str(tmp_path / "gone" / "ckpt.pt"))

    with pytest.raises(RuntimeError):
        train()
    assert waited == [], "a generation was waited for"

    @vigil.restartable
    def collective(gen):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:561] Connection closed by peer")

    with pytest.raises(RuntimeError):
        collective()
    assert waited == [ip.FAILURE_WAIT_S], "a collective's failure waits for the agent's word"


def test_a_collective_error_is_told_apart_from_the_rank_own():
    def raised(msg):
        try:
            raise RuntimeError(msg)
        except RuntimeError as e:
            return e

    assert ip._from_collective(raised("[gloo/transport/tcp/pair.cc:561] Connection closed by peer"))
    assert ip._from_collective(raised("NCCL communicator was aborted"))
    assert not ip._from_collective(raised("PytorchStreamWriter failed writing file data/0"))
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    try:
        dist.all_reduce(torch.ones(1))  # no process group: raised under torch.distributed
    except (RuntimeError, ValueError) as e:
        err = e
    assert isinstance(err, ValueError) or ip._from_collective(err)


class _Counter:
    def __init__(self):
        self.n = 0

    def collect(self, *args):
        self.n += 1
        return 0


def test_the_teardown_collects_only_when_something_still_holds_the_group(monkeypatch):
    """The group freed by `destroy_process_group()` closes its connections at once: no full
    collection (half a second with torch loaded). One still held (as a traceback's frames
    would) gets the collection."""
    pytest.importorskip("torch")
    import socket

    import torch.distributed as dist

    counter = _Counter()
    monkeypatch.setattr(ip, "_gc", counter)
    held = []
    for hold in (False, True):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
        if hold:
            held.append(dist.distributed_c10d._get_default_group())
        ip._teardown()
        assert not dist.is_initialized()
        assert counter.n == (1 if hold else 0), (hold, counter.n)

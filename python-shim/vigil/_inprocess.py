"""In-process restarts (``vigil run --in-process-restarts N``; docs/inprocess.md).

``vigil.restartable`` wraps the training function. When the agent announces a new generation
(another rank failed and is being replaced by a new process), the function is interrupted in the
main thread (an exception raised there): at its next step boundary (``vigil.heartbeat``,
``vigil.should_stop``), or where a collective on the dead peer fails, or, when neither comes
within ``STEP_BOUNDARY_WAIT_S``, wherever it is (a watcher thread raises it); the wrapper drops the default process
group and calls the function again with the new :class:`Generation`; the next
``init_process_group()`` uses a fresh store prefix. ``gen.recover(state)`` then hands a
survivor's state to the replaced ranks.
"""

import ctypes as _ctypes
import functools as _functools
import gc as _gc
import os as _os
import threading as _threading
import time as _time
import weakref as _weakref

#: How often the watcher thread looks for the agent's messages.
WATCH_EVERY = 0.02
#: How long a rank whose function failed with a ``RuntimeError`` (what a collective raises when a
#: peer died) waits for the agent's word that a new generation begins before it fails for good.
FAILURE_WAIT_S = 10.0
#: How long a survivor's main thread may run on once a generation is announced, to finish the
#: step it is in (its state updated) up to its next ``vigil.heartbeat``/``vigil.should_stop``,
#: before it is interrupted wherever it is: interrupted mid-step, it would do that step again.
STEP_BOUNDARY_WAIT_S = 1.0


class GenerationInterrupt(BaseException):
    """Raised in the main thread when a new generation begins; ``vigil.restartable`` catches it.

    A ``BaseException`` so that ``except Exception`` in the training loop does not swallow it."""


class Generation:
    """What the training function is called with: ``generation`` (0 in a fresh process, then
    1, 2, ... after each in-process restart of the attempt) and ``replaced`` (the global ranks
    that are new processes in this generation; empty in generation 0)."""

    def __init__(self, generation, replaced):
        self.generation = generation
        self.replaced = tuple(replaced)

    def __repr__(self):
        return "Generation(generation=%d, replaced=%r)" % (self.generation, self.replaced)

    @property
    def is_replaced(self):
        """This process was started in this generation, in a failed rank's place."""
        return _rank() in self.replaced

    def recover(self, state, from_peer=True):
        """The state to go on with in this generation. Call it on every rank, after
        ``init_process_group()``.

        Survivors get ``state`` back unchanged. A replaced rank gets the state of the lowest
        surviving rank: plain Python values and tensors (in dicts, lists, tuples), sent over
        the new default process group. Nothing is read from a checkpoint.

        ``from_peer=False`` says that no peer holds this rank's state (sharded state without a
        replica): after a replacement every rank gets ``None`` and must reload its checkpoint.
        In generation 0 every rank gets ``state`` back."""
        if not self.replaced:
            return state
        if not from_peer:
            return None
        import torch
        import torch.distributed as dist

        world = dist.get_world_size()
        me = dist.get_rank()
        survivors = [r for r in range(world) if r not in self.replaced]
        if not survivors:
            return None
        src = survivors[0]
        tensors = []
        skeleton = _strip(state, tensors) if me == src else None
        device = _device(dist)
        skeleton = _broadcast_object(dist, skeleton, src, me, device)
        got = []
        for slot in _slots(skeleton):
            if me == src:
                t = tensors[slot.index].detach().to(device).contiguous()
            else:
                t = torch.empty(slot.shape, dtype=slot.dtype, device=device)
            dist.broadcast(t, src=src)
            got.append(t)
        if me in self.replaced:
            return _fill(skeleton, got)
        return state


def _broadcast_object(dist, obj, src, me, device):
    """``obj`` of rank ``src`` on every rank (pickled; torch's own needs numpy)."""
    import pickle

    import torch

    if me == src:
        data = pickle.dumps(obj)
        size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(size, src=src)
    if me == src:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(buf, src=src)
    if me == src:
        return obj
    return pickle.loads(bytes(buf.cpu().tolist()))


class _Slot:
    """A tensor's place in a state sent to replaced ranks."""

    def __init__(self, index, shape, dtype, device, requires_grad):
        self.index = index
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.requires_grad = requires_grad


def _strip(x, tensors):
    import torch

    if isinstance(x, torch.Tensor):
        tensors.append(x)
        return _Slot(len(tensors) - 1, tuple(x.shape), x.dtype, str(x.device), x.requires_grad)
    if isinstance(x, dict):
        return type(x)((k, _strip(v, tensors)) for k, v in x.items())
    if isinstance(x, list):
        return [_strip(v, tensors) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_strip(v, tensors) for v in x)
    return x


def _slots(x):
    if isinstance(x, _Slot):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _slots(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _slots(v)


def _fill(x, got):
    if isinstance(x, _Slot):
        t = got[x.index].to(x.device)
        return t.requires_grad_(x.requires_grad) if x.requires_grad else t
    if isinstance(x, dict):
        return type(x)((k, _fill(v, got)) for k, v in x.items())
    if isinstance(x, list):
        return [_fill(v, got) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_fill(v, got) for v in x)
    return x


def _device(dist):
    if dist.get_backend() == "nccl":
        import torch

        return torch.device("cuda", torch.cuda.current_device())
    return "cpu"


def _rank():
    try:
        return int(_os.environ.get("RANK") or 0)
    except ValueError:
        return 0


# The wrapper's state, shared with the watcher thread.
_lock = _threading.Lock()
_pending = None  # (generation, replaced) the agent announced, not yet begun
_in_fn = False  # the main thread runs the training function (an interrupt may be raised)
_main_tid = _threading.main_thread().ident
_watcher = None
_prefix_installed = False
_raise_at = None  # when the watcher interrupts a main thread that reached no step boundary


def on_generation(msg):
    """The agent's ``Generation`` message (from the shim's reader, in any thread)."""
    global _pending, _raise_at
    with _lock:
        _pending = (msg["generation"], tuple(msg["replaced"]))
        if _in_fn and _raise_at is None:
            _raise_at = _time.monotonic() + STEP_BOUNDARY_WAIT_S
    _abort_if_nccl()


def at_step_boundary():
    """Called by ``vigil.heartbeat`` and ``vigil.should_stop``: in the main thread of a function
    under ``vigil.restartable``, once a generation is announced, the interrupt comes here, where
    the step before it is done. Costs two reads otherwise."""
    if _pending is None or not _in_fn or _threading.get_ident() != _main_tid:
        return
    raise GenerationInterrupt


def _interrupt_if_due():
    """The watcher's fallback: a main thread that reached no step boundary within
    ``STEP_BOUNDARY_WAIT_S`` (user code that waits, a long compute) is interrupted where it is."""
    global _raise_at
    with _lock:
        due = _raise_at is not None and _in_fn and _time.monotonic() >= _raise_at
        if due:
            _raise_at = None
    if due:
        _ctypes.pythonapi.PyThreadState_SetAsyncExc(
            _ctypes.c_ulong(_main_tid), _ctypes.py_object(GenerationInterrupt)
        )


def _abort_if_nccl():
    """A collective blocked on a dead peer must return. Gloo returns on its own (the peer's
    connections close: vigil SIGKILLs a hung rank too); NCCL's communicators are aborted here,
    from the watcher thread, as torch's process-group abort does (not tested here: no GPU)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
            from torch.distributed.distributed_c10d import _abort_process_group

            _abort_process_group()
    except Exception:  # noqa: BLE001 - the wrapper's teardown tries again
        pass


def _watch():
    import vigil

    while True:
        _time.sleep(WATCH_EVERY)
        try:
            vigil._poll()
        except GenerationInterrupt:
            pass
        _interrupt_if_due()
        if vigil._disabled is not None:
            return


def _start_watcher():
    global _watcher
    if _watcher is None or not _watcher.is_alive():
        _watcher = _threading.Thread(target=_watch, name="vigil-generation-watch", daemon=True)
        _watcher.start()


def _socket_inodes():
    """{inode: fd} of this process's sockets (Linux's /proc; empty elsewhere)."""
    out = {}
    try:
        names = _os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            link = _os.readlink("/proc/self/fd/" + name)
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor among them)
        if link.startswith("socket:["):
            out[link] = int(name)
    return out


def _shut_down_left_connections(before):
    """Shuts down (without closing the descriptors) the TCP connections this generation opened
    that are still open after its group was dropped, but the one to the store: the old group's
    connections, which something in C++ still holds. DDP does: after its all-reduce failed in
    ``backward()``, the gloo context outlives the process group's destruction and a full
    collection, so a peer blocked in that all-reduce in C (where no interrupt lands) would wait
    for gloo's timeout (30 minutes) instead of failing and coming back to its wrapper
    (docs/reliability.md violation 9)."""
    import socket

    try:
        store_port = int(_os.environ.get("MASTER_PORT") or 0)
    except ValueError:
        store_port = 0
    for inode, fd in _socket_inodes().items():
        if inode in before:
            continue
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                peer = s.getpeername()
            except OSError:
                continue  # a listener, or not connected
            if peer[1] == store_port:
                continue
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.detach()


def _teardown(before=None):
    """Drops the default process group, so that the next ``init_process_group()`` builds a
    fresh one and peers blocked on this rank see its connections close.

    The connections close when the group is freed: at once, unless something of the call that
    was left (a traceback's frames) still holds it; only then is a full collection run (with
    torch imported it takes half a second of a loaded machine, on the recovery's critical
    path)."""
    group = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            group = _weak_default_group(dist)
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a broken group is what is being dropped
        pass
    if group is None or group() is not None:
        _gc.collect()
    if before is not None:
        _shut_down_left_connections(before)


def _weak_default_group(dist):
    """A weak reference to the default group; None where there is none to be had (then the
    caller collects)."""
    try:
        return _weakref.ref(dist.distributed_c10d._get_default_group())
    except Exception:  # noqa: BLE001 - a torch without it, a group without weak references
        return None


def _install_prefix(generation):
    """From generation 1 on, ``init_process_group()`` with ``env://`` under vigil's store gets
    keys of its own: ``/vigil/attempt_<restart count>/generation_<g>/``; the last
    generation's keys would otherwise meet the new group's."""
    global _prefix_installed
    import importlib

    from torch.distributed import PrefixStore

    # `torch.distributed.rendezvous` the attribute is a function; the module holds the handlers.
    rdzv = importlib.import_module("torch.distributed.rendezvous")

    _os.environ["VIGIL_GENERATION"] = str(generation)
    if _prefix_installed:
        return
    original = rdzv._rendezvous_handlers["env"]

    def env_handler(url, **kwargs):
        g = _os.environ.get("VIGIL_GENERATION", "0")
        for store, rank, world in original(url, **kwargs):
            if g != "0":
                attempt = _os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
                store = PrefixStore("/vigil/attempt_%s/generation_%s/" % (attempt, g), store)
            yield store, rank, world

    rdzv._rendezvous_handlers["env"] = env_handler
    _prefix_installed = True


def _announce(generation):
    import vigil

    from . import _protocol

    vigil._send(_protocol.encode_restartable(generation))


def _wait_for_generation(seconds):
    # The watcher thread reads the agent's messages.
    until = _time.monotonic() + seconds
    while _time.monotonic() < until:
        with _lock:
            if _pending is not None:
                return True
        _time.sleep(WATCH_EVERY)
    with _lock:
        return _pending is not None


#: Where a collective's failure is raised from (the torch.distributed API, DDP's forward and
#: backward hooks) and what the backends' errors say.
_COLLECTIVE_PATHS = ("/torch/distributed/", "/torch/nn/parallel/", "/torch/autograd/")
_COLLECTIVE_WORDS = ("gloo", "nccl", "c10d", "processgroup", "connection closed by peer",
                     "connection reset by peer", "broken pipe")


def _from_collective(e):
    """Whether the ``RuntimeError`` ``e`` may be a collective's failure (then the agent's word of
    a new generation is worth waiting for): raised under torch.distributed, DDP or autograd
    (DDP's all-reduce fails in ``backward()``), or naming a backend. Anything else (torch.save
    into a full directory, a bug of the rank's own) fails the rank at once."""
    text = str(e).lower()
    if any(w in text for w in _COLLECTIVE_WORDS):
        return True
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if any(p in name for p in _COLLECTIVE_PATHS):
            return True
        tb = tb.tb_next
    return False


def restartable(fn):
    """Runs ``fn(gen, *args, **kwargs)`` and, after a failure elsewhere in the job, again in this
    process with the next :class:`Generation` (docs/inprocess.md). Returns what ``fn`` returns."""

    @_functools.wraps(fn)
    def run(*args, **kwargs):
        global _pending, _in_fn, _raise_at
        env_g = _os.environ.get("VIGIL_GENERATION") or "0"
        replaced = [int(r) for r in (_os.environ.get("VIGIL_REPLACED") or "").split(",") if r]
        gen = Generation(int(env_g), replaced)
        if gen.generation:
            _install_prefix(gen.generation)
        _start_watcher()
        while True:
            _announce(gen.generation)
            sockets_before = _socket_inodes()
            failure = None
            try:
                with _lock:
                    _in_fn = _pending is None
                    if not _in_fn:
                        raise GenerationInterrupt
                try:
                    return fn(gen, *args, **kwargs)
                finally:
                    with _lock:
                        _in_fn = False
                        _raise_at = None
                    # An interrupt that was on its way is not for the wrapper.
                    _ctypes.pythonapi.PyThreadState_SetAsyncExc(_ctypes.c_ulong(_main_tid), None)
            except GenerationInterrupt:
                pass
            except RuntimeError as e:
                # A collective whose peer died raises before the agent's word may have come;
                # any other error (a full disk under torch.save) is the rank's own, at once.
                with _lock:
                    announced = _pending is not None
                if not announced and not _from_collective(e):
                    raise
                if not _wait_for_generation(FAILURE_WAIT_S):
                    raise
                failure = e
            del failure
            _teardown(sockets_before)
            with _lock:
                g, replaced = _pending
                _pending = None
            gen = Generation(g, replaced)
            _install_prefix(g)

    return run

"""Rank-side shim of the vigil agent: heartbeats, sections and stop requests from a training loop.

Every call is safe outside vigil (it does nothing and warns once) and never raises into the
training loop when the agent goes away (it warns once and becomes a no-op). The connection to the
Unix socket named by ``VIGIL_SOCKET`` is opened on the first call; the rank registers itself with
``RANK``, ``LOCAL_RANK``, its pid and ``TORCHELASTIC_RESTART_COUNT``.

    import vigil
    for step in range(start, total):
        with vigil.section("step"):
            train_step(step)
        vigil.heartbeat(step)
        if vigil.should_stop(step):  # every rank of the job gets True at the same step
            save_checkpoint(step); break
"""

import _thread
import operator as _operator
import os as _os
import signal as _signal
import sys as _sys
import time as _time
import warnings as _warnings
from struct import error as _StructError

from . import _inprocess, _protocol
from ._inprocess import Generation, GenerationInterrupt, restartable

__version__ = "0.1.0"
__all__ = [
    "VigilWarning",
    "heartbeat",
    "section",
    "start_section",
    "end_section",
    "end_all_sections",
    "step_timing",
    "should_stop",
    "stop_step",
    "stop_reason",
    "timeouts",
    "mark_finished",
    "is_connected",
    "calculate_timeouts",
    "close",
    "restartable",
    "Generation",
    "GenerationInterrupt",
]

SOCKET_ENV = "VIGIL_SOCKET"
PROTOCOL_ENV = "VIGIL_PROTOCOL"
STACK_FILE_ENV = "VIGIL_STACK_FILE"
#: Written to the stack file at import: which of the dumped threads is the main one.
MAIN_THREAD_LINE = "vigil: main thread of pid %d is 0x%016x\n"
#: Longest a message that must not be dropped (section, timing, finished) waits for buffer space.
SEND_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0


class VigilWarning(RuntimeWarning):
    """Emitted (once per process) when vigil calls become no-ops."""


_HB = _protocol.HEARTBEAT_FRAME
_hb_step_frame = _protocol.heartbeat_step_frame
_progress_frame = _protocol.progress_frame
_step_timing_frame = _protocol.step_timing_frame
_getpid = _os.getpid

_sock = None  # connected non-blocking socket, owned by process _pid
_pid = None
_flags = 0  # MSG_NOSIGNAL where available: a vanished agent must not SIGPIPE the rank
_disabled = None  # why the shim is a no-op for good; None while usable
_warned = False
_bad_step_warned = False
_bad_stop_step_warned = False
_poller = None  # select.poll on _sock: a cheap "anything to read?" before recv
_progress_sent = None  # the step last sent in Progress on the current connection
_lock = _thread.allocate_lock()
_decoder = None
_stop_requested = False
# A rank that calls should_stop(step) stops at the agreed step, so a stop signal sent to every
# process of a Slurm step (preemption, `scancel --signal`, `--signal` without `B:`) must not kill
# it first: should_stop(step) holds SIGTERM/SIGUSR1/SIGUSR2 (where they have their default action),
# tells the agent which it holds (a stop after a failure then ends this rank with SIGKILL, at
# once) and, when one arrives, tells the agent (the job then stops at one step, as for a signal to
# the agent) and waits for the agent's stop step, at most SIGNAL_WAIT seconds, then stops on its
# own.
SIGNAL_WAIT = 10.0
# should_stop looks for the agent's messages at most this often (a poll is a system call; the
# stop step leaves a second of steps for the request to arrive, so a millisecond costs nothing).
POLL_EVERY = 0.001
_poll_due = 0.0
_monotonic = _time.monotonic
_signals_held = False
_signalled_at = None
_signal_received = None  # the first held signal that arrived, until the agent was told
_stop_reason = None
_stop_step = None
_timeouts = None
_calc_answers = []  # TimeoutsCalculated messages not yet taken by calculate_timeouts()
_stack_file = None


def _warn(message):
    global _warned
    if _warned:
        return
    _warned = True
    depth, f = 2, _sys._getframe(1)
    while f is not None and (f.f_globals.get("__name__") or "").split(".")[0] == __name__:
        depth += 1
        f = f.f_back
    _warnings.warn("vigil: " + message, VigilWarning, stacklevel=depth)


def _disable(reason, warn_now=True):
    global _disabled
    if _disabled is None:
        _disabled = reason
    if warn_now:
        _warn(_disabled)


def _env_u32(name):
    try:
        v = int(_os.environ.get(name) or 0)
    except ValueError:
        return 0
    return v if 0 <= v < 2**32 else 0


def _connect():
    """The usable socket, connecting (and registering) on first use; None when disabled."""
    global _sock, _pid, _flags, _decoder, _poller, _progress_sent
    if _disabled is not None:
        if not _warned:
            _warn(_disabled)
        return None
    with _lock:
        if _sock is not None:
            if _pid == _getpid():
                return _sock
            _drop_inherited_connection()
            _disable(_disabled)
            return None
        if _disabled is not None:
            return None
        path = _os.environ.get(SOCKET_ENV)
        if not path:
            _disable(SOCKET_ENV + " is not set (not running under the vigil agent); vigil calls do nothing")
            return None
        mismatch = _protocol.version_mismatch(_os.environ.get(PROTOCOL_ENV))
        if mismatch:
            _disable(mismatch + "; vigil calls do nothing")
            return None
        import socket

        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(CONNECT_TIMEOUT_S)
            s.connect(path)
            s.sendall(
                _protocol.encode_register(
                    _env_u32("RANK"),
                    _env_u32("LOCAL_RANK"),
                    _getpid(),
                    _env_u32("TORCHELASTIC_RESTART_COUNT"),
                )
            )
            s.setblocking(False)
        except OSError as e:
            s.close()
            _disable("cannot reach the vigil agent at %s (%s); vigil calls do nothing" % (path, e))
            return None
        _flags = getattr(socket, "MSG_NOSIGNAL", 0)
        _decoder = _protocol.agent_decoder()
        _progress_sent = None
        _poller = None
        try:
            import select

            _poller = select.poll()
            _poller.register(s, select.POLLIN)
        except (ImportError, AttributeError, OSError):
            pass  # no poll(): every read goes straight to recv
        _pid = _getpid()
        _sock = s
        return s


def _drop_inherited_connection():
    global _sock
    s, _sock = _sock, None
    if s is not None:
        # close() only drops this process's descriptor; the parent's connection is untouched.
        s.close()
    _disable(
        "this process was forked from a rank connected to vigil; it must not speak for that rank, "
        "so vigil calls are ignored here",
        warn_now=False,
    )


def _after_fork_in_child():
    global _lock
    _lock = _thread.allocate_lock()
    if _sock is not None:
        _drop_inherited_connection()


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)


def _broken(cause):
    global _sock
    s, _sock = _sock, None
    if s is not None:
        try:
            s.close()
        except OSError:
            pass
    _disable("lost the connection to the vigil agent (%s); vigil calls are now no-ops" % (cause,))


def _finish(s, frame, sent):
    """Sends the rest of a frame with a bounded wait: a half-sent frame would corrupt the stream."""
    try:
        s.settimeout(SEND_TIMEOUT_S)
        s.sendall(memoryview(frame)[sent:], _flags)
        s.setblocking(False)
    except OSError as e:
        _broken("the agent stopped reading: %s" % (e,))
        return False
    return True


def _send(frame):
    s = _sock
    if s is None or _pid != _getpid():
        s = _connect()
        if s is None:
            return False
    try:
        sent = s.send(frame, _flags)
    except BlockingIOError:
        sent = 0
    except OSError as e:
        _broken(e)
        return False
    if sent != len(frame):
        return _finish(s, frame, sent)
    return True


def heartbeat(step=None):
    """Tells the agent this rank is alive, optionally at training step ``step`` (an int >= 0).

    Fire and forget: when the agent is not reading (socket buffer full) the heartbeat is dropped.
    """
    # No pid check on this path: the os.register_at_fork hook clears _sock in forked children.
    s = _sock
    if s is None:
        s = _connect()
        if s is None:
            if _inprocess._pending is not None:
                _inprocess.at_step_boundary()
            return
    try:
        if step is None:
            sent = s.send(_HB, _flags)
            if sent != 8:
                _finish(s, _HB, sent)
        else:
            frame = _hb_step_frame(step)
            sent = s.send(frame, _flags)
            if sent != 16:
                _finish(s, frame, sent)
    except BlockingIOError:
        pass
    except OSError as e:
        _broken(e)
    except _StructError:
        _bad_step(step)
    if _inprocess._pending is not None:
        _inprocess.at_step_boundary()


def _bad_step(step):
    global _bad_step_warned
    if not _bad_step_warned:
        _bad_step_warned = True
        _warnings.warn(
            "vigil: heartbeat step must be an int in [0, 2**64), got %r; sent without a step" % (step,),
            VigilWarning,
            stacklevel=3,
        )
    heartbeat()


def start_section(name):
    """Opens the named section (e.g. ``"step"``, ``"checkpointing"``); names over 255 UTF-8 bytes are cut."""
    _send(_protocol.encode_section_start(name))


def end_section(name):
    """Closes the named section."""
    _send(_protocol.encode_section_end(name))


def end_all_sections():
    """Closes every open section."""
    _send(_protocol.END_ALL_SECTIONS_FRAME)


class _Section:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        start_section(self.name)
        return self

    def __exit__(self, exc_type, exc, tb):
        end_section(self.name)
        return False


def section(name):
    """Context manager wrapping a block in the named section."""
    return _Section(name)


def step_timing(step, seconds):
    """Reports that training step ``step`` took ``seconds`` (used for straggler detection)."""
    try:
        # The common case (int step, float seconds) packs directly: this runs once per step and
        # should cost what heartbeat(step) costs (bench/shim_bench.py).
        frame = _step_timing_frame(step, round(seconds * 1e6))
    except (_StructError, TypeError, ValueError, OverflowError):
        try:
            us = int(round(float(seconds) * 1e6))
            frame = _step_timing_frame(int(step), min(max(us, 0), 2**64 - 1))
        except (_StructError, TypeError, ValueError, OverflowError):
            _warnings.warn("vigil: bad step_timing(%r, %r) ignored" % (step, seconds), VigilWarning, stacklevel=2)
            return
    # As heartbeat(): no pid check (the fork hook clears _sock); unlike it, never dropped.
    s = _sock
    if s is None:
        s = _connect()
        if s is None:
            return
    try:
        sent = s.send(frame, _flags)
    except BlockingIOError:
        sent = 0
    except OSError as e:
        _broken(e)
        return
    if sent != 24:
        _finish(s, frame, sent)


def _workload_control(action, description):
    """NVRx's workload control request (``vigil.compat``): 1 excludes this node, 2 shuts down."""
    _send(_protocol.encode_workload_control(int(action), str(description)))


def mark_finished():
    """Tells the agent training is complete: the job must not be requeued."""
    _send(_protocol.FINISHED_FRAME)


def _poll():
    """Reads whatever the agent sent, without blocking."""
    global _stop_requested, _stop_reason, _stop_step, _timeouts
    s = _sock
    if s is None or _pid != _getpid():
        s = _connect()
        if s is None:
            return
    p = _poller
    # poll(0) costs a third of a recv that raises BlockingIOError, and nothing is waiting almost
    # every time. A closed or replaced descriptor reports POLLNVAL and takes the recv path.
    if p is not None:
        try:
            if not p.poll(0):
                return
        except RuntimeError:
            pass  # polled by vigil.restartable's watcher thread at the same time: read anyway
    with _lock:
        while True:
            try:
                data = s.recv(65536)
            except BlockingIOError:
                return
            except OSError as e:
                _broken(e)
                return
            if not data:
                _broken("the agent closed the connection")
                return
            _decoder.feed(data)
            try:
                msgs = _decoder.messages()
            except _protocol.DecodeError as e:
                _broken("malformed message from the agent: %s" % (e,))
                return
            for m in msgs:
                if m["type"] == "StopRequest":
                    _stop_requested = True
                    _stop_reason = m["reason"]
                    _stop_step = m["at_step"]
                elif m["type"] == "TimeoutsCalculated":
                    _calc_answers.append(m)
                elif m["type"] == "Generation":
                    _inprocess.on_generation(m)
                else:
                    _timeouts = {
                        "initial_ms": m["initial_ms"],
                        "heartbeat_ms": m["heartbeat_ms"],
                        "out_of_section_ms": m["out_of_section_ms"],
                        "sections": dict(m["sections"]),
                    }
            if _decoder.failed is not None:
                _broken("malformed message from the agent: %s" % (_decoder.failed,))
                return


def should_stop(step=None):
    """Whether this rank should checkpoint and exit now. Never blocks; cheap enough for every step.

    ``should_stop(step)``, called after each training step with that step's number (an int >= 0),
    tells the agent where this rank is (a ``Progress`` message, sent only when ``step`` changed)
    and returns True exactly when the job's agreed stop step is reached: once the agent asked to
    stop at step S, True iff ``step >= S``. Every rank of every node gets True at the same step,
    so each saves its checkpoint for that step and exits 0. When the agent asked to stop as soon
    as possible (no stop step), True at once.

    ``should_stop()`` without a step: True once the agent asked this rank to stop at all (see
    ``stop_step()`` for the step it named). An invalid ``step`` warns once and is treated as none.
    """
    if step is not None:
        if step.__class__ is not int or step < 0:
            step = _valid_step(step)
        if step is not None and (step != _progress_sent or _sock is None):
            if not _signals_held:
                _hold_stop_signals()
            _progress(step)
    # The common case inline (this runs every step): connected, and nothing from the agent.
    global _poll_due
    p = _poller
    if p is None or _sock is None:
        _poll()
    else:
        now = _monotonic()
        if now >= _poll_due:
            _poll_due = now + POLL_EVERY
            try:
                ready = p.poll(0)
            except RuntimeError:
                ready = True  # vigil.restartable's watcher thread polls at the same time
            if ready:
                _poll()
    if _signal_received is not None:
        _report_signal()
    if _inprocess._pending is not None:
        _inprocess.at_step_boundary()
    if not _stop_requested:
        # Signalled from outside and the agent never asked: stop rather than run on forever.
        return _signalled_at is not None and _time.monotonic() - _signalled_at > SIGNAL_WAIT
    at = _stop_step
    return step is None or at is None or step >= at


def _hold_stop_signals():
    """Lets SIGTERM/SIGUSR1/SIGUSR2 be noted instead of killing the rank (only where they have
    their default action, only under vigil, only from the main thread), and tells the agent which
    are held: SIGTERM would not end this rank, so a stop after a failure uses SIGKILL."""
    global _signals_held
    _signals_held = True
    if not _os.environ.get(SOCKET_ENV):
        return
    held = 0
    for sig in (_signal.SIGTERM, _signal.SIGUSR1, _signal.SIGUSR2):
        try:
            if _signal.getsignal(sig) == _signal.SIG_DFL:
                _signal.signal(sig, _on_stop_signal)
                held |= 1 << int(sig)
        except (ValueError, OSError):
            break  # not the main thread: leave the signals alone
    if held:
        _send(_protocol.encode_holds_signals(held))


def _on_stop_signal(signum, frame):
    # Only notes it: this runs between two bytecodes of the main thread, maybe in the middle of a
    # frame being sent, so the agent is told by the next should_stop().
    global _signalled_at, _signal_received
    if _signalled_at is None:
        _signalled_at = _time.monotonic()
        _signal_received = int(signum)


def _report_signal():
    """Tells the agent that a held signal arrived from outside: the job stops at one step."""
    global _signal_received
    sig, _signal_received = _signal_received, None
    _send(_protocol.encode_signalled(sig))


def _valid_step(step):
    """``step`` as an int >= 0 (numpy and torch integers included), else None after a warning."""
    try:
        step = _operator.index(step)
        if step >= 0:
            return step
    except TypeError:
        pass
    _bad_stop_step(step)
    return None


def _progress(step):
    """Sends ``Progress`` (fire and forget, dropped when the agent is not reading, like a heartbeat)."""
    global _progress_sent
    s = _sock
    if s is None:
        s = _connect()
        if s is None:
            return
    try:
        frame = _progress_frame(step)
    except _StructError:
        _bad_stop_step(step)
        return
    try:
        sent = s.send(frame, _flags)
    except BlockingIOError:
        return  # dropped; not recorded as sent, so the next call tries again
    except OSError as e:
        _broken(e)
        return
    if sent == 16 or _finish(s, frame, sent):
        _progress_sent = step


def _bad_stop_step(step):
    global _bad_stop_step_warned
    if not _bad_stop_step_warned:
        _bad_stop_step_warned = True
        _warnings.warn(
            "vigil: should_stop step must be an int in [0, 2**64), got %r; treated as should_stop()" % (step,),
            VigilWarning,
            stacklevel=3,
        )


def stop_step():
    """The step at which the agent asked to stop, or None (stop as soon as possible / no request).

    A later request replaces an earlier one: the agent may move the step earlier, or to None.
    """
    _poll()
    return _stop_step


def stop_reason():
    """Why the agent asked to stop, or None."""
    _poll()
    return _stop_reason


def timeouts():
    """The latest timeouts the agent reported, or None.

    A dict: ``initial_ms``, ``heartbeat_ms``, ``out_of_section_ms`` (int or None = check off) and
    ``sections`` ({name: ms}).
    """
    _poll()
    if _timeouts is None:
        return None
    t = dict(_timeouts)
    t["sections"] = dict(t["sections"])
    return t


def announce_calculation_on_request():
    """Tells the agent that this job's code calculates timeouts only when it asks (NVRx's rule):
    the agent then never recalculates on its own. Sent by ``vigil.compat`` on init."""
    _send(_protocol.encode_calculate_timeouts(False, False, False, ()))


def calculate_timeouts(heartbeat=False, sections=(), out_of_section=False):
    """Asks the agent to calculate timeouts from what it observed and waits for its answer.

    ``sections``: names of the sections to calculate (none by default), or ``None`` for every
    section observed.
    Every rank of the job must ask (as NVRx's ``calculate_and_set_*``, a collective): the agent
    answers once every rank of its node asked and every node calculated. Returns a dict
    ``{"heartbeat", "sections", "out_of_section"}`` of bools (what was calculated and is now in
    force; ``timeouts()`` has the values), or None outside vigil or when the connection is lost.
    While waiting, this rank sends no heartbeats: a rank that never asks leaves the others to be
    caught by their heartbeat timeout, as a hung collective would.
    """
    names = [] if sections is None else list(sections)
    frame = _protocol.encode_calculate_timeouts(bool(heartbeat), bool(out_of_section), sections is None, names)
    if not _send(frame):
        return None
    import select

    while True:
        _poll()
        if _calc_answers:
            m = _calc_answers.pop(0)
            return {k: m[k] for k in ("heartbeat", "sections", "out_of_section")}
        s = _sock
        if s is None:
            return None
        try:
            select.select([s], [], [], 1.0)
        except (OSError, ValueError):
            return None


def is_connected():
    """True while this process holds a live connection to the agent (connecting if needed)."""
    return _connect() is not None if _disabled is None else False


def close():
    """Closes the connection: the agent stops watching this rank's heartbeats and sections.

    The next vigil call connects and registers again (NVRx's shutdown/init cycle maps onto this).
    """
    global _sock
    with _lock:
        s, _sock = _sock, None
        if s is not None and _pid == _getpid():
            s.close()


def _install_stack_dumps():
    """SIGUSR2 dumps every thread's Python stack to VIGIL_STACK_FILE (even with the GIL held)."""
    global _stack_file
    path = _os.environ.get(STACK_FILE_ENV)
    if not path or not _os.environ.get(SOCKET_ENV):
        return
    import faulthandler
    import signal

    if not hasattr(signal, "SIGUSR2") or not hasattr(faulthandler, "register"):
        return
    try:
        f = open(path, "a")
    except OSError as e:
        _warnings.warn("vigil: cannot open %s=%s (%s)" % (STACK_FILE_ENV, path, e), VigilWarning, stacklevel=3)
        return
    try:
        # chain=True re-raises the signal to the previous disposition; the default one would kill.
        if signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL:
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    except ValueError:
        pass  # not the main thread: keep whatever is installed
    faulthandler.register(signal.SIGUSR2, file=f, all_threads=True, chain=True)
    _stack_file = f
    # faulthandler names threads only by id, and the thread the signal lands on comes first: this
    # line lets the agent show the main thread (the training loop) first, whatever else runs.
    try:
        import threading

        f.write(MAIN_THREAD_LINE % (_getpid(), threading.main_thread().ident or 0))
        f.flush()
    except (OSError, ValueError):
        pass


def _install_exception_hook():
    """On an uncaught exception in the main thread, tells the agent what it was before the
    interpreter shuts down (which can take long: a communicator's teardown, atexit handlers), so
    that ranks waiting for this one in a collective are not taken for the hung ones."""
    if not _os.environ.get(SOCKET_ENV):
        return
    previous = _sys.excepthook

    def hook(kind, value, tb):
        try:
            # Only a rank that spoke to the agent: connecting now would register a new rank.
            if _sock is not None and _pid == _getpid():
                text = getattr(kind, "__name__", str(kind))
                detail = str(value) if value is not None else ""
                _send(_protocol.encode_raised(text + (": " + detail if detail else "")))
        except Exception:  # noqa: BLE001 - the hook must never hide the original exception
            pass
        previous(kind, value, tb)

    _sys.excepthook = hook


_install_stack_dumps()
_install_exception_hook()

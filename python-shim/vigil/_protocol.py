"""The rank <-> agent wire protocol, byte for byte identical to the Rust crate ``vigil-ipc``.

See docs/protocol.md. Messages are plain dicts with a ``"type"`` key, shaped exactly like the JSON
meanings in ``ipc/testdata/vectors.txt``.
"""

import struct

MAGIC = 0x56
VERSION = 1
HEADER_LEN = 8
MAX_PAYLOAD = 64 * 1024
MAX_NAME_LEN = 255
MAX_REASON_LEN = 1024
MAX_SECTIONS = 128

REGISTER = 0x01
HEARTBEAT = 0x02
SECTION_START = 0x03
SECTION_END = 0x04
END_ALL_SECTIONS = 0x05
STEP_TIMING = 0x06
FINISHED = 0x07
CALCULATE_TIMEOUTS = 0x08
PROGRESS = 0x09
WORKLOAD_CONTROL = 0x0A
HOLDS_SIGNALS = 0x0B
SIGNALLED = 0x0C
RESTARTABLE = 0x0D
RAISED = 0x0E
TIMEOUTS = 0x81
STOP_REQUEST = 0x82
TIMEOUTS_CALCULATED = 0x83
GENERATION = 0x84

RANK_KINDS = frozenset(range(REGISTER, RAISED + 1))
AGENT_KINDS = frozenset((TIMEOUTS, STOP_REQUEST, TIMEOUTS_CALCULATED, GENERATION))

_HEADER = struct.Struct("<BBBBI")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")
_REGISTER = struct.Struct("<8sIIII")
_FRAME_U64 = struct.Struct("<8sQ")
_FRAME_2U64 = struct.Struct("<8sQQ")


def _header(kind, length):
    return _HEADER.pack(MAGIC, VERSION, kind, 0, length)


_REGISTER_HEADER = _header(REGISTER, 16)
_HEARTBEAT_STEP_HEADER = _header(HEARTBEAT, 8)
_STEP_TIMING_HEADER = _header(STEP_TIMING, 16)
_PROGRESS_HEADER = _header(PROGRESS, 8)
_HOLDS_SIGNALS_HEADER = _header(HOLDS_SIGNALS, 8)
_SIGNALLED = struct.Struct("<8sI")
_SIGNALLED_HEADER = _header(SIGNALLED, 4)

#: The whole frame of a heartbeat without a step: a bare header.
HEARTBEAT_FRAME = _header(HEARTBEAT, 0)
END_ALL_SECTIONS_FRAME = _header(END_ALL_SECTIONS, 0)
FINISHED_FRAME = _header(FINISHED, 0)

_pack_u64_frame = _FRAME_U64.pack
_pack_2u64_frame = _FRAME_2U64.pack


def heartbeat_step_frame(step):
    """Frame of a heartbeat carrying ``step``; raises ``struct.error`` unless 0 <= step < 2**64."""
    return _pack_u64_frame(_HEARTBEAT_STEP_HEADER, step)


def step_timing_frame(step, duration_us):
    """Frame of ``StepTiming``; raises ``struct.error`` unless both are ints in [0, 2**64)."""
    return _pack_2u64_frame(_STEP_TIMING_HEADER, step, duration_us)


def progress_frame(step):
    """Frame of ``Progress`` (this rank is at ``step``); ``struct.error`` unless 0 <= step < 2**64."""
    return _pack_u64_frame(_PROGRESS_HEADER, step)


def encode_holds_signals(signals):
    """Frame of ``HoldsSignals``: bit n of ``signals`` set = this rank holds signal n for should_stop."""
    return _pack_u64_frame(_HOLDS_SIGNALS_HEADER, signals)


def encode_signalled(signal):
    """Frame of ``Signalled``: this rank received ``signal`` (one it holds) from outside."""
    return _SIGNALLED.pack(_SIGNALLED_HEADER, signal)


class DecodeError(ValueError):
    """Bytes that are not a valid frame. ``kind`` is the Rust ``DecodeError::kind()`` name."""

    def __init__(self, kind, detail=""):
        super().__init__("%s%s" % (kind, ": " + detail if detail else ""))
        self.kind = kind


def _utf8(text, limit):
    """UTF-8 bytes of ``text`` cut at the last character boundary within ``limit`` bytes."""
    b = text.encode("utf-8")
    if len(b) <= limit:
        return b
    return b[:limit].decode("utf-8", "ignore").encode("utf-8")


def _str(text, limit):
    b = _utf8(text, limit)
    return _U16.pack(len(b)) + b


def _opt(value):
    return b"\x00" if value is None else b"\x01" + _U64.pack(value)


def _frame(kind, payload):
    return _header(kind, len(payload)) + payload


def encode_register(rank, local_rank, pid, cycle):
    return _REGISTER.pack(_REGISTER_HEADER, rank, local_rank, pid, cycle)


def encode_heartbeat(step=None):
    return HEARTBEAT_FRAME if step is None else heartbeat_step_frame(step)


def encode_section_start(name):
    return _frame(SECTION_START, _str(name, MAX_NAME_LEN))


def encode_section_end(name):
    return _frame(SECTION_END, _str(name, MAX_NAME_LEN))


def encode_step_timing(step, duration_us):
    return _FRAME_2U64.pack(_STEP_TIMING_HEADER, step, duration_us)


def encode_timeouts(initial_ms, heartbeat_ms, out_of_section_ms, sections):
    sections = list(sections)[:MAX_SECTIONS]
    parts = [_opt(initial_ms), _opt(heartbeat_ms), _opt(out_of_section_ms), _U16.pack(len(sections))]
    for name, ms in sections:
        parts.append(_str(name, MAX_NAME_LEN))
        parts.append(_U64.pack(ms))
    return _frame(TIMEOUTS, b"".join(parts))


def encode_stop_request(reason, at_step):
    return _frame(STOP_REQUEST, _str(reason, MAX_REASON_LEN) + _opt(at_step))


def encode_calculate_timeouts(heartbeat, out_of_section, all_sections, sections):
    sections = list(sections)[:MAX_SECTIONS]
    parts = [bytes((bool(heartbeat), bool(out_of_section), bool(all_sections)))]
    parts.append(_U16.pack(len(sections)))
    parts.extend(_str(name, MAX_NAME_LEN) for name in sections)
    return _frame(CALCULATE_TIMEOUTS, b"".join(parts))


def encode_workload_control(action, description):
    """NVRx's workload control request: action 1 excludes this node, 2 shuts the workload down."""
    return _frame(WORKLOAD_CONTROL, bytes((action,)) + _str(description, MAX_REASON_LEN))


def encode_timeouts_calculated(heartbeat, sections, out_of_section):
    return _frame(TIMEOUTS_CALCULATED, bytes((bool(heartbeat), bool(sections), bool(out_of_section))))


def encode_restartable(generation):
    """Frame of ``Restartable``: this rank runs under ``vigil.restartable``, at ``generation``."""
    return _FRAME_U64.pack(_header(RESTARTABLE, 8), generation)


def encode_raised(error):
    """Frame of ``Raised``: this rank's main thread ended with an uncaught exception, ``error``
    (its type and message, cut to fit)."""
    return _frame(RAISED, _str(error, MAX_REASON_LEN))


def encode_generation(generation, replaced):
    payload = _U64.pack(generation) + _U16.pack(len(replaced))
    payload += b"".join(struct.pack("<I", r) for r in replaced)
    return _frame(GENERATION, payload)


def encode(msg):
    """Frame of a message dict (either direction)."""
    t = msg["type"]
    if t == "Register":
        return encode_register(msg["rank"], msg["local_rank"], msg["pid"], msg["cycle"])
    if t == "Heartbeat":
        return encode_heartbeat(msg["step"])
    if t == "SectionStart":
        return encode_section_start(msg["name"])
    if t == "SectionEnd":
        return encode_section_end(msg["name"])
    if t == "EndAllSections":
        return END_ALL_SECTIONS_FRAME
    if t == "StepTiming":
        return encode_step_timing(msg["step"], msg["duration_us"])
    if t == "Finished":
        return FINISHED_FRAME
    if t == "Progress":
        return progress_frame(msg["step"])
    if t == "HoldsSignals":
        return encode_holds_signals(msg["signals"])
    if t == "Signalled":
        return encode_signalled(msg["signal"])
    if t == "Restartable":
        return encode_restartable(msg["generation"])
    if t == "Raised":
        return encode_raised(msg["error"])
    if t == "Generation":
        return encode_generation(msg["generation"], msg["replaced"])
    if t == "WorkloadControl":
        return encode_workload_control(msg["action"], msg["description"])
    if t == "Timeouts":
        return encode_timeouts(
            msg["initial_ms"], msg["heartbeat_ms"], msg["out_of_section_ms"], msg["sections"]
        )
    if t == "StopRequest":
        return encode_stop_request(msg["reason"], msg["at_step"])
    if t == "CalculateTimeouts":
        return encode_calculate_timeouts(
            msg["heartbeat"], msg["out_of_section"], msg["all_sections"], msg["sections"]
        )
    if t == "TimeoutsCalculated":
        return encode_timeouts_calculated(msg["heartbeat"], msg["sections"], msg["out_of_section"])
    raise ValueError("unknown message type %r" % (t,))


_FIXED_LENGTHS = {
    REGISTER: (16,),
    HEARTBEAT: (0, 8),
    END_ALL_SECTIONS: (0,),
    STEP_TIMING: (16,),
    FINISHED: (0,),
    PROGRESS: (8,),
    HOLDS_SIGNALS: (8,),
    SIGNALLED: (4,),
    RESTARTABLE: (8,),
}
_AGENT_FIXED_LENGTHS = {TIMEOUTS_CALCULATED: (3,)}


def version_mismatch(agent_version):
    """Why this rank library must not speak to an agent announcing ``agent_version`` (its
    ``VIGIL_PROTOCOL``), naming the side to upgrade; None when they match or nothing was announced
    (an older agent, which the frame header check still catches)."""
    if not agent_version:
        return None
    try:
        theirs = int(agent_version)
    except ValueError:
        theirs = None
    if theirs == VERSION:
        return None
    if theirs is not None and theirs > VERSION:
        side = "the rank library is older; upgrade it to the vigil binary's release"
    else:
        side = "the rank library is newer; upgrade the vigil binary"
    return "the vigil agent speaks rank protocol %s and this rank library %d: %s (pip install -U vigil-train installs both)" % (
        agent_version,
        VERSION,
        side,
    )


def _split_frame(buf, kinds, fixed_lengths=_FIXED_LENGTHS):
    """(kind, payload) of the frame at the start of ``buf``; header checks in the order of Rust."""
    n = len(buf)
    if n >= 1 and buf[0] != MAGIC:
        raise DecodeError("bad_magic", "0x%02x" % buf[0])
    if n >= 2 and buf[1] != VERSION:
        raise DecodeError("unsupported_version", version_mismatch(str(buf[1])))
    if n >= 3 and buf[2] not in kinds:
        raise DecodeError("unknown_kind", "0x%02x" % buf[2])
    if n >= 4 and buf[3] != 0:
        raise DecodeError("bad_flags", "0x%02x" % buf[3])
    if n < HEADER_LEN:
        raise DecodeError("incomplete")
    _, _, kind, _, length = _HEADER.unpack_from(buf)
    if length > MAX_PAYLOAD:
        raise DecodeError("payload_too_large", str(length))
    fixed = fixed_lengths.get(kind)
    if fixed is not None and length not in fixed:
        raise DecodeError("bad_length", "kind 0x%02x, %d bytes" % (kind, length))
    if n < HEADER_LEN + length:
        raise DecodeError("incomplete")
    return kind, bytes(buf[HEADER_LEN : HEADER_LEN + length])


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, n):
        end = self.pos + n
        if end > len(self.buf):
            raise DecodeError("truncated")
        b = self.buf[self.pos : end]
        self.pos = end
        return b

    def u64(self):
        return _U64.unpack(self.take(8))[0]

    def opt(self):
        tag = self.take(1)[0]
        if tag == 0:
            return None
        if tag == 1:
            return self.u64()
        raise DecodeError("bad_presence", str(tag))

    def flag(self):
        tag = self.take(1)[0]
        if tag > 1:
            raise DecodeError("bad_presence", str(tag))
        return tag == 1

    def string(self, limit, too_long):
        n = _U16.unpack(self.take(2))[0]
        if n > limit:
            raise DecodeError(too_long, "%d bytes" % n)
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("invalid_utf8") from None

    def finish(self):
        if self.pos != len(self.buf):
            raise DecodeError("trailing_bytes", "%d bytes" % (len(self.buf) - self.pos))


def decode_rank_frame(buf):
    """(message dict, bytes used) for the rank -> agent frame at the start of ``buf``.

    Raises ``DecodeError`` (kind ``"incomplete"`` when ``buf`` is a valid prefix of a frame).
    """
    kind, payload = _split_frame(buf, RANK_KINDS)
    r = _Reader(payload)
    if kind == REGISTER:
        rank, local_rank, pid, cycle = struct.unpack("<IIII", payload)
        msg = {"type": "Register", "rank": rank, "local_rank": local_rank, "pid": pid, "cycle": cycle}
        r.pos = 16
    elif kind == HEARTBEAT:
        msg = {"type": "Heartbeat", "step": r.u64() if payload else None}
    elif kind == SECTION_START:
        msg = {"type": "SectionStart", "name": r.string(MAX_NAME_LEN, "name_too_long")}
    elif kind == SECTION_END:
        msg = {"type": "SectionEnd", "name": r.string(MAX_NAME_LEN, "name_too_long")}
    elif kind == END_ALL_SECTIONS:
        msg = {"type": "EndAllSections"}
    elif kind == STEP_TIMING:
        msg = {"type": "StepTiming", "step": r.u64(), "duration_us": r.u64()}
    elif kind == PROGRESS:
        msg = {"type": "Progress", "step": r.u64()}
    elif kind == HOLDS_SIGNALS:
        msg = {"type": "HoldsSignals", "signals": r.u64()}
    elif kind == SIGNALLED:
        msg = {"type": "Signalled", "signal": struct.unpack("<I", r.take(4))[0]}
    elif kind == RESTARTABLE:
        msg = {"type": "Restartable", "generation": r.u64()}
    elif kind == RAISED:
        msg = {"type": "Raised", "error": r.string(MAX_REASON_LEN, "reason_too_long")}
    elif kind == WORKLOAD_CONTROL:
        msg = {"type": "WorkloadControl", "action": r.take(1)[0],
               "description": r.string(MAX_REASON_LEN, "reason_too_long")}
    elif kind == CALCULATE_TIMEOUTS:
        heartbeat, out_of_section, all_sections = r.flag(), r.flag(), r.flag()
        count = _U16.unpack(r.take(2))[0]
        if count > MAX_SECTIONS:
            raise DecodeError("too_many_sections", str(count))
        msg = {
            "type": "CalculateTimeouts",
            "heartbeat": heartbeat,
            "out_of_section": out_of_section,
            "all_sections": all_sections,
            "sections": [r.string(MAX_NAME_LEN, "name_too_long") for _ in range(count)],
        }
    else:
        msg = {"type": "Finished"}
    r.finish()
    return msg, HEADER_LEN + len(payload)


def decode_agent_frame(buf):
    """(message dict, bytes used) for the agent -> rank frame at the start of ``buf``."""
    kind, payload = _split_frame(buf, AGENT_KINDS, _AGENT_FIXED_LENGTHS)
    r = _Reader(payload)
    if kind == TIMEOUTS:
        initial, heartbeat, out_of_section = r.opt(), r.opt(), r.opt()
        count = _U16.unpack(r.take(2))[0]
        if count > MAX_SECTIONS:
            raise DecodeError("too_many_sections", str(count))
        sections = []
        for _ in range(count):
            name = r.string(MAX_NAME_LEN, "name_too_long")
            sections.append([name, r.u64()])
        msg = {
            "type": "Timeouts",
            "initial_ms": initial,
            "heartbeat_ms": heartbeat,
            "out_of_section_ms": out_of_section,
            "sections": sections,
        }
    elif kind == GENERATION:
        generation = r.u64()
        count = _U16.unpack(r.take(2))[0]
        msg = {
            "type": "Generation",
            "generation": generation,
            "replaced": [struct.unpack("<I", r.take(4))[0] for _ in range(count)],
        }
    elif kind == TIMEOUTS_CALCULATED:
        msg = {
            "type": "TimeoutsCalculated",
            "heartbeat": r.flag(),
            "sections": r.flag(),
            "out_of_section": r.flag(),
        }
    else:
        msg = {
            "type": "StopRequest",
            "reason": r.string(MAX_REASON_LEN, "reason_too_long"),
            "at_step": r.opt(),
        }
    r.finish()
    return msg, HEADER_LEN + len(payload)


class Decoder:
    """Incremental decoder: ``feed`` bytes as they arrive, then call ``messages()``.

    A ``DecodeError`` other than ``incomplete`` makes the stream unusable: ``messages()`` first
    returns the whole messages that preceded the bad frame, then raises that error on every call.
    """

    def __init__(self, decode_frame):
        self._decode = decode_frame
        self._buf = bytearray()
        self._failed = None

    def feed(self, data):
        if self._failed is None:
            self._buf += data

    def messages(self):
        """Every whole message buffered so far (a list)."""
        if self._failed is not None:
            raise self._failed
        out = []
        while self._buf:
            try:
                msg, used = self._decode(self._buf)
            except DecodeError as e:
                if e.kind == "incomplete":
                    break
                self._failed = e
                self._buf = bytearray()
                if out:
                    return out
                raise
            del self._buf[:used]
            out.append(msg)
        return out

    def buffered(self):
        return len(self._buf)

    @property
    def failed(self):
        """The error that ended the stream, or None."""
        return self._failed


def rank_decoder():
    """Decoder for what a rank sends (the agent's side; used by tests and tools)."""
    return Decoder(decode_rank_frame)


def agent_decoder():
    """Decoder for what the agent sends (the rank's side)."""
    return Decoder(decode_agent_frame)

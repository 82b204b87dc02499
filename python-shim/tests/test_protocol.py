import json
import os
import random

import pytest
from conftest import REPO_DIR

from vigil import _protocol as p

VECTORS = os.path.join(REPO_DIR, "ipc", "testdata", "vectors.txt")


def load_vectors():
    out = []
    with open(VECTORS, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            marker, hexbytes, meaning = line.split("\t")
            out.append((lineno, marker, bytes.fromhex(hexbytes), json.loads(meaning)))
    return out


VECTOR_LINES = load_vectors()


def test_vector_file_covers_every_kind_and_error():
    types = {m["type"] for _, k, _, m in VECTOR_LINES if k != "error"}
    assert types == {
        "Register", "Heartbeat", "SectionStart", "SectionEnd", "EndAllSections", "StepTiming",
        "Finished", "Progress", "WorkloadControl", "HoldsSignals", "Signalled", "Timeouts", "StopRequest",
        "CalculateTimeouts", "TimeoutsCalculated", "Restartable", "Generation", "Raised",
    }
    errors = {m["error"] for _, k, _, m in VECTOR_LINES if k == "error"}
    assert len(errors) == 14


@pytest.mark.parametrize("lineno,marker,data,meaning", VECTOR_LINES, ids=lambda v: str(v)[:20])
def test_vector(lineno, marker, data, meaning):
    if marker == "error":
        decode = p.decode_rank_frame if meaning["direction"] == "rank" else p.decode_agent_frame
        with pytest.raises(p.DecodeError) as e:
            decode(data)
        assert e.value.kind == meaning["error"], "line %d" % lineno
        return
    decode = p.decode_rank_frame if marker == "rank" else p.decode_agent_frame
    msg, used = decode(data)
    assert used == len(data)
    assert msg == meaning
    assert p.encode(msg) == data
    assert p.encode(meaning) == data


def test_constant_frames():
    assert p.HEARTBEAT_FRAME == bytes([0x56, 1, 2, 0, 0, 0, 0, 0])
    assert p.encode_heartbeat(None) is p.HEARTBEAT_FRAME
    assert p.heartbeat_step_frame(258) == bytes([0x56, 1, 2, 0, 8, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0])
    with pytest.raises(Exception):
        p.heartbeat_step_frame(-1)
    with pytest.raises(Exception):
        p.heartbeat_step_frame(2**64)


def test_progress_frame_is_a_fixed_16_bytes():
    assert p.progress_frame(258) == bytes([0x56, 1, 9, 0, 8, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0])
    assert p.encode({"type": "Progress", "step": 258}) == p.progress_frame(258)
    for bad in (-1, 2**64):
        with pytest.raises(Exception):
            p.progress_frame(bad)


def test_overlong_strings_are_cut_at_a_character_boundary_like_rust():
    msg, _ = p.decode_rank_frame(p.encode_section_start("é" * 128))
    assert msg["name"] == "é" * 127
    msg, _ = p.decode_agent_frame(p.encode_stop_request("🚀" * 300, None))
    assert msg["reason"] == "🚀" * 256
    many = [("s%d" % i, i) for i in range(p.MAX_SECTIONS + 3)]
    msg, _ = p.decode_agent_frame(p.encode_timeouts(1, 2, 3, many))
    assert len(msg["sections"]) == p.MAX_SECTIONS


def test_incremental_decoder_with_random_chunks():
    rng = random.Random(7)
    msgs = [m for _, k, _, m in VECTOR_LINES if k == "rank"] * 3
    rng.shuffle(msgs)
    stream = b"".join(p.encode(m) for m in msgs)
    d = p.rank_decoder()
    got = []
    i = 0
    while i < len(stream):
        n = rng.randint(1, 40)
        d.feed(stream[i : i + n])
        i += n
        got.extend(d.messages())
    assert got == msgs
    assert d.buffered() == 0


def test_decoder_returns_good_messages_before_a_bad_frame_then_fails():
    d = p.agent_decoder()
    stop = {"type": "StopRequest", "reason": "x", "at_step": 3}
    d.feed(p.encode(stop) + b"\x57junk")
    assert d.messages() == [stop]
    assert d.failed is not None and d.failed.kind == "bad_magic"
    with pytest.raises(p.DecodeError):
        d.messages()


def test_random_mutations_never_escape_as_other_exceptions():
    rng = random.Random(11)
    frames = [data for _, k, data, _ in VECTOR_LINES if k != "error"]
    ok = 0
    for _ in range(20000):
        b = bytearray(rng.choice(frames))
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(4)
            if op == 0 and b:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            elif op == 1:
                b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
            elif op == 2 and b:
                del b[rng.randrange(len(b))]
            else:
                del b[rng.randrange(len(b) + 1) :]
        for decode in (p.decode_rank_frame, p.decode_agent_frame):
            try:
                msg, used = decode(bytes(b))
            except p.DecodeError:
                continue
            assert p.encode(msg) == bytes(b[:used])
            ok += 1
    assert ok > 100


def test_version_mismatch_names_the_side_to_upgrade():
    _protocol = p
    v = _protocol.VERSION
    assert _protocol.version_mismatch(None) is None
    assert _protocol.version_mismatch("") is None
    assert _protocol.version_mismatch(str(v)) is None
    newer_agent = _protocol.version_mismatch(str(v + 1))
    assert "upgrade it to the vigil binary's release" in newer_agent, newer_agent
    older_agent = _protocol.version_mismatch(str(v - 1))
    assert "upgrade the vigil binary" in older_agent, older_agent
    assert "upgrade the vigil binary" in _protocol.version_mismatch("x")

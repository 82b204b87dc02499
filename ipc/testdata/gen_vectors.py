#!/usr/bin/env python3
"""Writes vectors.txt next to this file.

Frames are assembled byte by byte here, independently of both codecs under test (Rust `vigil-ipc`
and the Python shim), so the file checks each of them against the spec in docs/protocol.md.
Run it only when the protocol itself changes.
"""
import json
import os
import struct

U64_MAX = 2**64 - 1


def frame(kind, payload=b"", version=1, magic=0x56, flags=0, length=None):
    if length is None:
        length = len(payload)
    return struct.pack("<BBBBI", magic, version, kind, flags, length) + payload


def s(text):
    b = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<H", len(b)) + b


def opt(v):
    return b"\x00" if v is None else b"\x01" + struct.pack("<Q", v)


def q(v):
    return struct.pack("<Q", v)


def msg(type_, **fields):
    return dict(type=type_, **fields)


rank = []
agent = []
errors = []

for r, lr, pid, cyc in [(0, 0, 1, 0), (4294967295, 7, 123456, 3), (17, 1, 4242, 4294967295)]:
    rank.append((frame(0x01, struct.pack("<IIII", r, lr, pid, cyc)),
                 msg("Register", rank=r, local_rank=lr, pid=pid, cycle=cyc)))
rank.append((frame(0x02), msg("Heartbeat", step=None)))
for step in [0, 1234567890123, U64_MAX]:
    rank.append((frame(0x02, q(step)), msg("Heartbeat", step=step)))
names = ["step", "", "checkpointing", "チェックポイント", "ünïcødé ✓ 🚀", "a" * 255, "é" * 127 + "x"]
for name in names:
    rank.append((frame(0x03, s(name)), msg("SectionStart", name=name)))
    rank.append((frame(0x04, s(name)), msg("SectionEnd", name=name)))
rank.append((frame(0x05), msg("EndAllSections")))
for step, dur in [(0, 0), (42, 1500000), (U64_MAX, U64_MAX)]:
    rank.append((frame(0x06, q(step) + q(dur)), msg("StepTiming", step=step, duration_us=dur)))
rank.append((frame(0x07), msg("Finished")))
for step in [0, 41, 1234567890123, U64_MAX]:
    rank.append((frame(0x09, q(step)), msg("Progress", step=step)))
for signals in [0, (1 << 15) | (1 << 10) | (1 << 12), U64_MAX]:
    rank.append((frame(0x0B, q(signals)), msg("HoldsSignals", signals=signals)))
for sig in [15, 10, 0, 2**32 - 1]:
    rank.append((frame(0x0C, struct.pack("<I", sig)), msg("Signalled", signal=sig)))
for action, desc in [(1, "exclude: ECC errors"), (2, ""), (7, "ü" * 10)]:
    rank.append((frame(0x0A, bytes([action]) + s(desc)), msg("WorkloadControl", action=action, description=desc)))
for error in ["RuntimeError: Parent directory /ckpt does not exist.", "", "KeyboardInterrupt", "ü" * 10]:
    rank.append((frame(0x0E, s(error)), msg("Raised", error=error)))
for hb, oos, alls, secs in [(True, False, False, []), (False, True, True, []),
                            (False, False, False, ["init", "checkpoint"]), (True, True, False, ["ü" * 127])]:
    payload = bytes([hb, oos, alls]) + struct.pack("<H", len(secs)) + b"".join(s(n) for n in secs)
    rank.append((frame(0x08, payload), msg("CalculateTimeouts", heartbeat=hb, out_of_section=oos,
                                           all_sections=alls, sections=secs)))

timeouts = [
    (None, None, None, []),
    (1800000, 300000, 60000, [("setup", 600000), ("step", 30000), ("checkpointing", 1200000)]),
    (5000, None, 0, [("ステップ", 1)]),
    (U64_MAX, U64_MAX, U64_MAX, [("x" * 255, U64_MAX), ("", 0)]),
]
for ini, hb, oos, secs in timeouts:
    payload = opt(ini) + opt(hb) + opt(oos) + struct.pack("<H", len(secs))
    payload += b"".join(s(n) + q(ms) for n, ms in secs)
    agent.append((frame(0x81, payload),
                  msg("Timeouts", initial_ms=ini, heartbeat_ms=hb, out_of_section_ms=oos,
                      sections=[[n, ms] for n, ms in secs])))
for reason, at in [("preemption: SIGTERM from Slurm", 1200), ("", None), ("время ✓", 0),
                   ("r" * 1024, U64_MAX)]:
    agent.append((frame(0x82, s(reason) + opt(at)), msg("StopRequest", reason=reason, at_step=at)))
for hb, secs, oos in [(True, False, False), (False, True, True), (False, False, False)]:
    agent.append((frame(0x83, bytes([hb, secs, oos])),
                  msg("TimeoutsCalculated", heartbeat=hb, sections=secs, out_of_section=oos)))


def err(direction, data, kind):
    errors.append((data, {"direction": direction, "error": kind}))


err("rank", b"", "incomplete")
err("rank", b"\x56", "incomplete")
err("rank", b"\x56\x01\x02\x00\x08\x00", "incomplete")
err("rank", frame(0x02, q(7))[:12], "incomplete")
err("rank", frame(0x01, b"\x00" * 16)[:23], "incomplete")
err("rank", b"\x57", "bad_magic")
err("rank", frame(0x02, magic=0x00), "bad_magic")
err("rank", frame(0x02, magic=0x80), "bad_magic")
err("rank", frame(0x02, version=2), "unsupported_version")
err("rank", frame(0x02, version=0), "unsupported_version")
err("rank", b"\x56\x02", "unsupported_version")
err("rank", frame(0x00), "unknown_kind")
err("rank", frame(0x0F), "unknown_kind")
err("rank", frame(0x0E), "truncated")
err("rank", frame(0x0E, struct.pack("<H", 1025) + b"x" * 1025), "reason_too_long")
err("rank", frame(0x0B), "bad_length")
err("rank", frame(0x0B, q(1) + b"\x00"), "bad_length")
err("rank", frame(0x0C, q(15)), "bad_length")
err("rank", frame(0x0C, b"\x0f\x00\x00"), "bad_length")
err("rank", frame(0x0C, struct.pack("<I", 15))[:10], "incomplete")
err("rank", frame(0x0A), "truncated")
err("rank", frame(0x0A, b"\x01" + struct.pack("<H", 1025) + b"x" * 1025), "reason_too_long")
err("rank", frame(0x7F, q(1)), "unknown_kind")
err("rank", frame(0x09), "bad_length")
err("rank", frame(0x09, q(1) + b"\x00"), "bad_length")
err("rank", frame(0x09, length=7), "bad_length")
err("rank", frame(0x09, q(5))[:15], "incomplete")
err("rank", frame(0x08), "truncated")
err("rank", frame(0x08, b"\x02\x00\x00\x00\x00"), "bad_presence")
err("rank", frame(0x08, b"\x01\x00\x00" + struct.pack("<H", 129)), "too_many_sections")
err("rank", frame(0x08, b"\x01\x00\x00" + struct.pack("<H", 1) + s("a" * 256)), "name_too_long")
err("rank", frame(0x08, b"\x01\x00\x00\x00\x00\x00"), "trailing_bytes")
err("rank", frame(0x81, opt(None) * 3 + b"\x00\x00"), "unknown_kind")
err("rank", frame(0x02, flags=1), "bad_flags")
err("rank", frame(0x02, flags=0x80), "bad_flags")
err("rank", frame(0x03, length=65537), "payload_too_large")
err("rank", frame(0x02, length=0xFFFFFFFF), "payload_too_large")
err("rank", frame(0x02, b"\x00" * 4), "bad_length")
err("rank", frame(0x02, b"\x00" * 9), "bad_length")
err("rank", frame(0x01, b"\x00" * 15), "bad_length")
err("rank", frame(0x01, length=15), "bad_length")
err("rank", frame(0x05, b"\x00"), "bad_length")
err("rank", frame(0x06, b"\x00" * 17), "bad_length")
err("rank", frame(0x07, b"\x00" * 8), "bad_length")
err("rank", frame(0x03), "truncated")
err("rank", frame(0x03, b"\x01"), "truncated")
err("rank", frame(0x04, struct.pack("<H", 5) + b"abc"), "truncated")
err("rank", frame(0x03, s("ab") + b"\x00"), "trailing_bytes")
err("rank", frame(0x04, s("") + b"junk"), "trailing_bytes")
err("rank", frame(0x03, s(b"\xff\xfe")), "invalid_utf8")
err("rank", frame(0x03, s(b"\xc0\x80")), "invalid_utf8")
err("rank", frame(0x04, s(b"\xed\xa0\x80")), "invalid_utf8")
err("rank", frame(0x03, s("é".encode()[:1])), "invalid_utf8")
err("rank", frame(0x03, s("a" * 256)), "name_too_long")
err("rank", frame(0x04, struct.pack("<H", 65535)), "name_too_long")

err("agent", frame(0x02), "unknown_kind")
err("agent", frame(0x09, q(1)), "unknown_kind")
err("agent", frame(0x80), "unknown_kind")
err("agent", frame(0x84), "unknown_kind")
err("agent", frame(0x83, b"\x01\x00"), "bad_length")
err("agent", frame(0x83, b"\x01\x00\x03"), "bad_presence")
err("agent", frame(0x81, length=65536), "incomplete")
err("agent", frame(0x81, length=65537), "payload_too_large")
err("agent", frame(0x81, b"\x02"), "bad_presence")
err("agent", frame(0x81, opt(1) + b"\xff"), "bad_presence")
err("agent", frame(0x82, s("x") + b"\x02"), "bad_presence")
err("agent", frame(0x81, opt(None) * 3 + struct.pack("<H", 129)), "too_many_sections")
err("agent", frame(0x81, opt(None) * 3 + struct.pack("<H", 65535)), "too_many_sections")
err("agent", frame(0x81, opt(None) * 3 + struct.pack("<H", 1)), "truncated")
err("agent", frame(0x81, opt(None) * 3 + struct.pack("<H", 1) + s("step") + b"\x00" * 7), "truncated")
err("agent", frame(0x81, opt(None) * 2), "truncated")
err("agent", frame(0x81, b"\x01\x00\x00"), "truncated")
err("agent", frame(0x82, s("stop")), "truncated")
err("agent", frame(0x81, opt(None) * 3 + struct.pack("<H", 1) + s("a" * 256) + q(1)), "name_too_long")
err("agent", frame(0x82, s("r" * 1025) + opt(None)), "reason_too_long")
err("agent", frame(0x82, s(b"ok\xff") + opt(None)), "invalid_utf8")
err("agent", frame(0x81, opt(None) * 3 + struct.pack("<H", 1) + s(b"\x80") + q(1)), "invalid_utf8")
err("agent", frame(0x82, s("x") + opt(None) + b"\x00"), "trailing_bytes")
err("agent", frame(0x81, opt(None) * 3 + struct.pack("<H", 0) + b"\x00"), "trailing_bytes")


def line(marker, data, meaning):
    return f"{marker}\t{data.hex()}\t{json.dumps(meaning, ensure_ascii=False, separators=(',', ':'))}\n"


here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "vectors.txt"), "w", encoding="utf-8") as f:
    f.write("# vigil rank <-> agent protocol v1 test vectors; generated by gen_vectors.py.\n")
    f.write("# direction<TAB>hex frame<TAB>JSON meaning   (direction: rank = rank->agent, agent = agent->rank)\n")
    f.write("# error<TAB>hex bytes<TAB>{\"direction\": decoder to use, \"error\": DecodeError kind}\n")
    for data, meaning in rank:
        f.write(line("rank", data, meaning))
    for data, meaning in agent:
        f.write(line("agent", data, meaning))
    for data, meaning in errors:
        f.write(line("error", data, meaning))

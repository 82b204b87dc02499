"""A rank that uses 20,000 distinct section names (field finding 19): the agent keeps at most
128 names per rank (`MAX_SECTION_NAMES`, what one timeouts message to the ranks carries), says so once in the event log and on the console, and
the job finishes normally; calculated timeouts cover the kept names only. Speed per batch is a
benchmark (bench/sections_bench.py), not a pass/fail here."""
import json

from harness import base_env, events, of, one, run_vigil, write

CAP = 128

RANK = r"""
import json, os, sys
import vigil
vigil.heartbeat()
for i in range(20000):
    n = "data-%05d" % i
    vigil.start_section(n)
    vigil.end_section(n)
vigil.start_section("checkpoint")
vigil.end_section("checkpoint")
vigil.heartbeat()
done = vigil.calculate_timeouts(sections=None)
t = vigil.timeouts()
json.dump({"done": done, "names": sorted(t["sections"])}, open(sys.argv[1], "w"))
"""


def test_twenty_thousand_section_names_are_capped_and_said_once(job):
    script = write(job / "train.py", RANK)
    out = job / "out.json"
    r = run_vigil(["run", "--log-dir", str(job / "logs"), "--nproc-per-node", "1",
                   "--section-timeouts", "checkpoint=600", str(script), str(out)],
                  cwd=job, env=base_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ev = events(job / "logs")
    capped = one(ev, "section_names_capped")
    assert capped["rank"] == 0 and capped["kept"] == CAP and capped["cycle"] == 0, capped
    said = [l for l in r.stderr.splitlines() if "distinct section names" in l]
    assert len(said) == 1, said
    assert f"rank 0 used more than {CAP} distinct section names" in said[0], said
    # The bound holds where it shows: the calculation of every section the rank was seen in.
    got = json.loads(out.read_text())
    assert got["done"]["sections"] is True, got["done"]
    assert "checkpoint" in got["names"] and len(got["names"]) <= CAP, len(got["names"])
    upd = [e for e in of(ev, "timeouts_updated") if len(e["timeouts"].get("sections", {})) > 1]
    assert len(upd) == 1, upd
    kept = sorted(upd[0]["timeouts"]["sections"])
    assert "checkpoint" in kept, "a section with a timeout in force is kept past the cap"
    assert [n for n in kept if n != "checkpoint"] == ["data-%05d" % i for i in range(CAP)], kept

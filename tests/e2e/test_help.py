"""`vigil run --help` reads well (field finding 25): flags in groups, no default that the text
contradicts, no choice that is then refused, every working flag listed."""
import re
import subprocess

from harness import vigil_bin


def help_text():
    p = subprocess.run([vigil_bin(), "run", "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_flags_come_in_groups_with_torchruns_apart_from_vigils_and_the_no_ops():
    text = help_text()
    headings = [l[:-1] for l in text.splitlines() if re.fullmatch(r"[^ ].*:", l)]
    for h in ("torchrun's options", "Accepted for torchrun compatibility (no effect)",
              "Hang detection (vigil; off until a timeout is given)",
              "Across allocations: stop at one step, requeue (vigil)"):
        assert h in headings, headings
    no_ops = text.split("Accepted for torchrun compatibility (no effect):")[1].split("\n\n")[0]
    for flag in ("--monitor-interval", "--start-method", "--logs-specs", "--local-addr", "--event-log-handler"):
        assert flag in no_ops, no_ops
    torchrun = text.split("torchrun's options:")[1].split("\n\n")[0]
    assert "--monitor-interval" not in torchrun and "--nproc-per-node" in torchrun


def test_no_empty_or_contradicted_defaults_and_no_refused_choice():
    text = help_text()
    for bad in ('[default: ""]', "[default: none]", "[default: false]", "vigil_timeouts_<run id>"):
        assert bad not in text, bad
    completion = text.split("--print-completion")[1].split("\n      --")[0]
    assert "tcsh" not in completion, completion
    assert "Default: 600" in text and "Default:\n" not in text
    log_dir = text.split("--log-dir")[1].split("\n      --")[0]
    assert "$TMPDIR" in log_dir, log_dir


def test_every_working_flag_is_listed():
    text = help_text()
    for flag in ("--no-restart-exit-code", "--stop-lead", "--state-dir", "--max-requeues", "--spare-nodes"):
        assert flag in text, flag
    # A listed flag works: --no-restart-exit-code is parsed, not refused.
    p = subprocess.run([vigil_bin(), "run", "--no-restart-exit-code", "0", "t.py"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 2 and "no-restart-exit-code" in p.stderr and "unexpected" not in p.stderr, p.stderr

"""NVRx 0.7's progress tracker under vigil (docs/ft_launcher.md): `--ft-checkpoint-iteration-file`,
`--ft-max-no-progress-cycles`, `--ft-min-progress-iterations`. The file is read as the job starts
(the baseline) and after each attempt; consecutive attempts that did not grow it by the minimum
stop the restarts. Real agent, invoked as `ft_launcher`, real ranks.
"""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import base_env, events, vigil_bin, write  # noqa: E402

# Each attempt: rank 0 optionally saves a checkpoint (writes the file), then fails, until attempt
# DONE_AT.
RANK = """
import os, sys, time
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
grow = [int(x) for x in os.environ["GROW"].split(",") if x]
if attempt < len(grow) and grow[attempt] and os.environ["RANK"] == "0":
    path = os.environ["IT_FILE"]
    with open(path + ".tmp", "w") as f:
        f.write(str(grow[attempt]) + "\\n")
    os.replace(path + ".tmp", path)
if attempt < int(os.environ["DONE_AT"]):
    # Rank 0 fails after its checkpoint; rank 1 waits to be stopped, so that the file is
    # written before the attempt ends.
    if os.environ["RANK"] != "0":
        time.sleep(60)
    print(f"attempt {attempt} fails", flush=True)
    sys.exit(3)
print("Leaving main", flush=True)
"""


def launch(job: Path, tmp_path: Path, *flags, grow="", done_at=99, start=None):
    link = tmp_path / "ft_launcher"
    if not link.exists():
        link.symlink_to(vigil_bin())
    write(job / "t.py", RANK)
    it = job / "ckpt" / "latest_checkpointed_iteration.txt"
    it.parent.mkdir(exist_ok=True)
    if start is not None:
        it.write_text(f"{start}\n")
    args = [str(link), "--nproc-per-node=2", "--max-restarts=8", "--log-dir", str(job / "logs"),
            *flags, "t.py"]
    r = subprocess.run(args, cwd=job, env=base_env(IT_FILE=str(it), GROW=grow, DONE_AT=str(done_at)),
                       capture_output=True, text=True, timeout=120)
    return r, events(job / "logs")


def cycles(evs):
    return [e["cycle"] for e in evs if e["event"] == "cycle_start"]


def result(evs):
    (r,) = [e for e in evs if e["event"] == "result"]
    return r


def test_no_checkpoint_in_two_attempts_stops_the_restarts(job, tmp_path):
    r, evs = launch(job, tmp_path, "--ft-checkpoint-iteration-file", "ckpt/latest_checkpointed_iteration.txt",
                    "--ft-max-no-progress-cycles", "2", start=100)
    assert r.returncode == 1, r.stderr  # NVRx 0.7's launcher exits 1 here too
    assert cycles(evs) == [0, 1], "cycle 0 and 1 made no progress: no cycle 2, 6 restarts unused"
    assert result(evs)["outcome"] == "no_progress", result(evs)
    assert result(evs)["step"] == 100, "the iteration that did not grow"


def test_nvrx_default_is_two_cycles(job, tmp_path):
    r, evs = launch(job, tmp_path, "--ft-checkpoint-iteration-file", "ckpt/latest_checkpointed_iteration.txt",
                    start=100)
    assert r.returncode == 1, r.stderr
    assert cycles(evs) == [0, 1]
    assert result(evs)["outcome"] == "no_progress"


def test_no_restart_exit_code_is_the_status_when_it_stops(job, tmp_path):
    # NVRx 0.7 has no such option (it exits 1); vigil's "do not requeue" status applies.
    r, evs = launch(job, tmp_path, "--ft-checkpoint-iteration-file", "ckpt/latest_checkpointed_iteration.txt",
                    "--ft-max-no-progress-cycles", "1", "--ft-no-restart-exit-code", "93", start=7)
    assert r.returncode == 93, r.stderr
    assert cycles(evs) == [0]
    assert result(evs)["outcome"] == "no_progress"


def test_checkpoints_between_failures_keep_it_going(job, tmp_path):
    # Attempts 0-3 each save a newer checkpoint and fail; attempt 4 finishes.
    r, evs = launch(job, tmp_path, "--ft-checkpoint-iteration-file", "ckpt/latest_checkpointed_iteration.txt",
                    "--ft-max-no-progress-cycles", "1", grow="110,120,130,140", done_at=4, start=100)
    assert r.returncode == 0, r.stderr
    assert cycles(evs) == [0, 1, 2, 3, 4]
    assert "Leaving main" in r.stdout


def test_min_progress_iterations_is_the_step_that_counts(job, tmp_path):
    # +10 per attempt is progress at the default minimum of 1, not at 50.
    flags = ("--ft-checkpoint-iteration-file", "ckpt/latest_checkpointed_iteration.txt",
             "--ft-max-no-progress-cycles", "2", "--ft-min-progress-iterations", "50")
    r, evs = launch(job, tmp_path, *flags, grow="110,120,130,140", done_at=4, start=100)
    assert r.returncode == 1, r.stderr
    assert cycles(evs) == [0, 1]
    assert result(evs)["outcome"] == "no_progress"


def test_a_file_never_written_leaves_the_tracker_inactive(job, tmp_path):
    # NVRx: "no iterations are being reported", so neither stop nor count: max-restarts decides.
    r, evs = launch(job, tmp_path, "--ft-checkpoint-iteration-file", "ckpt/latest_checkpointed_iteration.txt",
                    "--ft-max-no-progress-cycles", "1", "--max-restarts=2")
    assert r.returncode != 0
    assert cycles(evs) == [0, 1, 2]
    assert result(evs)["outcome"] == "failed"


def test_zero_or_below_turns_it_off_as_in_nvrx(job, tmp_path):
    r, evs = launch(job, tmp_path, "--ft-checkpoint-iteration-file", "ckpt/latest_checkpointed_iteration.txt",
                    "--ft-max-no-progress-cycles", "-1", "--max-restarts=2", start=100)
    assert "vigil: error" not in r.stderr, r.stderr
    assert cycles(evs) == [0, 1, 2]
    assert result(evs)["outcome"] == "failed"

"""NVRx's own examples, run under vigil after the one-line import change (docs/ft_launcher.md).

The examples live only in NVRx's git repository (examples/fault_tolerance/): no package on PyPI
carries them (the wheels of 0.1.3 to 0.7.0 hold the library alone, the 0.0.0a0 sdist is a
placeholder), and vigil does not vendor them. Set NVRX_SRC to a checkout of
github.com/NVIDIA/nvidia-resiliency-ext to run these tests; the test copies the example into its
own directory and changes `import nvidia_resiliency_ext.fault_tolerance as fault_tolerance` to
`import vigil.compat as fault_tolerance`, nothing else. The checks are those of NVRx's
tests/fault_tolerance/func/run_local_ddp_test_{heartbeats,sections}.sh, with their ft_launcher
line (vigil runs as `ft_launcher`), scaled down to 2 CPU ranks (gloo): that includes their
`[NestedRestarter]` sequence.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import base_env, events, vigil_bin  # noqa: E402
from restarter_check import restarter_sequence_ok  # noqa: E402

NVRX_SRC = os.environ.get("NVRX_SRC")
pytestmark = pytest.mark.skipif(
    not NVRX_SRC,
    reason="NVRx's examples are in no PyPI package; set NVRX_SRC to a checkout of "
    "github.com/NVIDIA/nvidia-resiliency-ext to run them",
)

NVRX_IMPORT = re.compile(r"^import nvidia_resiliency_ext\.fault_tolerance as (\w+)$", re.M)


def stage(job: Path, script: str) -> Path:
    """The example and its helpers in `job/ex`, with NVRx's import changed to vigil.compat."""
    src = Path(NVRX_SRC) / "examples" / "fault_tolerance"
    dst = job / "ex"
    dst.mkdir()
    for name in ("dist_utils.py", "log_utils.py", "fault_tol_cfg_heartbeats.yaml", "fault_tol_cfg_sections.yaml"):
        shutil.copy(src / name, dst / name)
    text, n = NVRX_IMPORT.subn(r"import vigil.compat as \1", (src / script).read_text())
    assert n == 1, f"{script} no longer imports NVRx the way this test expects; update the substitution"
    (dst / script).write_text(text)
    return dst


def ft_launcher(job: Path, args):
    """vigil invoked as `ft_launcher`, the scripts' command, with stdout and stderr as one log
    (`2>&1 | tee log.log`)."""
    link = job / "ft_launcher"
    link.symlink_to(vigil_bin())
    r = subprocess.run([str(link), *args], cwd=job, env=base_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    r.stderr = ""
    return r


def heartbeats_example(job: Path, samples: int, *fault, epochs=2):
    ex = stage(job, "train_ddp_heartbeats_api.py")
    out = job / "out"
    # run_local_ddp_test_heartbeats.sh's ft_launcher line, with a small model and dataset on
    # the CPU.
    return ft_launcher(job,
        ["--nproc-per-node=2", "--max-restarts=4", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
         "--ft-restart-check-interval=0.5",
         f"--ft-cfg-path={ex / 'fault_tol_cfg_heartbeats.yaml'}", "--term-timeout=15", "--log-dir", str(job / "logs"),
         str(ex / "train_ddp_heartbeats_api.py"), "--device", "cpu", "--output_dir", str(out),
         "--logging_interval=100", "--hidden", "64", "--batch", "8", "--train_dataset_size", str(samples),
         "--val_dataset_size", "32", "--epochs", str(epochs), *fault])


def test_heartbeats_example_without_a_fault(job):
    r = heartbeats_example(job, 256)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert "Simulating fault" not in log
    assert "Updated heartbeat timeouts" in log  # calculated at epoch 1, iteration 1, as NVRx does
    assert "Leaving main" in log
    assert restarter_sequence_ok(log, with_restarts=False), log[-4000:]
    assert [e for e in events(job / "logs") if e["event"] == "hang"] == []


def test_heartbeats_example_with_a_hung_rank_is_caught_restarted_and_finishes(job):
    # Enough samples that training is still running when the fault fires 1 s after it is armed.
    samples = 16384
    fault, epochs = ["--simulated_fault=rank_hung,1"], 2
    example = Path(NVRX_SRC) / "examples" / "fault_tolerance" / "train_ddp_heartbeats_api.py"
    if "--quick-simulated-fault" in example.read_text():
        fault += ["--quick-simulated-fault", "--simulated-fault-jitter-sec=0"]
    else:
        # NVRx 0.7's example arms the fault after the epoch in which the timeouts were
        # calculated (epoch 1) and fires it 1-5 s later: a third, longer epoch.
        samples, epochs = 40000, 3
    r = heartbeats_example(job, samples, *fault, epochs=epochs)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert "Simulating fault: rank_hung" in log
    assert "Updated heartbeat timeouts" in log
    assert "Leaving main" in log
    assert restarter_sequence_ok(log, with_restarts=True), log[-4000:]
    evs = events(job / "logs")
    hang = next(e for e in evs if e["event"] == "hang")
    assert (hang["cycle"], hang["timeout"]) == (0, "heartbeat")
    assert any(e["event"] == "restart" for e in evs)


def sections_example(job: Path, samples: int, *fault):
    ex = stage(job, "train_ddp_sections_api.py")
    return ft_launcher(job,
        ["--nproc-per-node=2", "--max-restarts=4", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
         "--ft-restart-check-interval=0.5",
         f"--ft-cfg-path={ex / 'fault_tol_cfg_sections.yaml'}", "--term-timeout=15", "--log-dir", str(job / "logs"),
         str(ex / "train_ddp_sections_api.py"), "--device", "cpu", "--output_dir", str(job / "out"),
         "--logging_interval=100", "--hidden", "256", "--batch", "8", "--train_dataset_size", str(samples),
         "--val_dataset_size", "32", "--epochs", "2", *fault])


def test_sections_example_without_a_fault(job):
    r = sections_example(job, 256)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert "Simulating fault" not in log
    assert "Updated section timeouts" in log
    assert "Leaving main" in log
    assert restarter_sequence_ok(log, with_restarts=False), log[-4000:]
    evs = events(job / "logs")
    assert [e for e in evs if e["event"] == "hang"] == []
    final = [e for e in evs if e["event"] == "timeouts_updated"][-1]["timeouts"]
    # Every section the example names, and out-of-section at its end, were calculated.
    assert set(final["sections"]) == {"init", "step", "checkpoint"}
    assert final["sections"]["step"] < 10 and final["out_of_section"] != 30


def test_sections_example_with_a_hung_rank_is_caught_restarted_and_finishes(job):
    # The fault is armed after epoch 0 and fires 1-5 s later: epoch 1 must still be running.
    r = sections_example(job, 24000, "--simulated_fault=rank_hung,1")
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert "Simulating fault: rank_hung" in log
    assert "Updated section timeouts" in log
    assert "Leaving main" in log
    assert restarter_sequence_ok(log, with_restarts=True), log[-4000:]
    evs = events(job / "logs")
    assert any(e["event"] == "hang" and e["cycle"] == 0 for e in evs)
    assert any(e["event"] == "restart" for e in evs)

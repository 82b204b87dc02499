"""NVRx's own functional scripts, run by bash as written, with vigil as `ft_launcher` on PATH
(docs/ft_launcher.md): tests/fault_tolerance/func/run_local_ddp_test_{heartbeats,sections}.sh.

Like test_nvrx_examples.py they need NVRX_SRC (a checkout of NVIDIA/nvidia-resiliency-ext; no
package carries the scripts or the examples). Changed, and nothing else: the examples' NVRx import
becomes `import vigil.compat`, and the scripts run 2 CPU ranks instead of 8 GPUs, with a small
model, 3 epochs (the fault is armed after epoch 0 or 1 and fires 8-12 s later) and 2 of their 4
runs (one without a fault, one with `--simulated_fault=random,8`). The scripts' own checks
decide: exit status 0, "Simulating fault", "Updated ... timeouts", "Leaving main" and the
`[NestedRestarter]` sequence (grep -P).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import base_env, vigil_bin  # noqa: E402

NVRX_SRC = os.environ.get("NVRX_SRC")
pytestmark = pytest.mark.skipif(
    not NVRX_SRC,
    reason="NVRx's functional scripts are in no PyPI package; set NVRX_SRC to a checkout of "
    "github.com/NVIDIA/nvidia-resiliency-ext to run them",
)

NVRX_IMPORT = re.compile(r"^import nvidia_resiliency_ext\.fault_tolerance as (\w+)$", re.M)
CPU = ' --device cpu --hidden 64 --train_dataset_size 100000 --val_dataset_size 32 --epochs 3 '


def run_script(job: Path, name: str):
    src = Path(NVRX_SRC)
    ex = job / "examples" / "fault_tolerance"
    shutil.copytree(src / "examples" / "fault_tolerance", ex)
    for script in ("train_ddp_heartbeats_api.py", "train_ddp_sections_api.py"):
        text, n = NVRX_IMPORT.subn(r"import vigil.compat as \1", (ex / script).read_text())
        assert n == 1, f"{script}: NVRx's import changed; update the substitution"
        (ex / script).write_text(text)
    text = (src / "tests" / "fault_tolerance" / "func" / name).read_text()
    for old, new in [("NUM_TESTS=4", "NUM_TESTS=2"), ("WORLD_SIZE=8", "WORLD_SIZE=2"),
                     ('TRAIN_CMD+=" --device cuda "', f'TRAIN_CMD+="{CPU}"')]:
        assert text.count(old) == 1, f"{name} no longer has {old!r}; update the test"
        text = text.replace(old, new)
    (job / name).write_text(text)
    bin_dir = job / "bin"
    bin_dir.mkdir()
    (bin_dir / "ft_launcher").symlink_to(vigil_bin())
    env = base_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return subprocess.run(["bash", name], cwd=job, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=900)


@pytest.mark.parametrize("name", ["run_local_ddp_test_heartbeats.sh", "run_local_ddp_test_sections.sh"])
def test_nvrx_functional_script_passes_under_vigil(job, name):
    r = run_script(job, name)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("SUCCESS"), r.stdout[-6000:]

#!/usr/bin/env bash
# Runs every test of vigil: formatting, lints, Rust unit and property tests, then the end-to-end
# and shim suites against the real binary. Installs the Python test dependencies it lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

need() { "$PY" -c "import $1" 2>/dev/null || "$PY" -m pip install -q --disable-pip-version-check "$2"; }
need pytest pytest
need torch torch   # about 1 minute and 5 GB the first time: the torch.distributed tests need it
# NVRx's own examples (tests/nvrx/test_nvrx_examples.py) run only from a checkout of
# github.com/NVIDIA/nvidia-resiliency-ext named by NVRX_SRC (they are in no PyPI package); they need numpy.
if [ -n "${NVRX_SRC:-}" ]; then need numpy numpy; fi

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace   # the binaries and the FAKE NVML library (target/debug/libfake_nvml.so) the tests load
cargo test --workspace
VIGIL_BIN="$PWD/target/debug/vigil" "$PY" -m pytest -q -p no:cacheprovider tests python-shim/tests
# The wheel users install: built for manylinux2014, installed into a fresh venv without cargo, and
# the README's example and the rank library's tests run from there (docs/install.md).
bash scripts/wheel.sh

#!/usr/bin/env bash
# Builds the one wheel users install (`pip install vigil-train`: the vigil binary, ft_launcher and
# the rank library), checks its manylinux2014 tag with auditwheel, installs it into a fresh venv
# with no Rust toolchain on PATH, and runs the README's example job and the rank library's tests
# from that venv. Run by scripts/test.sh; alone: `bash scripts/wheel.sh [OUT_DIR]`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-$(mktemp -d /tmp/vigil-wheel-XXXXXX)}
mkdir -p "$OUT"

need() { "$PY" -c "import $1" 2>/dev/null || "$PY" -m pip install -q --disable-pip-version-check "$2"; }
need maturin maturin
need ziglang ziglang    # links against glibc 2.17's symbols: the manylinux2014 tag
need auditwheel auditwheel

say() { echo "[wheel.sh] $*"; }
say "building the wheel (release, manylinux2014 with zig) into $OUT"
"$PY" -m maturin build --quiet --release --zig --compatibility manylinux2014 -o "$OUT/dist" >"$OUT/build.log" 2>&1 ||
    { tail -n 30 "$OUT/build.log"; exit 1; }
whl=$(ls "$OUT"/dist/vigil_train-*.whl)
say "built $(basename "$whl")"
case "$whl" in
*-py3-none-manylinux2014_x86_64*) ;;
*) echo "wheel.sh: expected one py3-none-manylinux2014_x86_64 wheel, got $whl" >&2; exit 1 ;;
esac
"$PY" -m auditwheel show "$whl" >"$OUT/auditwheel.txt"
grep -q 'consistent with the following platform tag' "$OUT/auditwheel.txt" &&
    tr -s ' \n' ' ' <"$OUT/auditwheel.txt" | grep -q '"manylinux_2_17_x86_64"' ||
    { cat "$OUT/auditwheel.txt"; echo "wheel.sh: auditwheel does not confirm manylinux_2_17 (manylinux2014)" >&2; exit 1; }
say "auditwheel: manylinux_2_17_x86_64"

# A fresh venv and a PATH without cargo, rustc or this checkout's target/.
"$PY" -m venv "$OUT/venv"
V=$OUT/venv/bin
"$V/python" -m pip install -q --disable-pip-version-check "$whl" pytest
export PATH="$V:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    echo "wheel.sh: cargo or rustc is still on PATH ($PATH)" >&2
    exit 1
fi
[ "$(command -v vigil)" = "$V/vigil" ] || { echo "wheel.sh: vigil is not the venv's: $(command -v vigil)" >&2; exit 1; }
vigil --version
ft_launcher --help >/dev/null

# The README's example, from a copy with no python-shim beside it: `import vigil` is the wheel's.
job=$OUT/job
mkdir -p "$job"
cp examples/toy_train.py "$job/"
(cd "$job" && python -c 'import vigil, sys; assert vigil.__file__.startswith(sys.prefix), vigil.__file__')
(cd "$job" && vigil run --nproc-per-node 4 --max-restarts 1 --log-dir "$job/logs" toy_train.py --steps 20 --crash-at 5) \
    >"$OUT/example.log" 2>&1 || { cat "$OUT/example.log"; exit 1; }
grep -q 'resumed from step' "$OUT/example.log" || { cat "$OUT/example.log"; echo "wheel.sh: no resume" >&2; exit 1; }
say "README example under the wheel's vigil: restarted and resumed"
# ft_launcher from the wheel runs the same job with one of ft_launcher's own flags.
(cd "$job" && ft_launcher --nproc-per-node 2 --ft-rank_heartbeat_timeout 60 toy_train.py --steps 3 --ckpt-dir "$job/ft") \
    >"$OUT/ft.log" 2>&1 || { cat "$OUT/ft.log"; exit 1; }
grep -q 'all ranks finished' "$OUT/ft.log" || { cat "$OUT/ft.log"; exit 1; }
say "ft_launcher from the wheel: finished"

# The same wheel into the oldest and newest Pythons this machine has (pyenv's or on PATH): the
# rank library imports and a 2-rank job runs under the wheel's vigil.
for v in 3.8 3.13; do
    py=
    for c in $(ls "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v" 2>/dev/null) $(command -v "python$v"); do
        "$c" -V >/dev/null 2>&1 && py=$c && break # a pyenv shim of a version not selected fails here
    done
    if [ -z "$py" ]; then
        say "python$v: not on this machine, not tried"
        continue
    fi
    "$py" -m venv "$OUT/venv$v"
    "$OUT/venv$v/bin/python" -m pip install -q --disable-pip-version-check --no-index "$whl"
    (cd "$job" && PATH="$OUT/venv$v/bin:$PATH" vigil run --nproc-per-node 2 toy_train.py --steps 3 --ckpt-dir "$job/py$v") \
        >"$OUT/py$v.log" 2>&1 || { cat "$OUT/py$v.log"; exit 1; }
    grep -q 'all ranks finished' "$OUT/py$v.log" && [ "$(grep -c 'done after 3 steps' "$OUT/py$v.log")" = 2 ] ||
        { cat "$OUT/py$v.log"; exit 1; }
    say "python$v ($("$py" -V 2>&1)): the wheel installs and a 2-rank job runs"
done

# The rank library's tests against the installed package, not the checkout's python-shim/.
VIGIL_SHIM_FROM_INSTALL=1 python -m pytest -q -p no:cacheprovider python-shim/tests

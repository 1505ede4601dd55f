#!/usr/bin/env bash
# A plain install, as a new user makes one: a fresh virtual environment, torch, then
# `pip install .` without extras (no Triton, no test tools). There, away from the source tree,
# attnbench must verify, search and report on the CPU, find its profiles, and refuse a Triton
# kernel in one line. Then `python -m build` makes an sdist and, from it, a wheel; the wheel
# installs over the first and runs. `make install-check` runs this; `make test` runs that.
#
#   PYTHON   the interpreter of the fresh environment (python3)
#   TORCH    what pip installs first (torch==2.13.0: the CPU build where that is what pip finds)
#   BUILDER  an interpreter that has the `build` package (.venv/bin/python, the test extras)
set -euo pipefail
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
repo=$(cd "$(dirname "$0")/.." && pwd)
BUILDER=${BUILDER:-$repo/.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

step() { echo "install-check: [${SECONDS} s] $*"; }

step "fresh environment, $TORCH, then pip install . (no extras)"
"$PYTHON" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q "$TORCH"
"$tmp/venv/bin/pip" install -q "$repo"
cd "$tmp" # what runs is what was installed, not the source tree
ab=$tmp/venv/bin/attnbench
if "$tmp/venv/bin/python" -c "import triton" 2>/dev/null; then
    echo "install-check: Triton came with $TORCH here, so this does not check a torch without it" >&2
fi

step "attnbench verify --device cpu"
"$ab" verify --device cpu
step "a small max-seq and its report"
"$ab" max-seq --impl naive --device cpu --dtype fp32 --heads 2 --head-dim 16 --memory-limit 64MiB \
    --start 512 --resolution 256 --out run
"$ab" report run --out report
test -s report/report.md
step "a profile installed with the package"
"$ab" models --profile models-cpu >/dev/null
if ! "$tmp/venv/bin/python" -c "import triton" 2>/dev/null; then
    step "a Triton kernel without Triton: one line, exit 2"
    status=0
    "$ab" verify --impl block-sparse --param kernel=triton --device cpu 2>err.txt || status=$?
    cat err.txt
    test "$status" = 2 && test "$(wc -l <err.txt)" = 1 && grep -q "pip install triton" err.txt
fi

# --no-isolation: the builder's own setuptools, not two fresh environments for it; the isolated
# build from pyproject.toml's build-system alone is what `pip install .` above made
step "python -m build: an sdist, and a wheel built from it"
"$BUILDER" -m build --no-isolation --outdir "$tmp/dist" "$repo" >"$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
ls "$tmp/dist"
"$tmp/venv/bin/pip" install -q --force-reinstall --no-deps "$tmp"/dist/attnbench-*.whl
"$ab" --version
"$ab" report run --out report-from-wheel
test -s report-from-wheel/report.md
step "passed"

# attnbench: two commands on a fresh machine.
#   make report   set up, run the default sweep for this machine (GPU if any, else a small CPU run), write the report
#   make test     set up, lint (ruff check, ruff format --check), run every test (the 25 slowest named), the CI gate (make ci-gate),
#                 then a plain install in a fresh environment (make install-check)
#   make test-fast  the unit tests only (no slow, distributed or GPU test)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The exact torch a fresh environment gets; pip's CUDA build on a GPU machine, CPU-only where that is what is there.
TORCH ?= torch==2.13.0
# e.g. VENV_FLAGS=--system-site-packages to reuse a torch already installed on a GPU machine
VENV_FLAGS ?=
# where `make report` writes its run (trials.jsonl) and the report (RUN/report/report.md); OUT=DIR to choose.
# runs/ is not tracked: a new user's run never lands beside the committed results/.
RUN := $(or $(OUT),runs/$(shell date -u +%Y-%m-%dT%H%M%SZ)-make-report)

.PHONY: setup report test test-fast lint ci-gate install-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $@

report: setup
	$(BIN)/attnbench run --profile auto --out $(RUN)
	$(BIN)/attnbench report $(RUN)

test: setup lint
	$(BIN)/python -m pytest -q --durations=25
	@$(MAKE) --no-print-directory ci-gate
	@$(MAKE) --no-print-directory install-check

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not distributed and not gpu"

lint: setup
	$(BIN)/ruff check attnbench tests scripts examples
	$(BIN)/ruff format --check attnbench tests scripts examples

# This project's own regression gate: run the ci profile (CPU, under a minute) and compare
# what does not depend on the machine (reference checks, max-seq under a memory limit, byte
# and FLOP counts) with the committed baseline. After an intended change, regenerate it:
#   rm -rf results/ci-baseline && attnbench run --profile ci --out results/ci-baseline
CI_BASELINE ?= results/ci-baseline
ci-gate: setup
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; status=0; \
	$(BIN)/python -m attnbench run --profile ci --out "$$tmp/ci" || status=$$?; \
	$(BIN)/python -m attnbench check --baseline $(CI_BASELINE) --current "$$tmp/ci" --deterministic || status=$$?; \
	exit $$status

# What a new user gets from `pip install .` alone (no Triton, no test extras) in a fresh
# environment: verify, a small max-seq and report on the CPU; then the wheel `python -m build`
# makes installs and runs (scripts/install_check.sh).
install-check: setup
	PYTHON=$(PYTHON) TORCH="$(TORCH)" BUILDER=$(abspath $(BIN))/python scripts/install_check.sh

clean:
	rm -rf $(VENV) .pytest_cache

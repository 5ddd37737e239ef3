# gigatron developer commands. Everything is set up from scratch on a fresh machine.
# `make help` lists the targets.
PY ?= python3
VENV ?= .venv
# megatron-core, the tests' parity oracle: installed apart from $(VENV) (see requirements-oracle.txt)
ORACLE ?= .venv-oracle
# third-party packages Megatron-LM's unit tests import, for scripts/run_megatron_unit_tests.py only
MEGATRON_TEST_DEPS ?= .venv-megatron-tests
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` (the CI machine has 2 cores); each test file runs on one
# worker (--dist loadfile), so module fixtures and per-file caches are built once
PYTEST_WORKERS ?= 2

.PHONY: help setup oracle megatron-test-deps test lint format train train-fresh clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  make \1\t\2/' | expand -t 20

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml requirements-dev.txt
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed  ## create .venv with torch, gigatron and its extras (no megatron package)
	@if $(BIN)/python -m pip show -q megatron-core >/dev/null 2>&1; then \
	  echo "setup: removing megatron-core from $(VENV) (an older setup installed it; the tests' oracle is in $(ORACLE)/)"; \
	  $(BIN)/python -m pip uninstall -y -q megatron-core; fi
	@# an empty megatron/ left by that uninstall would still be found by import machinery
	@$(BIN)/python -c "import pathlib, site; [p.rmdir() for s in site.getsitepackages() for p in [pathlib.Path(s, 'megatron')] if p.is_dir() and not any(p.iterdir())]"

$(ORACLE)/.installed: $(BIN)/python requirements-oracle.txt
	rm -rf $(ORACLE)
	$(BIN)/python -m pip install -q --no-deps --target $(ORACLE) -r requirements-oracle.txt
	touch $@

oracle: $(ORACLE)/.installed  ## install megatron-core into .venv-oracle/ (tests only, not .venv)

$(MEGATRON_TEST_DEPS)/.installed: $(BIN)/python requirements-megatron-tests.txt
	rm -rf $(MEGATRON_TEST_DEPS)
	$(BIN)/python -m pip install -q --target $(MEGATRON_TEST_DEPS) -r requirements-megatron-tests.txt
	touch $@

megatron-test-deps: $(MEGATRON_TEST_DEPS)/.installed  ## packages Megatron-LM's unit tests import (msgpack, nltk, ...) into .venv-megatron-tests/

lint: setup  ## ruff check and ruff format --check
	$(BIN)/ruff check gigatron tests bench examples scripts
	$(BIN)/ruff format --check gigatron tests bench examples scripts

format: setup  ## ruff format and ruff check --fix
	$(BIN)/ruff format gigatron tests bench examples scripts
	$(BIN)/ruff check --fix gigatron tests bench examples scripts

test: setup lint oracle  ## lint, then the test suite with the megatron-core oracle (what CI runs)
	@# byte-compiled once here: the suite starts hundreds of interpreters (ranks, `gigatron train`),
	@# and under PYTHONDONTWRITEBYTECODE each would compile gigatron's sources again (~1 s each)
	$(BIN)/python -m compileall -q -j 0 gigatron tests > /dev/null
	MEGATRON_ORACLE=$(ORACLE) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

train: setup  ## the demo: tokenizer, data, GPT with TP=2 on 2 ranks, sample (DEMO_ITERS=400)
	$(BIN)/python -m gigatron.cli train --demo

train-fresh: setup  ## the demo from scratch (drops the demo checkpoint and curves first)
	rm -rf $${DEMO_DIR:-runs/demo}/checkpoints $${DEMO_DIR:-runs/demo}/tensorboard
	$(BIN)/python -m gigatron.cli train --demo

clean:  ## remove .venv, .venv-oracle, .venv-megatron-tests and the caches
	rm -rf $(VENV) $(ORACLE) $(MEGATRON_TEST_DEPS) .pytest_cache .ruff_cache

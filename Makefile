# gigatron developer commands. Everything is set up from scratch on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup test lint format train clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml requirements-dev.txt
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(BIN)/ruff check gigatron tests bench examples scripts
	$(BIN)/ruff format --check gigatron tests bench examples scripts

format: setup
	$(BIN)/ruff format gigatron tests bench examples scripts
	$(BIN)/ruff check --fix gigatron tests bench examples scripts

test: setup lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

train: setup
	$(BIN)/python -m gigatron.cli train

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

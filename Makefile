# Every workflow of Gregor. `make run` and `make test` work on a fresh machine: both depend on
# `install`, which creates .venv and installs the project with its test dependencies.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: install run test test-unit test-integration lint format clean bench-storage

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: install
	$(BIN)/gregor local up --data-dir var/local --port 9092

test: install lint
	$(BIN)/pytest $(PYTEST_ARGS)

test-unit: install
	$(BIN)/pytest -m unit $(PYTEST_ARGS)

test-integration: install
	$(BIN)/pytest -m integration $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench-storage: install
	$(BIN)/python -m bench.storage $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache .hypothesis

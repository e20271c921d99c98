# Two commands: `make run` (install + serve on embedded SQLite and the simulator) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: run test lint install bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/swarm-api serve --host $(HOST) --port $(PORT)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check app swarm_api_client tests bench migrations
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest

bench: $(VENV)/.installed-test
	$(BIN)/python -m bench.bench_fanout
	$(BIN)/python -m bench.bench_planning
	$(BIN)/python bench/bench_gateway_pool.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache swarm.db swarm.db-*

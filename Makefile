PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/proxy.yaml

.PHONY: run test test-core lint bench check-config clean

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

bench: $(STAMP)
	$(BIN)/python -m tests.bench

check-config: $(STAMP)
	$(BIN)/responses-proxy --check-config $(CONFIG)

clean:
	rm -rf $(VENV) *.egg-info

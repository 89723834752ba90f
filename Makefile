# Two commands do all set-up on a fresh machine with nothing but Python 3.11+:
#   make demo   create .venv, install pinned deps, train the embedded default end to end
#   make test   same set-up, then the test suite
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
ARGS    ?=

.PHONY: venv model test-models demo test lint bench clean

# torch: keep an importable one (a GPU machine's CUDA build) by letting the venv see it;
# otherwise install the CPU wheel, pinned by a constraints file so nothing pulls a CUDA build.
$(STAMP): requirements.lock constraints.txt setup.py areal/ring/native/_ringcopy.c areal/ring/native/_xxh3.h
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "using the machine's torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	  $(PY) -m venv --system-site-packages $(VENV) && \
	  echo "torch==$$($(PY) -c 'import torch; print(torch.__version__)')" > $(VENV)/constraints.txt; \
	else \
	  $(PY) -m venv $(VENV) && cp constraints.txt $(VENV)/constraints.txt && \
	  $(VPY) -m pip install -q torch==2.13.0 -c $(VENV)/constraints.txt; \
	fi
	$(VPY) -m pip install -q -r requirements.lock -c $(VENV)/constraints.txt
	$(VPY) -m pip install -q --no-deps -e .   # so `python3 examples/.../train.py` imports areal
	$(VPY) -m pip check
	touch $(STAMP)

venv: $(STAMP)

# Builds the embedded tokenizer + model once (cached by content hash under $$AREAL_CACHE,
# default ~/.cache/areal). The tests also need the scripted test model (replies fixed by
# contract, areal/embedded/scripted.py): built alongside, one torch thread each.
model: venv
	$(VPY) -m areal.embedded

test-models: venv
	$(VPY) -m areal.embedded --with-scripted

demo: model
	$(VPY) -m areal.train $(ARGS)

# The Node agent test's npm dependency (the official openai client), from the npm registry.
NODE_AGENT := tests/node_agent
$(NODE_AGENT)/node_modules/.package-lock.json: $(NODE_AGENT)/package.json $(NODE_AGENT)/package-lock.json
	npm ci --prefix $(NODE_AGENT) --no-audit --no-fund

test: test-models $(NODE_AGENT)/node_modules/.package-lock.json
	$(VPY) -m pytest -q $(ARGS)

# ruff: lint (pyflakes, import order, a few bugbear checks) and the formatter, as pyproject.toml configures them.
lint: venv
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .

bench: test-models
	$(VPY) -m benchmarks.run $(ARGS)

clean:
	rm -rf $(VENV) runs outputs multirun .pytest_cache

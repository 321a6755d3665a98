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

.PHONY: install demo test test-story test-system compat clean

install: $(STAMP)

# torch goes in first, pinned, so that nothing later pulls a multi-GB CUDA build on a CPU machine.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/draftsync demo

# The suite without the end-to-end runs below (about 8 min on 2 cores); CI runs those too.
test: install
	$(PY) -m pytest -m "not story and not system"

# `draftsync demo` from a fresh work dir, every step of its story checked (about 8 min on 2 cores).
test-story: install
	$(PY) -m pytest -m story

# Production-like runs with real servers and worker processes: webhook to completed sync, a worker killed at
# every stage of a sync, MLflow stopped mid-sync (about 8 min on 2 cores).
test-system: install
	$(PY) -m pytest -m system

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

clean:
	rm -rf .draftsync

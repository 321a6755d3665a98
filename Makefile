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

.PHONY: install demo test clean

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

test: install
	$(PY) -m pytest

clean:
	rm -rf .draftsync

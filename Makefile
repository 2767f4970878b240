# Set-up and checks. `make doctor` and `make test` each build .venv first (once).
VENV ?= .venv
PY := $(VENV)/bin/python
PLUGINS := plugins/cpu-arm-acl plugins/xpu plugins/cuda-sm90 plugins/rocm
STAMP := $(VENV)/.installed

.PHONY: setup doctor test lint
setup: $(STAMP)

# torch==2.13.0 goes first: a range resolved later would otherwise pull a multi-GB CUDA build.
$(STAMP): pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,bench,dev]' $(addprefix -e ,$(PLUGINS))
	# cuda-sm90 binds its FlashInfer calls to the real API: flashinfer without its CUDA deps
	$(PY) -m pip install -q -e 'plugins/cuda-sm90[api-check]'
	$(PY) -m pip install -q --no-deps 'flashinfer-python>=0.7.4,<0.7.5'
	touch $@

doctor: setup
	$(VENV)/bin/plugin-api doctor

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: setup lint
	$(VENV)/bin/pytest
	$(VENV)/bin/pytest --plugin-api-backend=reference

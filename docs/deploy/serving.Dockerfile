# plugin-api serving image: `vllm serve` (CUDA) through plugin-api-vllm on the cuda-sm90 backend,
# the image docs/deploy/nebius-serverless.md deploys. Build context: the repository root.
#
# The ARG defaults are that guide's pins (tests/test_docs.py checks that they agree), and the
# build stops unless the installed distributions have exactly those versions. The LABELs repeat
# them, so the guide's preflight can read what an image carries before it rents a GPU. The image
# key (`python -m ci.images key docs/deploy/serving.Dockerfile`) covers this file, every COPY
# source and the build args; not what pip resolves beyond the pins below (vLLM's own dependency
# tree): see docs/ci-images.md.

# PyTorch 2.13.0 (the project's torch, and the one vLLM 0.32 requires) with CUDA 13.0 and cuDNN 9;
# devel, for nvcc: FlashInfer compiles its kernels on first use. By digest, as pinned by public
# projects (check it with `skopeo inspect` when you move it).
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-devel@sha256:c74b2049d204a55233abace509fdb1f6bdbe2d169bee382ed2f06cac00ba76c4
FROM ${BASE_IMAGE}

ARG VLLM_VERSION=0.32.0
ARG FLASHINFER_VERSION=0.7.4
ARG PLUGIN_API_VERSION=0.1.0
ARG PLUGIN_API_CUDA_SM90_VERSION=0.1.0
ARG PLUGIN_API_VLLM_VERSION=0.1.0

# FlashInfer JIT-compiles for Hopper only.
ENV FLASHINFER_CUDA_ARCH_LIST=9.0a \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# vLLM pins torch==2.13.0, which the parent's build satisfies (the check after the install
# confirms it kept the parent's CUDA build). vLLM also pins flashinfer-python 0.7.0.post1, outside
# the range cuda-sm90 validates (>=0.7.4,<0.7.5): the validated release replaces it, and nothing
# else is touched (--no-deps; its dependencies' floors are met by vLLM's tree).
RUN python -m pip install "vllm==${VLLM_VERSION}" pluggy==1.7.0 importlib-metadata==10.2.0 \
    && python -m pip install --no-deps "flashinfer-python==${FLASHINFER_VERSION}" \
    && python -c "import torch; assert torch.__version__.startswith('2.13.0') and torch.version.cuda, torch.__version__"

# The host, the plugin and the bridge from this checkout (their versions are the guide's pins).
WORKDIR /opt/plugin-api
COPY pyproject.toml README.md ./
COPY plugin_api ./plugin_api
COPY plugins/cuda-sm90 ./plugins/cuda-sm90
COPY integrations/vllm ./integrations/vllm
RUN python -m pip install --no-deps . ./plugins/cuda-sm90 ./integrations/vllm \
    && python -c "import os; from importlib.metadata import version; \
pins = {'vllm': 'VLLM_VERSION', 'flashinfer-python': 'FLASHINFER_VERSION', \
'plugin-api': 'PLUGIN_API_VERSION', 'plugin-api-cuda-sm90': 'PLUGIN_API_CUDA_SM90_VERSION', \
'plugin-api-vllm': 'PLUGIN_API_VLLM_VERSION'}; \
bad = {d: version(d) for d, a in pins.items() if version(d) != os.environ[a]}; \
assert not bad, f'installed versions differ from the build args: {bad}'"

LABEL org.plugin-api.version.vllm=${VLLM_VERSION} \
      org.plugin-api.version.flashinfer-python=${FLASHINFER_VERSION} \
      org.plugin-api.version.plugin-api=${PLUGIN_API_VERSION} \
      org.plugin-api.version.plugin-api-cuda-sm90=${PLUGIN_API_CUDA_SM90_VERSION} \
      org.plugin-api.version.plugin-api-vllm=${PLUGIN_API_VLLM_VERSION}

EXPOSE 8000

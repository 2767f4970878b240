"""Fixtures of the bridge's tests: tiny local checkpoints, and vLLM runs in subprocesses.

vLLM picks its platform once per process, so each configuration (vLLM's own kernels, the bridge
on a backend; eager or compiled; a dtype) is one ``python -m plugin_api_vllm.generate`` run,
shared by every test that needs it (one engine per model and configuration).

Single-worker runs keep vLLM's engine core in the generate process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): no engine and worker processes to spawn and re-import
per engine, about 3 s to start an engine instead of 20 on 2 cores. vLLM's default multiprocess
path stays covered by the tensor-parallel run, the server and the refusal tests. The runs
compile into a vLLM cache of their own session (``VLLM_CACHE_ROOT``): they never depend on
what an earlier session left in ``~/.cache/vllm``. A test that compares runs asks for them
together (``Runs.get_all``), and those not done yet run side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from plugin_api_vllm.versions import UnsupportedVllm, check_vllm

# How many GiB of KV cache vLLM may take: its default is most of the machine's memory.
KV_SPACE_GIB = "1"
MODELS = ("llama", "qwen3", "sliding", "softcap", "sinks")  # the default set of a run
BUILT = (*MODELS, "llama-w8a8", "kv-sharing")
# chunked=True: a token budget of 48 per step prefills the longer prompts in chunks beside
# running decodes, then a follow-up wave re-reads the prompts' blocks from the prefix cache
# (blocks of 32, a size vLLM's own CPU attention runs unsplit)
CHUNKED = ["--max-num-batched-tokens", "48", "--block-size", "32", "--follow-up"]
# speculative=True: vLLM's n-gram proposer drafts up to 3 tokens, verified in decodes of up to 4
SPECULATIVE = ["--ngram-speculative-tokens", "3"]


def vllm_missing() -> str | None:
    try:
        check_vllm()
    except UnsupportedVllm as e:
        return str(e)
    return None


def tp_binding(ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND giving each of ``ranks`` workers its own cores.

    vLLM's automatic binding wants one NUMA node per worker; CI machines have one node."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < ranks:
        pytest.skip(f"tensor parallel {ranks} needs {ranks} cores; this machine has {len(cores)}")
    share = len(cores) // ranks
    groups = [cores[r * share : (r + 1) * share] for r in range(ranks)]
    return "|".join(",".join(map(str, g)) for g in groups)


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    env |= {"VLLM_CPU_KVCACHE_SPACE": KV_SPACE_GIB, "TOKENIZERS_PARALLELISM": "false"}
    return env | extra


def run_module(
    args: list[str], env: dict[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


# Test modules take the helpers as fixtures (conftest is not importable under importlib mode).
@pytest.fixture(scope="session")
def env() -> Callable[..., dict[str, str]]:
    return base_env


@pytest.fixture(scope="session")
def run() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_module


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from plugin_api_vllm.tiny_model import build

    root = tmp_path_factory.mktemp("models")
    return {kind: build(kind, root / kind) for kind in BUILT}


# How many generate runs go at once when a test asks for several: each spends most of its time
# single-threaded (imports, engine start, a tiny model's steps), so two side by side on 2 cores
# took 0.65x the time of one after the other, with the same tokens and logits bit for bit.
SIDE_BY_SIDE = 2


@dataclass(frozen=True)
class RunConfig:
    """One generate run: ``backend`` None is vLLM's own kernels; ``kinds`` the models it loads.
    ``lora``: the prompts again with a LoRA adapter of the (one) model
    (``tiny_model.lora_adapter``)."""

    backend: str | None
    dtype: str = "float32"
    compiled: bool = False
    kinds: tuple[str, ...] = MODELS
    strict: bool = True
    kv_cache_dtype: str = "auto"
    tensor_parallel: int = 1
    chunked: bool = False
    speculative: bool = False
    lora: bool = False


class Runs:
    """vLLM generations, one subprocess per configuration, each run once per session."""

    def __init__(self, models: dict[str, Path], out: Path) -> None:
        self.models = models
        self.out = out
        # VLLM_CACHE_ROOT of every run: compiled graphs, and the model architectures vLLM
        # inspected (a subprocess per model on a miss); vLLM writes its entries atomically
        self.cache = out / "vllm-cache"
        self._done: dict[RunConfig, dict[str, Any]] = {}

    def get(self, backend: str | None, **config: Any) -> dict[str, dict[str, Any]]:
        """``{kind: run}`` of the run ``RunConfig(backend, **config)``."""
        (got,) = self.get_all((backend, config))
        return got

    def get_all(
        self, *wanted: tuple[str | None, dict[str, Any]]
    ) -> list[dict[str, dict[str, Any]]]:
        """``get`` of each ``(backend, config)``; the runs not done yet go side by side."""
        configs = [RunConfig(backend, **config) for backend, config in wanted]
        todo = list(dict.fromkeys(c for c in configs if self._covering(c) is None))
        names = [f"run{len(self._done) + i}" for i in range(len(todo))]
        for c in todo:
            if c.lora:  # the adapter once, before the runs that read it
                (kind,) = c.kinds
                self._adapter(kind)
        with ThreadPoolExecutor(max_workers=SIDE_BY_SIDE) as pool:
            for config, runs in zip(todo, pool.map(self._run, todo, names), strict=True):
                self._done[config] = runs
        out = []
        for c in configs:
            done = self._covering(c)
            assert done is not None
            out.append({kind: done[kind] for kind in c.kinds})
        return out

    def _covering(self, config: RunConfig) -> dict[str, Any] | None:
        """A finished run of ``config``, or of the same configuration with more models."""
        for done, runs in self._done.items():
            same = replace(done, kinds=()) == replace(config, kinds=())
            if same and set(config.kinds) <= set(done.kinds):
                return runs
        return None

    def _adapter(self, kind: str) -> Path:
        """The LoRA adapter of the model ``kind``, written once."""
        from plugin_api_vllm.tiny_model import lora_adapter

        adapter = self.out / f"{kind}-lora"
        if not adapter.exists():
            lora_adapter(self.models[kind], adapter)
        return adapter

    def _run(self, config: RunConfig, name: str) -> dict[str, Any]:
        out = self.out / f"{name}.json"
        args = ["plugin_api_vllm.generate", "--dtype", config.dtype, "--top2", "--json", str(out)]
        args += ["--kv-cache-dtype", config.kv_cache_dtype]
        args += ["--tensor-parallel-size", str(config.tensor_parallel)]
        for kind in config.kinds:
            args += ["--model", str(self.models[kind])]
        if config.compiled:
            args.append("--compiled")
        if config.chunked:
            args += CHUNKED
        if config.speculative:
            args += SPECULATIVE
        if config.lora:
            args += ["--lora", str(self._adapter(config.kinds[0]))]
        extra = {"VLLM_CACHE_ROOT": str(self.cache)}
        if config.tensor_parallel > 1:
            extra["VLLM_CPU_OMP_THREADS_BIND"] = tp_binding(config.tensor_parallel)
        else:  # the engine core and its one worker in this process (see the module doc)
            extra["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if config.backend is not None:
            extra |= {
                "PLUGIN_API_BACKEND": config.backend,
                "PLUGIN_API_STRICT": "1" if config.strict else "0",
            }
        r = run_module(args, base_env(**extra))
        assert r.returncode == 0, (
            f"vLLM run {config} failed:\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
        )
        return dict(zip(config.kinds, json.loads(out.read_text()), strict=True))


@pytest.fixture(scope="session")
def runs(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    yield Runs(tiny_models, tmp_path_factory.mktemp("runs"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = vllm_missing()
    for item in items:
        if "integrations/vllm" in str(item.path):
            item.add_marker(pytest.mark.vllm)
            if missing and "needs_vllm" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=missing))

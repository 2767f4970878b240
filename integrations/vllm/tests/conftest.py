"""Fixtures of the bridge's tests: tiny local checkpoints, and vLLM runs in subprocesses.

vLLM picks its platform once per process, so each configuration (vLLM's own kernels, the bridge
on a backend; eager or compiled; a dtype) is one ``python -m plugin_api_vllm.generate`` run,
shared by every test that needs it (one engine per model and configuration).

Single-worker runs keep vLLM's engine core in the generate process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): no engine and worker processes to spawn and re-import
per engine, about 3 s to start an engine instead of 20 on 2 cores. vLLM's default multiprocess
path stays covered by the tensor-parallel run, the server and the refusal tests. The runs
compile into a vLLM cache of their own session (``VLLM_CACHE_ROOT``): they never depend on
what an earlier session left in ``~/.cache/vllm``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
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


class Runs:
    """vLLM generations, one subprocess per configuration, each run once per session."""

    def __init__(self, models: dict[str, Path], out: Path) -> None:
        self.models = models
        self.out = out
        self.cache = out / "vllm-cache"  # VLLM_CACHE_ROOT of every run (compiled graphs)
        self._done: dict[tuple[Any, ...], dict[str, Any]] = {}

    def get(
        self,
        backend: str | None,
        *,
        dtype: str = "float32",
        compiled: bool = False,
        kinds: tuple[str, ...] = MODELS,
        strict: bool = True,
        kv_cache_dtype: str = "auto",
        tensor_parallel: int = 1,
        chunked: bool = False,
        speculative: bool = False,
        lora: bool = False,
    ) -> dict[str, dict[str, Any]]:
        """``{kind: run}``; ``backend`` None is vLLM's own kernels. ``lora``: the prompts again
        with a LoRA adapter of the (one) model (``tiny_model.lora_adapter``)."""
        key = (backend, dtype, compiled, kinds, strict, kv_cache_dtype, tensor_parallel)
        key += (chunked, speculative, lora)
        for done, got in self._done.items():  # a run of more models in the same configuration
            if done[:3] + done[4:] == key[:3] + key[4:] and set(kinds) <= set(done[3]):
                return {kind: got[kind] for kind in kinds}
        if key not in self._done:
            out = self.out / f"run{len(self._done)}.json"
            args = ["plugin_api_vllm.generate", "--dtype", dtype, "--top2", "--json", str(out)]
            args += ["--kv-cache-dtype", kv_cache_dtype]
            args += ["--tensor-parallel-size", str(tensor_parallel)]
            for kind in kinds:
                args += ["--model", str(self.models[kind])]
            if compiled:
                args.append("--compiled")
            if chunked:
                args += CHUNKED
            if speculative:
                args += SPECULATIVE
            if lora:
                from plugin_api_vllm.tiny_model import lora_adapter

                (kind,) = kinds
                adapter = self.out / f"{kind}-lora"
                if not adapter.exists():
                    lora_adapter(self.models[kind], adapter)
                args += ["--lora", str(adapter)]
            extra = {"VLLM_CACHE_ROOT": str(self.cache)}
            if tensor_parallel > 1:
                extra["VLLM_CPU_OMP_THREADS_BIND"] = tp_binding(tensor_parallel)
            else:  # the engine core and its one worker in this process (see the module doc)
                extra["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            if backend is not None:
                extra |= {
                    "PLUGIN_API_BACKEND": backend,
                    "PLUGIN_API_STRICT": "1" if strict else "0",
                }
            r = run_module(args, base_env(**extra))
            assert r.returncode == 0, (
                f"vLLM run {key} failed:\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
            )
            runs = json.loads(out.read_text())
            self._done[key] = dict(zip(kinds, runs, strict=True))
        return self._done[key]


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

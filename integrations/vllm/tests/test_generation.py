"""vLLM generates through the bridge: the same greedy tokens as vLLM's own CPU kernels (fp32),
divergences only at near-ties (bf16), and native plugin-api implementations behind every layer."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.needs_vllm

BRIDGED = ("reference", "cpu-arm-acl")
MODELS = ("llama", "qwen3", "sliding", "softcap", "sinks")  # the runs fixture's default set
# one process per side and mode carries every model compared in that mode
EAGER = (*MODELS, "llama-w8a8", "kv-sharing")
COMPILED = (*MODELS, "kv-sharing")
EAGER_CHUNKED = COMPILED  # the runs fixture's chunked schedule
# vLLM 0.32's own int8 W8A8 runs its sgl kernel where the CPU has AMX tiles (its own test,
# check_cpu_sgl_kernel), and that kernel takes bf16/fp16 activations only: this fp32 model stops
# its start ("int8_scaled_mm_with_quant: expect A to be bfloat16 or half"). There vLLM's own
# side runs the other models, and the bridge's int8 tokens are held to the reference backend's.
OWN_W8A8_FP32 = not torch.cpu._is_amx_tile_supported()
OWN_EAGER = EAGER if OWN_W8A8_FP32 else tuple(k for k in EAGER if k != "llama-w8a8")
OWN_INT8_PROBE = Path(__file__).with_name("own_int8_probe.py")


@pytest.fixture(scope="module")
def own_int8_inexact(env: Any) -> str | None:
    """Why vLLM's own int8 W8A8 is no oracle on this machine, or None when it is one."""
    if not OWN_W8A8_FP32:
        return "vLLM's own int8 path takes no fp32 activations on AMX"
    r = subprocess.run(
        [sys.executable, str(OWN_INT8_PROBE)], env=env(), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-4000:]
    probe = json.loads(r.stdout.strip().splitlines()[-1])
    if probe["max_abs_error"] == 0:
        return None
    # oneDNN without VNNI (AVX2-only CPUs) sums u8 x s8 pairs in int16 and saturates
    return (
        f"vLLM's own int8 GEMM ({probe['kernel']}) is not exact on this CPU: "
        f"max error {probe['max_abs_error']:.0f} of {probe['max_abs']:.0f} on full-range int8"
    )


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return i
    return None


@pytest.mark.parametrize("backend", BRIDGED)
def test_fp32_eager_tokens_equal_vllm_own(runs: Any, backend: str) -> None:
    own, bridged = runs.get_all((None, {"kinds": OWN_EAGER}), (backend, {"kinds": EAGER}))
    for kind in MODELS:
        assert bridged[kind]["backend"] == backend
        assert not bridged[kind]["compiled"] and bridged[kind]["compiled_modules"] == 0, kind
        assert bridged[kind]["tokens"] == own[kind]["tokens"], kind


def test_fp32_compiled_tokens_equal_eager_and_vllm_own(runs: Any) -> None:
    # vLLM's default mode: torch.compile traces each model once, the bridge's custom ops
    # (linear layers, LM head) and vLLM's attention op inside the graph. One backend carries it:
    # the ops are opaque to the compiler, so what compiled mode changes (the bridge's op
    # registrations, their fake implementations) is the same code for every backend. The oracle
    # is vLLM's own eager run: a compiled run of vLLM's own would add a check of vLLM only.
    backend = "cpu-arm-acl"
    compiled, eager, own = runs.get_all(
        (backend, {"compiled": True, "kinds": COMPILED}),
        (backend, {"kinds": EAGER}),
        (None, {"kinds": OWN_EAGER}),
    )
    for kind in COMPILED:
        run = compiled[kind]
        # vLLM kept compilation on and the model's forward ran a compiled graph
        assert run["compiled"] and run["compiled_modules"], kind
        assert run["backend"] == backend
        assert run["tokens"] == eager[kind]["tokens"] == own[kind]["tokens"], kind
        # the compiled graphs called plugin-api for every layer (the ops count their calls)
        served = native_served(run["report"], backend)
        assert set(served) == {"attention", "linear", "lm_head"}, kind


# The int8 GEMM is exact on both sides (the kit checks it bit for bit), but the activations it
# quantizes come from each side's fp32 attention, which differ in their last bits: an int8 code
# that rounds the other way moved this model's logits by up to 0.21% (measured: the AVX2 path
# against the reference). A wrong int8 path moves them by more: vLLM's saturating oneDNN kernel
# on AVX2 by 0.5-5% at the first token of each prompt, 13% later.
INT8_LOGIT_TOLERANCE = 0.01  # relative to the oracle's top logit


@pytest.mark.parametrize("backend", BRIDGED)
def test_int8_w8a8_agrees_with_exact_int8(
    runs: Any, backend: str, own_int8_inexact: str | None
) -> None:
    # the oracle is a run whose int8 sums are exact: vLLM's own where its kernel is (the
    # probe), else the reference backend's (fp64 sums)
    if own_int8_inexact is not None and backend == "reference":
        pytest.skip(f"{own_int8_inexact}: the oracle is this run")
    bridged = runs.get(backend, kinds=EAGER)["llama-w8a8"]
    if own_int8_inexact is None:
        want = runs.get(None, kinds=OWN_EAGER)["llama-w8a8"]
    else:
        want = runs.get("reference", kinds=EAGER)["llama-w8a8"]
    agree = total = 0
    for i, (a, b) in enumerate(zip(want["tokens"], bridged["tokens"], strict=True)):
        step = first_divergence(a, b)
        agree += len(a) if step is None else step
        total += len(a)
        for s in range(len(a) if step is None else step):  # same history: same top token
            (_, lw), (_, lb) = want["top2"][i][s][0], bridged["top2"][i][s][0]
            assert abs(lw - lb) <= INT8_LOGIT_TOLERANCE * abs(lw), (
                f"prompt {i} step {s}: top logit {lb:.6g} against the oracle's {lw:.6g}"
            )
        if step is not None:  # only where the oracle's top two were that close
            (_, l1), (_, l2) = want["top2"][i][step]
            assert l1 - l2 <= 2 * INT8_LOGIT_TOLERANCE * abs(l1), (
                f"prompt {i} diverges at step {step}: the oracle's top-2 margin {l1 - l2:.4g}"
            )
    print(f"int8 W8A8 on {backend}: {agree}/{total} tokens agree with the oracle")
    kinds = native_served(bridged["report"], backend)
    assert set(kinds) == {"attention", "linear-int8", "lm_head"}


@pytest.mark.parametrize("backend", BRIDGED)
def test_chunked_prefill_and_prefix_cache_hits_tokens_equal_vllm_own(
    runs: Any, backend: str
) -> None:
    """Serving's schedule: prompts prefilled in chunks of a 48-token budget beside running decodes,
    then every prompt extended, its first blocks read from vLLM's prefix cache. fp32, eager: the
    same tokens as vLLM's own kernels under the same schedule, and the steps were of those
    shapes."""
    from plugin_api_vllm.generate import PROMPTS

    chunked = {"kinds": EAGER_CHUNKED, "chunked": True}
    own, ours = runs.get_all((None, chunked), (backend, chunked))
    for kind in EAGER_CHUNKED:
        assert ours[kind]["tokens"] == own[kind]["tokens"], kind
        for side in (own, ours):  # the follow-ups hit the cache on both sides
            assert any(side[kind]["cached_tokens"][len(PROMPTS) :]), side[kind]["cached_tokens"]
        steps = ours[kind]["report"]["steps"]
        assert steps["mixed"] > 0 and steps["prefills_with_context"] > 0, (kind, steps)


@pytest.mark.parametrize("backend", BRIDGED)
def test_ngram_speculative_decoding_tokens_equal_vllm_own(runs: Any, backend: str) -> None:
    """vLLM's n-gram proposer under serving's schedule, on the model with sliding and global
    layers and sinks: decodes verify up to 3 draft tokens (query length up to 4, the spec's
    ``num_speculative_tokens``). fp32, eager: the same tokens as vLLM's own kernels."""
    kinds = ("sinks",)  # one speculative engine per process (generate's --ngram-speculative-tokens)
    speculative = {"kinds": kinds, "chunked": True, "speculative": True}
    own, ours = (r["sinks"] for r in runs.get_all((None, speculative), (backend, speculative)))
    assert ours["tokens"] == own["tokens"]
    report = ours["report"]
    assert report["steps"]["speculative_decodes"] > 0, report["steps"]
    specs = {e["spec"] for e in report["layers"].values() if e["kind"] == "attention"}
    assert all("spec=3" in spec.split() for spec in specs), specs


@pytest.mark.parametrize("backend", BRIDGED)
def test_lora_adapter_tokens_equal_vllm_own(runs: Any, backend: str) -> None:
    """A LoRA adapter on every linear layer of the Llama: vLLM's LoRA layers wrap the base
    layers, whose GEMMs the bridge serves, and add the adapter's product themselves. fp32, eager:
    the base and the adapted tokens equal vLLM's own, and the adapter changed the tokens."""
    from plugin_api_vllm.generate import PROMPTS

    lora = {"kinds": ("llama",), "lora": True}
    own, ours = (r["llama"] for r in runs.get_all((None, lora), (backend, lora)))
    assert ours["tokens"] == own["tokens"]
    n = len(PROMPTS)
    assert all(a != b for a, b in zip(own["tokens"][:n], own["tokens"][n:], strict=True))
    report = ours["report"]
    assert not report["engine_layers"] and not report["fallbacks"], report
    linear = [e for e in report["layers"].values() if e["kind"] == "linear"]
    assert len(linear) == 8 and all(e["calls"] > 0 for e in linear), linear


@pytest.mark.parametrize("backend", BRIDGED)
def test_kv_sharing_layers_tokens_equal_vllm_own(runs: Any, backend: str) -> None:
    # Gemma-4's last layers read an earlier layer's KV cache (vLLM passes key=value=None to
    # them); in the 4-layer model, 2 (sliding) reads 0 and 3 (global) reads 1
    own = runs.get(None, kinds=OWN_EAGER)["kv-sharing"]
    bridged = runs.get(backend, kinds=EAGER)["kv-sharing"]
    assert bridged["backend"] == backend and bridged["tokens"] == own["tokens"]
    report = bridged["report"]
    served = native_served(report, backend)  # every layer ran, natively on cpu-arm-acl
    assert set(served) == {"attention", "linear", "lm_head"}
    attn = {n: e for n, e in report["layers"].items() if e["kind"] == "attention"}
    shared = {n.split(".")[2] for n, e in attn.items() if "kv-sharing" in e["spec"].split()}
    assert shared == {"2", "3"} and len(attn) == 4
    assert "window=24" in attn["model.layers.2.self_attn.attn"]["spec"]


def test_fp8_kv_cache_on_cpu_arm_acl_equals_the_reference(runs: Any) -> None:
    # vLLM's --kv-cache-dtype fp8 maps to plugin-api's fp8 cache; the contract's oracle is the
    # reference backend (vLLM's own fp8 CPU cache rounds differently: not compared)
    fp8 = {"kinds": ("llama",), "kv_cache_dtype": "fp8"}
    ref, acl = (r["llama"] for r in runs.get_all(("reference", fp8), ("cpu-arm-acl", fp8)))
    assert acl["tokens"] == ref["tokens"]
    attn = [e for e in acl["report"]["layers"].values() if e["kind"] == "attention"]
    assert attn and all("kv=fp8" in e["spec"] and e["path"] == "native" for e in attn)


def native_served(report: dict[str, Any], backend: str) -> dict[str, set[str]]:
    """Implementations per layer kind, after checking that every one is native and ran."""
    assert report["engine_layers"] == [] and report["fallbacks"] == []
    native = backend != "reference"
    kinds: dict[str, set[str]] = {}
    for name, e in report["layers"].items():
        assert e["backend"] == backend and not e["fallback"], (name, e)
        assert e["calls"] > 0, f"{name} never ran"
        assert not native or e["path"] == "native", (name, e)
        kinds.setdefault(e["kind"], set()).add(f"{e['impl']} [{e['path']}]")
    return kinds


def test_cpu_arm_acl_serves_every_layer_natively(runs: Any) -> None:
    for kind, run in runs.get("cpu-arm-acl", kinds=EAGER).items():
        if kind == "llama-w8a8":
            continue  # its int8 layers: test_int8_w8a8_agrees_with_exact_int8
        served = native_served(run["report"], "cpu-arm-acl")
        assert set(served) == {"attention", "linear", "lm_head"}, kind


def bf16_steps(value: float) -> float:
    """Two bf16 rounding steps at ``value`` (8 significant bits)."""
    return 2 * 2.0 ** (math.floor(math.log2(abs(value))) - 7) if value else 0.0


@pytest.mark.parametrize("backend", BRIDGED)
def test_bf16_divergences_sit_at_near_ties(runs: Any, backend: str) -> None:
    bf16 = {"dtype": "bfloat16", "kinds": ("llama",)}
    own, bridged = (r["llama"] for r in runs.get_all((None, bf16), (backend, bf16)))
    agree = total = 0
    for i, (a, b) in enumerate(zip(own["tokens"], bridged["tokens"], strict=True)):
        step = first_divergence(a, b)
        agree += len(a) if step is None else step
        total += len(a)
        if step is None:
            continue
        (t1, l1), (_, l2) = own["top2"][i][step]
        # a real bug cannot hide here: the bridge may only pick differently where vLLM's own
        # top two logits were within two bf16 rounding steps of each other
        assert l1 - l2 <= bf16_steps(max(abs(l1), abs(l2))), (
            f"prompt {i} diverges at step {step}: vLLM's own top-2 margin {l1 - l2:.4g} "
            f"exceeds two bf16 steps at {l1:.4g}"
        )
        assert b[step] != t1
    print(
        f"bf16 llama on {backend}: {agree}/{total} tokens agree with vLLM's own before a near-tie"
    )

"""Which specs the attention implementation accepts, per architecture and FlashInfer version,
with the refusal messages (pure: DeviceInfo for machines that are not here)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plugin_api.device_info import DeviceInfo
from plugin_api.machines import MACHINES
from plugin_api.ops.attention import FP8, AttentionSpec
from plugin_api_cuda_sm90.attention import FlashInferAttention
from plugin_api_cuda_sm90.rules import (
    Arch,
    DecodeKernel,
    attention_decision,
    decode_kernel,
    decodes_in_prefill,
)

H200, B200, RTX = MACHINES["h200"], MACHINES["b200"], MACHINES["rtx-5090"]


def spec_of(**kw: object) -> AttentionSpec:
    base: dict[str, object] = dict(num_heads=64, num_kv_heads=8, head_size=64, block_size=16)
    return AttentionSpec(**{**base, **kw})  # type: ignore[arg-type]


def with_flashinfer(info: DeviceInfo, version: str | None) -> DeviceInfo:
    libs = dict(info.libraries)
    libs.pop("flashinfer-python", None)
    if version is not None:
        libs["flashinfer-python"] = version
    return dataclasses.replace(info, libraries=tuple(libs.items()))


ACCEPTED = {
    "base": {},
    "gpt-oss sliding": dict(sliding_window=128, has_sinks=True, num_speculative_tokens=3),
    "non-causal drafts": dict(causal=False, num_speculative_tokens=3),
    "fp16": dict(dtype=torch.float16),
    "kv sharing": dict(kv_sharing=True, sliding_window=512, head_size=256),
    "block 128": dict(block_size=128, head_size=128),
}


@pytest.mark.parametrize("machine", [H200, RTX], ids=["sm90", "sm120"])
@pytest.mark.parametrize("name", list(ACCEPTED))
def test_xqa_archs_accept(machine: DeviceInfo, name: str) -> None:
    d = attention_decision(spec_of(**ACCEPTED[name]), machine)
    assert d.ok, d.reasons
    assert "xqa decode + FlashInfer FA2 paged prefill" in d.reasons[0]


FA2_FP8 = "fp8 KV cache: decode and prefill rows through the FlashInfer FA2 paged prefill"


# An fp8 cache on SM90/SM12x: every feature the bf16 cache is served with, through FA2 alone.
@pytest.mark.parametrize("machine,arch", [(H200, "sm90"), (RTX, "sm12x")], ids=["sm90", "sm120"])
@pytest.mark.parametrize("name", list(ACCEPTED))
def test_fp8_cache_served_by_fa2_on_xqa_archs(machine: DeviceInfo, arch: str, name: str) -> None:
    d = attention_decision(spec_of(kv_cache_dtype=FP8, **ACCEPTED[name]), machine)
    assert d.ok, d.reasons
    assert d.reasons[0].startswith(f"{arch}: {FA2_FP8}"), d.reasons
    assert "K/V dequantized to the model dtype" in d.reasons[0]
    assert ("(sink-aware variant)" in d.reasons[0]) == bool(ACCEPTED[name].get("has_sinks"))


@pytest.mark.parametrize(
    "arch,kv,kernel",
    [
        (Arch.SM90, torch.bfloat16, DecodeKernel.XQA),
        (Arch.SM12X, torch.bfloat16, DecodeKernel.XQA),
        (Arch.SM100, torch.bfloat16, DecodeKernel.TRTLLM_GEN),
        (Arch.SM90, FP8, DecodeKernel.FA2),
        (Arch.SM12X, FP8, DecodeKernel.FA2),
        (Arch.SM100, FP8, DecodeKernel.TRTLLM_GEN),
    ],
)
def test_decode_kernel_per_arch_and_cache(
    arch: Arch, kv: torch.dtype, kernel: DecodeKernel
) -> None:
    spec = spec_of(kv_cache_dtype=kv)
    assert decode_kernel(spec, arch) is kernel
    assert decodes_in_prefill(spec, arch) is (kernel is DecodeKernel.FA2)


def test_sinks_choose_the_sink_aware_prefill() -> None:
    d = attention_decision(spec_of(has_sinks=True), H200)
    assert d.ok and "(sink-aware variant)" in d.reasons[0]


REFUSED = [
    ("fp32", H200, dict(dtype=torch.float32), "dtype=torch.float32: FlashInfer XQA decode"),
    ("head 80", H200, dict(head_size=80), "head_size=80: served sizes are (64, 128, 256)"),
    ("block 8", H200, dict(block_size=8), "block_size=8: XQA pages are (16, 32, 64, 128)"),
    ("soft cap", H200, dict(logits_soft_cap=30.0), "logits_soft_cap=30: XQA decode has no"),
    ("fp8 query", H200, dict(query_dtype=FP8), "query_dtype=torch.float8_e4m3fn: the xqa"),
    (
        "fp8 kv + soft cap",
        H200,
        dict(kv_cache_dtype=FP8, logits_soft_cap=30.0),
        "logits_soft_cap=30: this plugin's FA2 calls, which run every row of an fp8-cache step",
    ),
    (
        "fp8 kv + fp8 query",
        RTX,
        dict(kv_cache_dtype=FP8, query_dtype=FP8),
        "query_dtype=torch.float8_e4m3fn: the fa2 decode path here takes queries in the model",
    ),
    ("fp8 kv + head 80", H200, dict(kv_cache_dtype=FP8, head_size=80), "head_size=80: served"),
    ("fp8 kv + block 8", RTX, dict(kv_cache_dtype=FP8, block_size=8), "block_size=8: XQA pages"),
    ("fp8 kv + dcp", H200, dict(kv_cache_dtype=FP8, dcp_size=2), "dcp_size=2: decode context"),
    (
        "fp8 kv + fp32",
        H200,
        dict(kv_cache_dtype=FP8, dtype=torch.float32),
        "dtype=torch.float32: FlashInfer XQA decode and FA2 prefill take fp16/bf16",
    ),
    (
        "fp8 kv + kv sharing + dcp",
        RTX,
        dict(kv_cache_dtype=FP8, kv_sharing=True, dcp_size=2),
        "kv_sharing with dcp_size=2",
    ),
    ("fp8 kv, ampere", MACHINES["a100"], dict(kv_cache_dtype=FP8), "no SM90/SM100/SM12x NVIDIA"),
    ("dcp", H200, dict(dcp_size=2), "dcp_size=2: decode context parallelism"),
    (
        "kv sharing + dcp",
        H200,
        dict(dcp_size=2, kv_sharing=True),
        "kv_sharing with dcp_size=2: context-parallel prefill consumes this step's K/V",
    ),
    (
        "sm100 non-causal sinks",
        B200,
        dict(causal=False, has_sinks=True),
        "sinks on the SM100 non-causal (trtllm-gen) path",
    ),
    (
        "sm100 non-causal drafts",
        B200,
        dict(causal=False, num_speculative_tokens=2),
        "trtllm-gen decode applies a causal draft mask only",
    ),
    ("not a GPU", MACHINES["xeon-cpu"], {}, "no SM90/SM100/SM12x NVIDIA GPU"),
    ("ampere", MACHINES["a100"], {}, "no SM90/SM100/SM12x NVIDIA GPU"),
]


@pytest.mark.parametrize("name,machine,kw,message", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_with_reason(name: str, machine: DeviceInfo, kw: dict, message: str) -> None:
    d = attention_decision(spec_of(**kw), machine)
    assert not d.ok
    assert any(message in r for r in d.reasons), d.reasons


def test_sm100_causal_sinks_and_non_causal_single_token_are_served() -> None:
    assert attention_decision(spec_of(has_sinks=True, num_speculative_tokens=3), B200).ok
    assert attention_decision(spec_of(causal=False), B200).ok
    assert attention_decision(spec_of(kv_cache_dtype=FP8), B200).ok  # trtllm-gen, unmeasured


def test_every_failing_reason_is_reported() -> None:
    d = attention_decision(spec_of(head_size=80, logits_soft_cap=5.0, dcp_size=2), H200)
    assert len(d.reasons) == 3


@pytest.mark.parametrize(
    "version,message",
    [
        (None, "flashinfer-python is not installed"),
        ("0.7.1", "flashinfer-python 0.7.1 is outside the validated range"),
        ("0.8.0", "flashinfer-python 0.8.0 is outside the validated range"),
        ("banana", "version 'banana' cannot be parsed"),
    ],
)
def test_flashinfer_version_gates_the_whole_plugin(version: str | None, message: str) -> None:
    d = attention_decision(spec_of(), with_flashinfer(H200, version))
    assert not d.ok and any(message in r for r in d.reasons), d.reasons


# Inside the validated range a FlashInfer version decides nothing about a spec: the same
# features are served at both ends of the range (no feature gate sits inside it).
@pytest.mark.parametrize("version", ["0.7.4", "0.7.4.post1"])
@pytest.mark.parametrize(
    "kw",
    [
        dict(num_speculative_tokens=2),
        dict(sliding_window=32),
        dict(sliding_window=32, has_sinks=True, num_speculative_tokens=3),
    ],
    ids=["ragged", "window", "window-sinks-drafts"],
)
def test_features_are_served_across_the_validated_range(version: str, kw: dict) -> None:
    d = attention_decision(spec_of(**kw), with_flashinfer(H200, version))
    assert d.ok, d.reasons
    assert d.reasons[-1] == f"flashinfer-python {version} (validated range <0.7.5,>=0.7.4)"


# The implementation's ``supports`` (what the host asks) against hand-written expectations:
# (machine, FlashInfer version, spec changes, accepted, the start of every reason in order).
KEEP = "keep"  # the machine's own FlashInfer (0.7.4)
IN_RANGE = "flashinfer-python 0.7.4 (validated range <0.7.5,>=0.7.4)"
DECISIONS: list[tuple[str, DeviceInfo, str | None, dict, bool, tuple[str, ...]]] = [
    ("h200", H200, KEEP, {}, True, ("sm90: xqa decode + FlashInfer FA2 paged prefill", IN_RANGE)),
    (
        "h200 sinks",
        H200,
        KEEP,
        dict(has_sinks=True),
        True,
        ("sm90: xqa decode + FlashInfer FA2 paged prefill (sink-aware variant)", IN_RANGE),
    ),
    (
        "b200 fp8 kv",
        B200,
        KEEP,
        dict(kv_cache_dtype=FP8),
        True,
        ("sm100: trtllm-gen decode + FlashInfer FA2 paged prefill", IN_RANGE),
    ),
    (
        "h200 fp8 kv",
        H200,
        KEEP,
        dict(kv_cache_dtype=FP8),
        True,
        (f"sm90: {FA2_FP8}, K/V dequantized to the model dtype", IN_RANGE),
    ),
    (
        "rtx fp8 kv + sinks + drafts",
        RTX,
        KEEP,
        dict(kv_cache_dtype=FP8, has_sinks=True, num_speculative_tokens=3),
        True,
        (f"sm12x: {FA2_FP8} (sink-aware variant)", IN_RANGE),
    ),
    (
        "h200 fp8 kv, flashinfer 0.7.5",
        H200,
        "0.7.5",
        dict(kv_cache_dtype=FP8),
        False,
        ("flashinfer-python 0.7.5 is outside the validated range",),
    ),
    (
        "rtx window",
        RTX,
        "0.7.4.post1",
        dict(sliding_window=64),
        True,
        ("sm12x: xqa decode", "flashinfer-python 0.7.4.post1 (validated range"),
    ),
    ("h200 head 80", H200, KEEP, dict(head_size=80), False, ("head_size=80: served sizes",)),
    (
        "h200 head 80 + soft cap + dcp",
        H200,
        KEEP,
        dict(head_size=80, logits_soft_cap=5.0, dcp_size=2),
        False,
        ("head_size=80: served", "logits_soft_cap=5: XQA", "dcp_size=2: decode context"),
    ),
    (
        "h200 fp8 query + window",
        H200,
        KEEP,
        dict(query_dtype=FP8, sliding_window=64),
        False,
        ("query_dtype=torch.float8_e4m3fn: the xqa decode path here takes queries",),
    ),
    (
        "h200 drafts, flashinfer 0.6.16",
        H200,
        "0.6.16",
        dict(num_speculative_tokens=2),
        False,
        ("flashinfer-python 0.6.16 is outside the validated range <0.7.5,>=0.7.4",),
    ),
    (
        "h200 window, flashinfer 0.7.5",
        H200,
        "0.7.5",
        dict(sliding_window=32),
        False,
        ("flashinfer-python 0.7.5 is outside the validated range",),
    ),
    (
        "h200 dcp, no flashinfer",
        H200,
        None,
        dict(dcp_size=2),
        False,
        ("dcp_size=2: decode context", "flashinfer-python is not installed"),
    ),
    (
        "b200 non-causal sinks",
        B200,
        KEEP,
        dict(causal=False, has_sinks=True),
        False,
        ("sinks on the SM100 non-causal (trtllm-gen) path",),
    ),
    ("a100", MACHINES["a100"], KEEP, {}, False, ("no SM90/SM100/SM12x NVIDIA GPU",)),
]


@pytest.mark.parametrize(
    "machine,version,kw,accepted,reasons",
    [row[1:] for row in DECISIONS],
    ids=[row[0] for row in DECISIONS],
)
def test_supports_against_a_hand_written_table(
    machine: DeviceInfo, version: str | None, kw: dict, accepted: bool, reasons: tuple[str, ...]
) -> None:
    info = machine if version == KEEP else with_flashinfer(machine, version)
    d = FlashInferAttention().supports(spec_of(**kw), info)
    assert d.ok is accepted, d.reasons
    assert len(d.reasons) == len(reasons), d.reasons
    for got, want in zip(d.reasons, reasons, strict=True):
        assert got.startswith(want), (got, want)

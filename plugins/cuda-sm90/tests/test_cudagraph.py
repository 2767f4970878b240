"""The CUDA-graph decision table against DeviceInfo for SM90, SM100 and SM120 over a spec
grid, the host's rule that a refused spec is never captured, and the README's copy of the
table."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from plugin_api.contract.graphs import GraphLevel
from plugin_api.machines import MACHINES
from plugin_api.ops.attention import FP8, AttentionSpec
from plugin_api_cuda_sm90.attention import FlashInferAttention
from plugin_api_cuda_sm90.cudagraph import TABLE, cudagraph_support
from plugin_api_cuda_sm90.rules import attention_decision

README = Path(__file__).parents[1] / "README.md"
FP8_ROW = "SM90 or SM12x, fp8 KV cache (every row through the FA2 paged prefill)"
U, S, N = GraphLevel.UNIFORM_BATCH, GraphLevel.UNIFORM_SINGLE_TOKEN_DECODE, GraphLevel.NEVER

GRID = list(
    itertools.product(
        ("h200", "b200", "rtx-5090"),
        (True, False),  # causal
        (0, 3),  # speculative tokens
        (torch.bfloat16, FP8),  # KV dtype
        (1, 2),  # DCP size
    )
)


def expected(machine: str, causal: bool, spec_tokens: int, dcp: int, kv: torch.dtype) -> GraphLevel:
    if dcp > 1:
        return N  # refused: decode context parallelism is not implemented
    if kv == FP8 and machine != "b200":
        return N  # served, every row by the FA2 paged prefill, which plans on the host
    if machine == "b200" and not causal:
        return N if spec_tokens else S  # refused: trtllm-gen has only a causal draft mask
    return U


@pytest.mark.parametrize("machine,causal,spec_tokens,kv,dcp", GRID)
def test_grid(machine: str, causal: bool, spec_tokens: int, kv: torch.dtype, dcp: int) -> None:
    spec = AttentionSpec(
        32,
        8,
        128,
        causal=causal,
        num_speculative_tokens=spec_tokens,
        kv_cache_dtype=kv,
        dcp_size=dcp,
    )
    g = cudagraph_support(spec, MACHINES[machine])
    assert g.level == expected(machine, causal, spec_tokens, dcp, kv), g.reason
    served = attention_decision(spec, MACHINES[machine]).ok
    assert g.reason.startswith("not served here: ") is not served, g.reason


@pytest.mark.parametrize(
    "machine,kw,level,reason",
    [
        ("a100", {}, N, "not served here: no SM90/SM100/SM12x NVIDIA GPU"),
        ("xeon-cpu", {}, N, "not served here: no SM90/SM100/SM12x NVIDIA GPU"),
        ("h200", dict(head_size=96), N, "not served here: head_size=96: served sizes"),
        ("h200", dict(kv_cache_dtype=torch.float32, dtype=torch.float32), N, "dtype=torch.float32"),
        ("b200", dict(dcp_size=4), N, "not served here: dcp_size=4: decode context parallelism"),
        ("b200", dict(causal=False), S, "trtllm-gen decode has no non-causal draft mask"),
        ("h200", dict(causal=False, num_speculative_tokens=3), U, "bit-packed draft mask"),
        ("h200", dict(kv_cache_dtype=FP8), N, f"{FP8_ROW}: decode rows run in the FA2 paged"),
        ("rtx-5090", dict(kv_cache_dtype=FP8, has_sinks=True), N, "plans on the host per batch"),
        ("h200", dict(kv_cache_dtype=FP8, num_speculative_tokens=3), N, "no step is captured"),
        ("b200", dict(kv_cache_dtype=FP8), U, "trtllm-gen decode takes q_len_per_req"),
        ("h200", {}, U, "SM90 or SM12x, fp16/bf16 KV cache (XQA)"),
    ],
)
def test_named_rows(machine: str, kw: dict, level: GraphLevel, reason: str) -> None:
    g = cudagraph_support(AttentionSpec(32, 8, **{"head_size": 128, **kw}), MACHINES[machine])
    assert g.level == level and reason in g.reason, g


def test_out_of_range_flashinfer_claims_nothing() -> None:
    import dataclasses

    h = MACHINES["h200"]
    old = dataclasses.replace(h, libraries=(("flashinfer-python", "0.6.0"), ("torch", "2.13.0")))
    g = cudagraph_support(AttentionSpec(32, 8, 128), old)
    assert g.level == N and "0.6.0 is outside the validated range" in g.reason


# A spec this plugin refuses, on the machine that refuses it, and the start of the refusal. Its
# graph level must be NEVER with the refusal as the reason: a higher level would promise a
# captured graph of code that never runs.
REFUSED: list[tuple[str, dict[str, object], str]] = [
    ("h200", dict(dcp_size=2), "dcp_size=2: decode context parallelism"),
    ("b200", dict(dcp_size=2), "dcp_size=2: decode context parallelism"),
    ("rtx-5090", dict(dcp_size=4), "dcp_size=4: decode context parallelism"),
    ("h200", dict(logits_soft_cap=30.0), "logits_soft_cap=30: XQA decode has no soft cap"),
    ("b200", dict(logits_soft_cap=30.0), "logits_soft_cap=30: XQA decode has no soft cap"),
    ("h200", dict(query_dtype=FP8), "query_dtype=torch.float8_e4m3fn: the xqa decode path"),
    ("h200", dict(block_size=8), "block_size=8: XQA pages are"),
    ("h200", dict(kv_cache_dtype=FP8, logits_soft_cap=5.0), "logits_soft_cap=5: this plugin's FA2"),
    ("rtx-5090", dict(kv_cache_dtype=FP8, dcp_size=2), "dcp_size=2: decode context parallelism"),
    ("b200", dict(causal=False, has_sinks=True), "sinks on the SM100 non-causal"),
    ("b200", dict(causal=False, num_speculative_tokens=2), "non-causal speculative decode"),
    ("a100", {}, "no SM90/SM100/SM12x NVIDIA GPU"),
]


@pytest.mark.parametrize(
    "machine,kw,refusal", REFUSED, ids=[f"{m}-{'-'.join(kw) or 'base'}" for m, kw, _ in REFUSED]
)
def test_a_refused_spec_is_never_captured(machine: str, kw: dict, refusal: str) -> None:
    impl, info = FlashInferAttention(), MACHINES[machine]
    spec = AttentionSpec(32, 8, 128, **kw)
    d = impl.supports(spec, info)
    assert not d.ok and any(r.startswith(refusal) for r in d.reasons), d.reasons
    g = impl.graph_support(spec, info)
    assert g.level == N, g
    assert g.reason == f"not served here: {d.because()}"


BROAD = list(
    itertools.product(
        ("h200", "b200", "rtx-5090", "a100"),
        (True, False),  # causal
        (0, 2),  # speculative tokens
        (torch.bfloat16, FP8),  # KV dtype
        (1, 2),  # DCP size
        (None, 20.0),  # soft cap
        (False, True),  # sinks
    )
)


def test_the_level_is_never_exactly_where_the_spec_is_refused_or_fp8_on_fa2() -> None:
    """Above NEVER iff served, except an fp8 cache on SM90/SM12x: served, never captured."""
    impl = FlashInferAttention()
    for machine, causal, spec_tokens, kv, dcp, cap, sinks in BROAD:
        spec = AttentionSpec(
            32,
            8,
            128,
            causal=causal,
            num_speculative_tokens=spec_tokens,
            kv_cache_dtype=kv,
            dcp_size=dcp,
            logits_soft_cap=cap,
            has_sinks=sinks,
        )
        served = impl.supports(spec, MACHINES[machine]).ok
        fa2_fp8 = kv == FP8 and machine in ("h200", "rtx-5090")
        level = impl.graph_support(spec, MACHINES[machine]).level
        assert (level > N) == (served and not fa2_fp8), (machine, spec.describe(), level)


def test_no_served_spec_claims_full_mixed_graphs() -> None:
    """Prefill plans on the host per batch: no accepted spec may say ALWAYS."""
    for machine, causal, spec_tokens, kv, _ in GRID:
        spec = AttentionSpec(
            32, 8, 128, causal=causal, num_speculative_tokens=spec_tokens, kv_cache_dtype=kv
        )
        if attention_decision(spec, MACHINES[machine]).ok:
            assert cudagraph_support(spec, MACHINES[machine]).level < GraphLevel.ALWAYS


def test_readme_documents_every_row() -> None:
    text = README.read_text()
    for rule in TABLE:
        row = f"| {rule.condition} | {rule.level} | {rule.reason} |"
        assert row in text, f"README lacks the row: {row}"

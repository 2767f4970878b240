"""The CUDA-graph decision table against DeviceInfo for SM90, SM100 and SM120 over a spec
grid, and the README's copy of the table."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from plugin_api.contract.graphs import GraphLevel
from plugin_api.machines import MACHINES
from plugin_api.ops.attention import FP8, AttentionSpec
from plugin_api_cuda_sm90.cudagraph import TABLE, cudagraph_support
from plugin_api_cuda_sm90.rules import attention_decision

README = Path(__file__).parents[1] / "README.md"
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


def expected(machine: str, causal: bool, dcp: int, kv: torch.dtype) -> GraphLevel:
    if kv == FP8 and machine != "b200":
        return N
    if dcp > 1:
        return S
    if machine == "b200" and not causal:
        return S
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
    assert g.level == expected(machine, causal, dcp, kv), g.reason
    assert g.reason


@pytest.mark.parametrize(
    "machine,kw,level,reason",
    [
        ("a100", {}, N, "architecture is not SM90, SM100 or SM12x"),
        ("xeon-cpu", {}, N, "architecture is not SM90, SM100 or SM12x"),
        ("h200", dict(head_size=96), N, "head size not in (64, 128, 256)"),
        ("h200", dict(kv_cache_dtype=torch.float32, dtype=torch.float32), N, "KV dtype not"),
        ("b200", dict(dcp_size=4), S, "varlen decode is not"),
        ("b200", dict(causal=False), S, "trtllm-gen decode has no non-causal draft mask"),
        ("h200", dict(causal=False, num_speculative_tokens=3), U, "bit-packed draft mask"),
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
    assert g.level == N and "validated version range" in g.reason


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

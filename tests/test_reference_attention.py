"""The reference attention against the independent dense oracle, for random specs and batches."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plugin_api as pa
from plugin_api.conformance.cases import make_case
from plugin_api.conformance.test_attention import TOLERANCE, assert_same_in_every_layout


@functools.cache
def reference() -> pa.Backend:
    return pa.backend_for("reference")


@st.composite
def specs(draw):
    kv = draw(st.sampled_from([1, 2, 4]))
    causal = draw(st.booleans())
    spec_tokens = draw(st.integers(0, 3))
    return pa.AttentionSpec(
        num_heads=kv * draw(st.sampled_from([1, 2, 4])),
        num_kv_heads=kv,
        head_size=draw(st.sampled_from([16, 40, 64])),
        dtype=draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])),
        kv_cache_dtype=draw(st.sampled_from([None, torch.float8_e4m3fn])),
        block_size=draw(st.sampled_from([4, 16])),
        sliding_window=draw(st.none() | st.integers(1, 12)) if causal else None,
        logits_soft_cap=draw(st.none() | st.floats(1.0, 30.0)),
        has_sinks=draw(st.booleans()),
        causal=causal,
        kv_sharing=draw(st.booleans()),
        num_speculative_tokens=spec_tokens,
        scale=draw(st.none() | st.floats(0.02, 0.5)),
    )


@st.composite
def steps(draw):
    spec = draw(specs())
    n_dec = draw(st.integers(0, 3))
    n_pre = draw(st.integers(0 if n_dec else 1, 2))
    dec_q = [draw(st.integers(1, 1 + spec.num_speculative_tokens)) for _ in range(n_dec)]
    pre_q = [draw(st.integers(1, 9)) for _ in range(n_pre)]
    qlens = dec_q + pre_q
    slens = [q + draw(st.integers(0, 30)) for q in qlens]
    return spec, qlens, slens, n_dec, draw(st.integers(0, 10_000))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_reference_matches_dense_oracle(step):
    spec, qlens, slens, n_dec, seed = step
    case = make_case(
        spec,
        qlens,
        slens,
        num_decodes=n_dec,
        device="cpu",
        seed=seed,
        k_scale=0.5 if spec.fp8_kv else 1.0,
    )
    attn = pa.attention(spec, reference())
    out = attn.run(
        case.query, case.key, case.value, case.cache, attn.plan(case.batch), sinks=case.sinks
    )
    torch.testing.assert_close(
        out[: case.num_tokens].float(), case.expected(), **TOLERANCE[spec.dtype]
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize(
    "spec_tokens,batch",
    [(0, ([1, 1, 7, 12], [20, 33, 7, 40], 2)), (3, ([4, 2, 9], [20, 31, 9], 2))],
    ids=["prefill+decode", "spec-decode+prefill"],
)
def test_strided_query_gives_the_contiguous_result(dtype, spec_tokens, batch):
    """A query with strided rows and heads (the split of a fused QKV output, padded heads,
    head-major memory) gives exactly the output and cache write of its contiguous copy."""
    spec = pa.AttentionSpec(
        8, 2, 32, dtype, block_size=16, num_speculative_tokens=spec_tokens, has_sinks=True
    )
    qlens, slens, n_dec = batch
    case = make_case(spec, qlens, slens, num_decodes=n_dec, device="cpu", seed=4, pad_rows=2)
    assert_same_in_every_layout(reference(), case)

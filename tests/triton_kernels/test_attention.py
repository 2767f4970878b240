"""The Triton paged-attention and cache-write kernels through the host op, against the dense
oracle with the kit's tolerances and its bit-exact cache check (``run_and_check``)."""

from __future__ import annotations

import pytest
import torch

from plugin_api.conformance.cases import make_case
from plugin_api.conformance.test_attention import (
    BATCHES,
    SPEC_BATCHES,
    assert_same_in_every_layout,
    run_and_check,
    spec_of,
)
from plugin_api.conformance.test_attention import FEATURES as KIT_FEATURES
from plugin_api.contract.decision import ImplPath
from plugin_api.contract.graphs import GraphLevel
from plugin_api.ops.attention import FP8, Attention

FEATURES: dict[str, dict[str, object]] = {
    **KIT_FEATURES,
    "group-3": dict(num_heads=6, num_kv_heads=2),  # a GQA group that is not a power of two
    "block-5": dict(block_size=5),  # pages need not be a power of two
}


def _check(backend, device, spec, query_lens, seq_lens, num_decodes, seed=0, **kw):
    case = make_case(
        spec, query_lens, seq_lens, num_decodes=num_decodes, device=device, seed=seed, **kw
    )
    run_and_check(backend, device, case)
    attn = Attention(spec, backend)
    assert (attn.provenance.path, attn.provenance.impl) == (ImplPath.TRITON, "triton")


@pytest.mark.parametrize("feature", list(FEATURES))
def test_features_on_a_mixed_batch(triton_backend, triton_device, feature):
    """Prefill and decode rows in one launch, each feature of the op semantics."""
    _check(triton_backend, triton_device, spec_of(**FEATURES[feature]), *BATCHES["mixed"])


@pytest.mark.parametrize("shape", [*BATCHES, *SPEC_BATCHES])
def test_batch_shapes(triton_backend, triton_device, shape):
    """Decode-only, prefill-only, one-token sequences, chunked prefill, uniform and ragged
    multi-token (speculative) decode."""
    q, lens, nd = {**BATCHES, **SPEC_BATCHES}[shape]
    _check(triton_backend, triton_device, spec_of(num_speculative_tokens=3), q, lens, nd)


def test_ragged_non_causal_draft_rows(triton_backend, triton_device):
    spec = spec_of(num_speculative_tokens=3, causal=False, has_sinks=True)
    _check(triton_backend, triton_device, spec, *SPEC_BATCHES["ragged-spec-decode"])


def test_sequences_ending_on_a_block_boundary(triton_backend, triton_device):
    """Sequence lengths that are exact multiples of the block size (the last block is full
    and no further block may be read), as decode, multi-token decode and prefill."""
    spec = spec_of(num_speculative_tokens=3, sliding_window=16)
    _check(triton_backend, triton_device, spec, [1, 4, 16, 32], [32, 16, 48, 32], 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("feature", ["sinks+window", "fp8-kv"])
def test_model_dtypes(triton_backend, triton_device, dtype, feature):
    spec = spec_of(dtype=dtype, **FEATURES[feature])
    _check(triton_backend, triton_device, spec, *BATCHES["mixed"])


def test_padding_rows_and_skipped_slots(triton_backend, triton_device):
    """NaN query rows past the batch never leak in; slot -1 tokens are neither written nor
    their K/V rows read."""
    _check(
        triton_backend, triton_device, spec_of(), *BATCHES["mixed"], pad_rows=5, skip_tokens=(1, 4)
    )


def test_strided_query_is_read_in_place(triton_backend, triton_device):
    """Rows and heads of the query read by stride (a fused QKV split, padded heads,
    head-major memory): the contiguous query's output and cache write, bit for bit, for
    decode, multi-token decode and prefill rows in one launch."""
    spec = spec_of(num_speculative_tokens=3, has_sinks=True)
    case = make_case(
        spec,
        *SPEC_BATCHES["ragged-spec-decode"][:2],
        num_decodes=3,
        device=triton_device,
        seed=6,
        pad_rows=2,
    )
    assert_same_in_every_layout(triton_backend, case)


@pytest.mark.parametrize("k_scale,v_scale", [(0.25, 2.0), (0.3, 1.7)], ids=["pow2", "inexact"])
def test_fp8_scales(triton_backend, triton_device, k_scale, v_scale):
    """Large values stored scaled down; a scale that is no power of two checks the cache
    write's IEEE division bit for bit."""
    _check(
        triton_backend,
        triton_device,
        spec_of(kv_cache_dtype=FP8),
        *BATCHES["mixed"],
        k_scale=k_scale,
        v_scale=v_scale,
        value_scale=40.0,
    )


def test_plan_reuse_refills_the_same_buffers(triton_backend, triton_device):
    """A plan sized by a large batch is refilled in place for smaller ones (fewer sequences,
    fewer tokens, a narrower block table): same storage, correct results."""
    spec = spec_of(has_sinks=True, num_speculative_tokens=3)
    attn = Attention(spec, triton_backend)
    big = make_case(spec, [4, 2, 9, 12], [20, 33, 9, 40], num_decodes=2, device=triton_device)
    first = attn.plan(big.batch)
    before = {k: v.data_ptr() for k, v in first.impl_plan.buffers().items()}
    for seed, (q, lens, nd) in enumerate([([1, 3], [16, 7], 2), ([5], [5], 0)]):
        case = make_case(spec, q, lens, num_decodes=nd, device=triton_device, seed=seed)
        plan = attn.plan(case.batch, reuse=first)
        assert {k: v.data_ptr() for k, v in plan.impl_plan.buffers().items()} == before
        out = torch.full(case.query.shape, float("nan"), dtype=spec.dtype, device=triton_device)
        attn.run(case.query, case.key, case.value, case.cache, plan, sinks=case.sinks, out=out)
        torch.testing.assert_close(
            out[: case.num_tokens].float().cpu(), case.expected(), atol=2e-2, rtol=2e-2
        )


def test_plan_reuse_refuses_a_batch_that_does_not_fit(triton_backend, triton_device):
    attn = Attention(spec_of(), triton_backend)
    small = attn.plan(make_case(spec_of(), [1], [5], num_decodes=1, device=triton_device).batch)
    big = make_case(spec_of(), [1, 1], [5, 40], num_decodes=2, device=triton_device)
    with pytest.raises(ValueError, match=r"2 sequences > 1, 3 blocks per sequence > 1"):
        attn.plan(big.batch, reuse=small)


def test_graph_level_follows_the_targets_capture_answer(triton_backend, triton_device):
    """The fixture target captures no graph, so the level is NEVER with that reason."""
    support = Attention(spec_of(), triton_backend).graph_support()
    assert support.level == GraphLevel.NEVER
    assert support.reason == "test fixture: no graph is captured"

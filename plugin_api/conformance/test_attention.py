"""Conformance: paged attention against the dense oracle, cache writes bit for bit."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from plugin_api.contract import OpFamily
from plugin_api.contract.graphs import GraphLevel, GraphSupport
from plugin_api.contract.provenance import record_ops
from plugin_api.ops.attention import FP8, Attention, AttentionSpec, KVCache

from . import oracle
from .cases import QUERY_LAYOUTS, PagedCase, make_case, with_query_layout
from .graph_claims import meaningless_graph_claim
from .inputs import unchanged
from .plugin import own_or_skip

if TYPE_CHECKING:
    from plugin_api.backend import Backend

BASE = dict(num_heads=4, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, block_size=16)

FEATURES: dict[str, dict[str, object]] = {
    "base": {},
    "mqa": dict(num_kv_heads=1),
    "mha": dict(num_kv_heads=4),
    "sinks": dict(has_sinks=True),
    "window": dict(sliding_window=7),
    "softcap": dict(logits_soft_cap=5.0),
    "non-causal": dict(causal=False),
    "fp8-kv": dict(kv_cache_dtype=FP8),
    "kv-sharing": dict(kv_sharing=True),
    "sinks+window": dict(has_sinks=True, sliding_window=9),
    "softcap+window+fp8": dict(logits_soft_cap=8.0, sliding_window=11, kv_cache_dtype=FP8),
    "head-80": dict(head_size=80),
    "head-256": dict(head_size=256),
    "block-32": dict(block_size=32),
    "scale": dict(scale=0.05),
}

# (query_lens, seq_lens, num_decodes): decodes first. Seq lengths 16/48 end on a block boundary.
BATCHES: dict[str, tuple[list[int], list[int], int]] = {
    "mixed": ([1, 1, 7, 12], [20, 33, 7, 40], 2),
    "decode-only": ([1, 1, 1], [16, 5, 48], 3),
    "prefill-only": ([9, 17], [9, 30], 0),
    "one-token-seqs": ([1, 1], [1, 1], 2),
    "chunked-prefill": ([16], [48], 0),
}
SPEC_BATCHES: dict[str, tuple[list[int], list[int], int]] = {
    "uniform-spec-decode": ([4, 4, 4], [20, 32, 9], 3),
    "ragged-spec-decode": ([2, 4, 1, 10], [19, 22, 40, 10], 3),
}
TOLERANCE: dict[torch.dtype, oracle.Tolerance] = {
    torch.bfloat16: oracle.Tolerance(atol=2e-2, rtol=2e-2),
    torch.float16: oracle.Tolerance(atol=3e-3, rtol=3e-3),
    torch.float32: oracle.Tolerance(atol=2e-4, rtol=2e-4),
}


def spec_of(**changes: object) -> AttentionSpec:
    return AttentionSpec(**{**BASE, **changes})  # type: ignore[arg-type]


def run_and_check(
    backend: Backend, device: torch.device, case: PagedCase, *, extra_rows: int = 0
) -> None:
    own_or_skip(backend, OpFamily.ATTENTION, case.spec)
    attn = Attention(case.spec, backend)
    plan = attn.plan(case.batch, num_blocks=case.cache.num_blocks)
    before = case.cache.data.clone()
    out = torch.full(case.query.shape, float("nan"), dtype=case.spec.dtype, device=device)
    with (
        record_ops() as calls,
        unchanged(
            backend.id,
            query=case.query,
            key=case.key,
            value=case.value,
            sinks=case.sinks,
            qkv=case.qkv,
        ),
    ):
        attn.run(case.query, case.key, case.value, case.cache, plan, sinks=case.sinks, out=out)
    assert calls == [attn.provenance], "the op ran an implementation it did not resolve to"
    assert not attn.provenance.fallback
    got = out[: case.num_tokens].float().cpu()
    assert torch.isfinite(got).all(), "rows left unwritten (NaN) or non-finite output"
    torch.testing.assert_close(got, case.expected(), **TOLERANCE[case.spec.dtype])
    _check_cache(case, before)


def assert_same_in_every_layout(backend: Backend, case: PagedCase) -> None:
    """``case`` run with its contiguous query and with each of ``QUERY_LAYOUTS``, one plan and
    a fresh copy of the cache each: the outputs and cache writes are bit for bit the same.

    Not a kit test (the contract asks a strided query for the oracle's tolerance, which
    ``test_strided_query`` checks); for a plugin's own tests, where its kernels read a view in
    place and so must not change a bit of the result."""
    own_or_skip(backend, OpFamily.ATTENTION, case.spec)
    attn = Attention(case.spec, backend)
    plan = attn.plan(case.batch)
    n = case.num_tokens
    results = {}
    for layout in ("contiguous", *QUERY_LAYOUTS):
        c = case if layout == "contiguous" else with_query_layout(case, layout)
        assert layout == "contiguous" or not c.query.is_contiguous()
        cache = KVCache(c.cache.data.clone(), c.cache.k_scale, c.cache.v_scale)
        out = attn.run(c.query, c.key, c.value, cache, plan, sinks=c.sinks)
        results[layout] = (out[:n].view(torch.uint8), cache.data.view(torch.uint8))
    want_out, want_cache = results.pop("contiguous")
    for layout, (got_out, got_cache) in results.items():
        assert torch.equal(got_out, want_out), f"{layout}: the output differs from a dense query's"
        assert torch.equal(got_cache, want_cache), f"{layout}: the cache write differs"


def _check_cache(case: PagedCase, before: torch.Tensor) -> None:
    """The step wrote exactly its slots, with the documented conversion, and nothing else."""
    expected = before.clone()
    s = case.spec
    # as Attention.run: a step writes K/V when it has both
    if case.key is not None and case.value is not None and case.written.numel():
        slots = case.batch.slot_mapping[: case.num_tokens]
        keep = (slots >= 0).nonzero().flatten()
        idx = slots[keep]
        blk, off = idx // s.block_size, idx % s.block_size
        k, v = case.key[keep.to(case.key.device)], case.value[keep.to(case.key.device)]
        if s.fp8_kv:
            k = (k.float() / case.cache.k_scale).clamp(-448, 448)
            v = (v.float() / case.cache.v_scale).clamp(-448, 448)
        expected[blk, 0, :, off, :] = k.to(expected.dtype)
        expected[blk, 1, :, off, :] = v.to(expected.dtype)
    after = case.cache.data
    same = torch.equal(after.view(torch.uint8), expected.view(torch.uint8))
    assert same, "the KV cache differs from the expected write (wrong slots, values or extras)"


@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature_on_mixed_batch(
    plugin_api_backend: Backend, kit_device: torch.device, feature: str
) -> None:
    q, L, nd = BATCHES["mixed"]
    case = make_case(
        spec_of(**FEATURES[feature]),
        q,
        L,
        num_decodes=nd,
        device=kit_device,
        seed=sum(map(ord, feature)),
    )
    run_and_check(plugin_api_backend, kit_device, case)


@pytest.mark.parametrize("shape", list(BATCHES))
def test_batch_shapes(plugin_api_backend: Backend, kit_device: torch.device, shape: str) -> None:
    q, L, nd = BATCHES[shape]
    case = make_case(spec_of(), q, L, num_decodes=nd, device=kit_device, seed=7)
    run_and_check(plugin_api_backend, kit_device, case)


@pytest.mark.parametrize("shape", list(SPEC_BATCHES))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
def test_speculative_decode(
    plugin_api_backend: Backend, kit_device: torch.device, shape: str, causal: bool
) -> None:
    q, L, nd = SPEC_BATCHES[shape]
    spec = spec_of(num_speculative_tokens=3, causal=causal)
    case = make_case(spec, q, L, num_decodes=nd, device=kit_device, seed=11)
    run_and_check(plugin_api_backend, kit_device, case)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("feature", ["base", "sinks+window", "fp8-kv"])
def test_dtypes(
    plugin_api_backend: Backend, kit_device: torch.device, dtype: torch.dtype, feature: str
) -> None:
    q, L, nd = BATCHES["mixed"]
    case = make_case(
        spec_of(dtype=dtype, **FEATURES[feature]), q, L, num_decodes=nd, device=kit_device, seed=3
    )
    run_and_check(plugin_api_backend, kit_device, case)


# steps for a strided query: (spec changes, batch); every batch shape and the spec features
# whose kernels read the query differently (a sink, KV sharing's absent key/value, GQA groups)
STRIDED_QUERY_STEPS: dict[str, tuple[dict[str, object], tuple[list[int], list[int], int]]] = {
    "mixed": ({}, BATCHES["mixed"]),
    "decode-only": ({}, BATCHES["decode-only"]),
    "prefill-only": ({}, BATCHES["prefill-only"]),
    "ragged-spec-decode": (dict(num_speculative_tokens=3), SPEC_BATCHES["ragged-spec-decode"]),
    "mqa": (FEATURES["mqa"], BATCHES["mixed"]),
    "sinks": (FEATURES["sinks"], BATCHES["mixed"]),
    "kv-sharing": (FEATURES["kv-sharing"], BATCHES["mixed"]),
    "fp8-kv": (FEATURES["fp8-kv"], BATCHES["mixed"]),
}


@pytest.mark.parametrize("step", list(STRIDED_QUERY_STEPS))
@pytest.mark.parametrize("layout", QUERY_LAYOUTS)
def test_strided_query(
    plugin_api_backend: Backend, kit_device: torch.device, layout: str, step: str
) -> None:
    """``query`` (with ``key``/``value``) as a strided view: split from a fused QKV output, or
    with padded heads. Nothing past the views is read (NaN there) or written, padding rows
    included."""
    changes, (q, L, nd) = STRIDED_QUERY_STEPS[step]
    case = make_case(
        spec_of(**changes), q, L, num_decodes=nd, device=kit_device, seed=17, pad_rows=3
    )
    run_and_check(plugin_api_backend, kit_device, with_query_layout(case, layout))


def test_padding_rows_and_skipped_slots(
    plugin_api_backend: Backend, kit_device: torch.device
) -> None:
    """NaN padding rows never leak into real rows; slot -1 tokens are not written."""
    q, L, nd = BATCHES["mixed"]
    case = make_case(
        spec_of(), q, L, num_decodes=nd, device=kit_device, seed=5, pad_rows=5, skip_tokens=(1, 4)
    )
    run_and_check(plugin_api_backend, kit_device, case)


def test_plan_owns_the_batch_it_checked(
    plugin_api_backend: Backend, kit_device: torch.device
) -> None:
    """A plan keeps what it validated: refilling the caller's batch tensors between plan() and
    run() (a scheduler reusing its buffers) with out-of-range ids changes neither the output
    nor the cache write, and no kernel follows the new ids (issue 30, item 6)."""
    q, L, nd = BATCHES["mixed"]
    case = make_case(spec_of(), q, L, num_decodes=nd, device=kit_device, seed=13)
    own_or_skip(plugin_api_backend, OpFamily.ATTENTION, case.spec)
    attn = Attention(case.spec, plugin_api_backend)
    plan = attn.plan(case.batch, num_blocks=int(case.cache.data.shape[0]))
    b = case.batch
    tables = (b.query_start_loc, b.seq_lens, b.block_table, b.slot_mapping)
    saved = [t.clone() for t in tables]
    before = case.cache.data.clone()
    out = torch.full(case.query.shape, float("nan"), dtype=case.spec.dtype, device=kit_device)
    b.block_table.fill_(2**31 - 1)
    b.slot_mapping.fill_(2**62)
    b.seq_lens.fill_(2**30)
    b.query_start_loc.fill_(2**30)
    try:
        attn.run(case.query, case.key, case.value, case.cache, plan, sinks=case.sinks, out=out)
    finally:
        for t, old in zip(tables, saved, strict=True):
            t.copy_(old)
    got = out[: case.num_tokens].float().cpu()
    assert torch.isfinite(got).all(), "rows left unwritten (NaN) or non-finite output"
    torch.testing.assert_close(got, case.expected(), **TOLERANCE[case.spec.dtype])
    _check_cache(case, before)


def test_fp8_scales(plugin_api_backend: Backend, kit_device: torch.device) -> None:
    q, L, nd = BATCHES["mixed"]
    case = make_case(
        spec_of(kv_cache_dtype=FP8),
        q,
        L,
        num_decodes=nd,
        device=kit_device,
        seed=9,
        k_scale=0.25,
        v_scale=2.0,
        value_scale=40.0,
    )
    run_and_check(plugin_api_backend, kit_device, case)


@pytest.mark.parametrize("feature", list(FEATURES))
def test_graph_support_is_declared(
    plugin_api_backend: Backend, kit_device: torch.device, feature: str
) -> None:
    """Every accepted spec states its CUDA-graph level with a reason; a level above NEVER is
    claimed only on a device with graphs, and backed by plans that refill stable buffers."""
    spec = spec_of(**FEATURES[feature])
    own_or_skip(plugin_api_backend, OpFamily.ATTENTION, spec)
    attn = Attention(spec, plugin_api_backend)
    support = attn.graph_support()
    assert isinstance(support, GraphSupport) and support.reason
    problem = meaningless_graph_claim(kit_device.type, support)
    assert problem is None, f"{plugin_api_backend.id}, {spec.describe()}: {problem}"
    if support.level == GraphLevel.NEVER:
        return
    q, L, nd = [1, 1, 1], [20, 33, 7], 3
    first = attn.plan(make_case(spec, q, L, num_decodes=nd, device=kit_device, seed=1).batch)
    second_case = make_case(spec, q, [5, 40, 18], num_decodes=nd, device=kit_device, seed=2)
    second = attn.plan(second_case.batch, reuse=first)
    buffers = getattr(first.impl_plan, "buffers", None)
    assert callable(buffers), "a graph-capable plan must expose buffers()"
    before = {k: v.data_ptr() for k, v in first.impl_plan.buffers().items()}
    after = {k: v.data_ptr() for k, v in second.impl_plan.buffers().items()}
    assert before == after, "plan(reuse=...) moved a buffer a captured graph would read"
    # Capture and replay against eager needs a device's graph API: each GPU plugin's own tests
    # do that on its hardware (the kit stays device-neutral).


def test_a_refused_spec_is_never_captured(plugin_api_backend: Backend) -> None:
    """A spec an implementation of the backend refuses is declared NEVER, with the refusal as
    the reason: a level above NEVER would promise a captured graph of code that never runs."""
    info = plugin_api_backend.info
    specs = [spec_of(**changes) for changes in FEATURES.values()] + [
        spec_of(dcp_size=2),  # decode context parallelism: refused by every backend here today
        spec_of(query_dtype=FP8),
        spec_of(head_size=512),
        spec_of(num_speculative_tokens=3, causal=False, logits_soft_cap=5.0, dcp_size=2),
    ]
    problems = []
    for c in plugin_api_backend.candidates(OpFamily.ATTENTION):
        if c.fallback:
            continue
        for spec in specs:
            refusal = c.impl.supports(spec, info)
            if refusal.ok:
                continue
            support = c.impl.graph_support(spec, info)
            if support.level != GraphLevel.NEVER or refusal.because() not in support.reason:
                problems.append(
                    f"{c.impl.name} refuses {spec.describe()} ({refusal.because()}) but declares "
                    f"{support.level}: {support.reason}"
                )
    assert not problems, "\n".join(problems)

"""The K/V cache write through the plan: one launch of the host's Triton kernel
(``plugin_api.triton.cache_write``) over the plan's ``slots`` buffer, bit-exact against the
reference backend's write.

Where it runs: on the CPU under ``TRITON_INTERPRET=1`` (``make test`` runs this file in the
interpreter's own process, beside ``tests/triton_kernels``), else on a CUDA device. This file
never sets the variable: triton reads it when it decorates a kernel, so setting it here would
turn every later triton user of the process into an interpreted one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest
import torch

from plugin_api.conformance.cases import PagedCase, make_case
from plugin_api.ops.attention import FP8, AttentionSpec, KVCache
from plugin_api.reference.attention import ReferenceAttention
from plugin_api_cuda_sm90 import metadata
from plugin_api_cuda_sm90.attention import FlashInferAttention

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRET:
    import triton  # noqa: F401  (asked for the interpreter: a missing triton is an error)


@pytest.fixture(scope="module")
def device() -> torch.device:
    pytest.importorskip("triton", reason="the triton extra is not installed")
    if INTERPRET:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.skip(
        "no CUDA device, and TRITON_INTERPRET is not 1: run `TRITON_INTERPRET=1 pytest "
        "plugins/cuda-sm90/tests/test_kv_write.py` (make test does)"
    )


DTYPES = {
    "bf16": dict(dtype=torch.bfloat16),
    "fp16": dict(dtype=torch.float16),
    "fp8": dict(dtype=torch.bfloat16, kv_cache_dtype=FP8),
}
# (query_lens, seq_lens, num_decodes, pad_rows): the batch shapes a step takes
BATCHES = {
    "mixed": ([1, 1, 7, 5], [20, 33, 7, 40], 2, 0),
    "decode-padded": ([1, 1, 1], [20, 33, 17], 3, 5),
    "spec-decode": ([4, 4, 4], [20, 32, 9], 3, 0),
    "prefill": ([9, 17], [9, 30], 0, 3),
}
SCALES = {"k_scale": 0.37, "v_scale": 3.25}  # fp8 only: != 1, not powers of two


def spec_of(**kw: object) -> AttentionSpec:
    base: dict[str, object] = dict(
        num_heads=8, num_kv_heads=2, head_size=64, block_size=16, num_speculative_tokens=3
    )
    return AttentionSpec(**{**base, **kw})  # type: ignore[arg-type]


def case_of(
    spec: AttentionSpec, batch: str, device: torch.device, *, seed: int = 4, skip: tuple = ()
) -> PagedCase:
    q, lens, nd, pad = BATCHES[batch]
    scales = SCALES if spec.fp8_kv else {}
    case = make_case(
        spec,
        q,
        lens,
        num_decodes=nd,
        device=device,
        seed=seed,
        pad_rows=pad,
        skip_tokens=skip,
        **scales,
    )
    assert case.key is not None and case.value is not None
    # padding rows hold NaN: a write of one would show in the cache's bits
    case.key[case.num_tokens :] = float("nan")
    case.value[case.num_tokens :] = float("nan")
    return case


def reference_write(case: PagedCase) -> torch.Tensor:
    """The reference backend's cache after this step's write (a copy of the case's cache)."""
    ref = ReferenceAttention()
    cache = KVCache(case.cache.data.clone(), case.cache.k_scale, case.cache.v_scale)
    assert case.key is not None and case.value is not None
    ref.write_kv(
        case.spec,
        case.key,
        case.value,
        cache,
        ref.plan(case.spec, case.batch, cache.data.device, None),
    )
    return cache.data


def plugin_write(case: PagedCase, plan: metadata.FlashInferPlan) -> torch.Tensor:
    """This plugin's cache after the step's write, through the implementation's ``write_kv``."""
    cache = KVCache(case.cache.data.clone(), case.cache.k_scale, case.cache.v_scale)
    assert case.key is not None and case.value is not None
    FlashInferAttention().write_kv(case.spec, case.key, case.value, cache, plan)
    return cache.data


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    g, w = got.view(torch.uint8), want.view(torch.uint8)
    assert torch.equal(g, w), f"{int((g != w).sum())} cache bytes differ from the reference"


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_write_matches_the_reference_bit_for_bit(
    device: torch.device, dtype: str, batch: str
) -> None:
    case = case_of(spec_of(**DTYPES[dtype]), batch, device)
    plan = metadata.build_plan(case.spec, case.batch, device, None)
    assert_same_bits(plugin_write(case, plan), reference_write(case))


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("skip", [(1, 4), tuple(range(13))], ids=["some", "all"])
def test_skipped_tokens_write_nothing(device: torch.device, dtype: str, skip: tuple) -> None:
    case = case_of(spec_of(**DTYPES[dtype]), "mixed", device, skip=skip)
    plan = metadata.build_plan(case.spec, case.batch, device, None)
    got = plugin_write(case, plan)
    assert_same_bits(got, reference_write(case))
    if len(skip) == case.num_tokens:
        assert_same_bits(got, case.cache.data)  # nothing at all was written


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_reuse_refills_slots_in_place_and_leaves_no_stale_writes(
    device: torch.device, dtype: str
) -> None:
    spec = spec_of(**DTYPES[dtype])
    big = case_of(spec, "mixed", device, seed=1)  # 14 tokens
    small = case_of(spec, "decode-padded", device, seed=2)  # 3 tokens, 5 padding rows
    # the smaller step's key has as many rows as the bigger one wrote, all finite past its own
    # tokens: a stale slot of the bigger step would write one of them
    assert small.key is not None and small.value is not None
    key = torch.ones((big.num_tokens, *small.key.shape[1:]), dtype=spec.dtype, device=device)
    value = torch.ones_like(key)
    key[: small.num_tokens] = small.key[: small.num_tokens]
    value[: small.num_tokens] = small.value[: small.num_tokens]
    small = dataclasses.replace(small, key=key, value=value)
    plan = metadata.build_plan(spec, big.batch, device, None)
    ptr = plan.bufs.slots.data_ptr()
    # big, big, small, small: each step's host staging copy last held a bigger step's data
    for case in (big, big, small, small):
        plan = metadata.build_plan(spec, case.batch, device, plan)
        assert plan.bufs.slots.data_ptr() == ptr
        n = case.num_tokens
        assert plan.bufs.slots[:n].tolist() == case.batch.slot_mapping[:n].tolist()
        assert (plan.bufs.slots[n:] == -1).all()
        assert_same_bits(plugin_write(case, plan), reference_write(case))


@pytest.fixture
def launches() -> Iterator[list[int]]:
    """Launches of the host's cache-write kernel, counted by triton's own pre-run hook."""
    from plugin_api.triton import cache_write

    kernel = cache_write._cache_write_kernel
    seen: list[int] = []

    def hook(*args: object, **kwargs: object) -> None:
        seen.append(1)

    kernel.add_pre_run_hook(hook)
    try:
        yield seen
    finally:
        kernel.pre_run_hooks.remove(hook)


# what the torch write this replaces ran (gathers, scatters, masked selects), each a kernel
INDEXING = {
    "aten::index",
    "aten::index_put_",
    "aten::index_select",
    "aten::where",
    "aten::gather",
    "aten::scatter",
    "aten::nonzero",
}


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_one_kernel_launch_and_no_torch_indexing(
    device: torch.device, launches: list[int], dtype: str
) -> None:
    case = case_of(spec_of(**DTYPES[dtype]), "mixed", device)
    plan = metadata.build_plan(case.spec, case.batch, device, None)
    cache = KVCache(case.cache.data.clone(), case.cache.k_scale, case.cache.v_scale)
    assert case.key is not None and case.value is not None
    activity = torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        FlashInferAttention().write_kv(case.spec, case.key, case.value, cache, plan)
    assert len(launches) == 1
    ran = {e.name for e in prof.events()}
    assert not ran & INDEXING, sorted(ran & INDEXING)
    assert_same_bits(cache.data, reference_write(case))

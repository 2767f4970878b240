"""The metadata builder on CPU tensors: uniform vs ragged, offsets, padding rows, the packed
draft mask bit by bit, buffer reuse, and the K/V write against the reference's."""

from __future__ import annotations

import pytest
import torch

from plugin_api.conformance.cases import make_case
from plugin_api.ops.attention import FP8, AttentionBatch, AttentionSpec
from plugin_api.reference.attention import ReferenceAttention
from plugin_api_cuda_sm90 import metadata

CPU = torch.device("cpu")


def spec_of(**kw: object) -> AttentionSpec:
    base: dict[str, object] = dict(
        num_heads=8, num_kv_heads=2, head_size=64, block_size=16, num_speculative_tokens=3
    )
    return AttentionSpec(**{**base, **kw})  # type: ignore[arg-type]


def batch_of(query_lens: list[int], seq_lens: list[int], num_decodes: int) -> AttentionBatch:
    table, nxt = [], 0
    for length in seq_lens:
        n = -(-length // 16)
        table.append(list(range(nxt, nxt + n)))
        nxt += n
    slots = []
    for q, length, row in zip(query_lens, seq_lens, table, strict=True):
        slots += [row[p // 16] * 16 + p % 16 for p in range(length - q, length)]
    return AttentionBatch.from_lists(
        query_lens=query_lens,
        seq_lens=seq_lens,
        block_table=table,
        slot_mapping=slots,
        num_decodes=num_decodes,
    )


def reference_bit(n: int, i: int, j: int, causal: bool) -> bool:
    """Plain statement of the layout: draft i of n sees draft j iff (causal: j <= i) j < n."""
    return j < n and (j <= i if causal else True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "lens,q_len", [([4, 4, 4], 4), ([2, 4, 1, 3], 4), ([33, 1, 40], 40), ([64, 31], 64)]
)
def test_draft_mask_bit_by_bit(lens: list[int], q_len: int, causal: bool) -> None:
    mask = metadata.draft_mask(lens, q_len, causal=causal)
    width = 2 * -(-q_len // 32)
    assert mask.dtype == torch.uint16 and tuple(mask.shape) == (sum(lens), width)
    halves = mask.to(torch.int64)  # uint16 values, 0..65535
    row = 0
    for n in lens:
        for i in range(n):
            for j in range(16 * width):
                got = bool((int(halves[row, j // 16]) >> (j % 16)) & 1)
                assert got == reference_bit(n, i, j, causal), (n, i, j)
            row += 1


def test_draft_mask_words_are_little_endian_uint32() -> None:
    # draft 1 of 2, causal: bits 0 and 1 -> word 0b11; as uint16 pairs (low, high) = (3, 0)
    m = metadata.draft_mask([2], 2, causal=True)
    assert m.tolist() == [[1, 0], [3, 0]]
    # 33 drafts, last row: 32 bits in word 0 (low 0xFFFF, high 0xFFFF), bit 32 in word 1
    m = metadata.draft_mask([33], 33, causal=True)
    assert m[-1].tolist() == [0xFFFF, 0xFFFF, 1, 0]
    assert m.view(torch.int32)[-1].tolist() == [-1, 1]


def test_uniform_speculative_decode() -> None:
    spec = spec_of()
    plan = metadata.build_plan(spec, batch_of([4, 4, 4], [20, 32, 9], 3), CPU, None)
    d = plan.decode
    assert d is not None and d.layout.uniform and not d.ragged
    assert d.q_len_per_req == 4 and d.needs_mask and not d.single_token
    assert plan.prefill is None
    assert plan.decode_rows(12) == 12 and plan.decode_requests(12) == 3
    assert plan.bufs.seq_lens[:4].tolist() == [20, 32, 9, 0]


def test_ragged_offsets_and_packed_rows() -> None:
    spec = spec_of()
    plan = metadata.build_plan(spec, batch_of([2, 4, 1, 10], [19, 22, 40, 10], 3), CPU, None)
    d = plan.decode
    assert d is not None and d.ragged and d.q_len_per_req == 4
    assert plan.bufs.q_cu_seq_lens[:5].tolist() == [0, 2, 6, 7, 7]
    assert plan.decode_rows(30) == 7  # packed: padding rows never join a ragged step
    words = plan.bufs.mask[:7].view(torch.uint16).view(7, 2)
    assert torch.equal(words, metadata.draft_mask([2, 4, 1], 4, causal=True))
    p = plan.prefill
    assert p is not None and (p.first_row, p.num_rows) == (7, 10)
    assert p.qo_indptr.tolist() == [0, 10]
    assert p.kv_indptr.tolist() == [0, 1] and p.kv_last_page_len.tolist() == [10]


def test_single_token_full_graph_keeps_padding_rows() -> None:
    spec = spec_of(num_speculative_tokens=0)
    plan = metadata.build_plan(spec, batch_of([1, 1, 1], [20, 33, 7], 3), CPU, None)
    d = plan.decode
    assert d is not None and d.single_token and not d.needs_mask
    # a graph captured for 5 rows runs 5 requests; the 2 padding requests have length 0
    assert plan.decode_rows(5) == 5 and plan.decode_requests(5) == 5
    assert plan.bufs.seq_lens[:5].tolist() == [20, 33, 7, 0, 0]
    assert plan.bufs.block_table[3:5].abs().sum() == 0
    with pytest.raises(ValueError, match="hold 8 requests"):
        plan.decode_rows(9)


def test_mixed_batch_single_token_decodes_are_not_padded() -> None:
    plan = metadata.build_plan(
        spec_of(num_speculative_tokens=0), batch_of([1, 1, 7], [20, 33, 7], 2), CPU, None
    )
    assert plan.decode is not None and not plan.decode.single_token
    assert plan.decode_rows(20) == 2


def test_reuse_refills_the_same_buffers() -> None:
    spec = spec_of()
    first = metadata.build_plan(spec, batch_of([4, 4], [20, 33], 2), CPU, None)
    ptrs = {k: v.data_ptr() for k, v in first.buffers().items()}
    second = metadata.build_plan(spec, batch_of([2, 4, 1], [5, 40, 18], 3), CPU, first)
    assert {k: v.data_ptr() for k, v in second.buffers().items()} == ptrs
    assert second.bufs.seq_lens[:4].tolist() == [5, 40, 18, 0]
    assert second.bufs.q_cu_seq_lens[:4].tolist() == [0, 2, 6, 7]


def test_reuse_refuses_a_batch_past_capacity() -> None:
    spec = spec_of()
    first = metadata.build_plan(spec, batch_of([1], [20], 1), CPU, None)
    big = batch_of([1] * 9, [20] * 9, 9)
    with pytest.raises(ValueError, match=r"seqs=9.*hold 8"):
        metadata.build_plan(spec, big, CPU, first)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("skip", [(), (1, 4), tuple(range(16))], ids=["all", "some", "none"])
def test_write_kv_matches_reference(kv_dtype: torch.dtype, skip: tuple[int, ...]) -> None:
    spec = spec_of(kv_cache_dtype=kv_dtype, num_speculative_tokens=0)
    case = make_case(
        spec, [1, 1, 7, 5], [20, 33, 7, 40], num_decodes=2, device=CPU, seed=4, skip_tokens=skip
    )
    scales = dict(k_scale=0.5, v_scale=2.0) if kv_dtype == FP8 else dict(k_scale=1.0, v_scale=1.0)
    ref = ReferenceAttention()
    mine, theirs = case.cache.data.clone(), case.cache.data.clone()
    plan = metadata.build_plan(spec, case.batch, CPU, None)
    assert case.key is not None and case.value is not None
    metadata.write_kv(spec, case.key, case.value, mine, bufs=plan.bufs, **scales)
    ref_plan = ref.plan(spec, case.batch, CPU, None)
    cache = type(case.cache)(theirs, **scales)
    ref.write_kv(spec, case.key, case.value, cache, ref_plan)
    assert torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8))

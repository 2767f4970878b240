"""The metadata builder on CPU tensors: uniform vs ragged, offsets, padding rows, the packed
draft mask bit by bit, buffer reuse, and the buffers as views of one storage filled by one copy
from alternating host copies (the K/V write through the plan: ``test_kv_write.py``)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from plugin_api.ops.attention import AttentionBatch, AttentionSpec
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
    assert second.bufs.storage is first.bufs.storage and second.staging is first.staging
    assert second.bufs.seq_lens[:4].tolist() == [5, 40, 18, 0]
    assert second.bufs.q_cu_seq_lens[:4].tolist() == [0, 2, 6, 7]


def test_reuse_refuses_a_batch_past_capacity() -> None:
    spec = spec_of()
    first = metadata.build_plan(spec, batch_of([1], [20], 1), CPU, None)
    big = batch_of([1] * 9, [20] * 9, 9)
    with pytest.raises(ValueError, match=r"seqs=9.*hold 8"):
        metadata.build_plan(spec, big, CPU, first)


def test_buffers_are_named_views_of_one_storage() -> None:
    plan = metadata.build_plan(spec_of(), batch_of([4, 4, 4], [20, 32, 9], 3), CPU, None)
    storage = plan.bufs.storage
    assert storage.dtype == torch.uint8
    named = plan.buffers()
    assert list(named) == ["slots", "block_table", "seq_lens", "q_cu_seq_lens", "mask"]
    assert named["slots"].dtype == torch.int64
    spans = []
    for name, view in named.items():
        assert view.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr(), name
        start = view.data_ptr() - storage.data_ptr()
        spans.append((start, start + view.numel() * view.element_size()))
    # laid end to end, covering the storage, each view at a multiple of its element size
    assert [a for a, _ in spans[1:]] == [b for _, b in spans[:-1]]
    assert spans[0][0] == 0 and spans[-1][1] == storage.numel()
    assert all(v.data_ptr() % v.element_size() == 0 for v in named.values())


class _Copies(TorchDispatchMode):
    """Every ``aten.copy_`` a block of code runs: (destination storage, bytes copied)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten.copy_.default:
            dst = args[0]
            self.seen.append((dst.untyped_storage().data_ptr(), dst.numel() * dst.element_size()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "batch", [([4, 4, 4], [20, 32, 9], 3), ([2, 4, 1, 10], [19, 22, 40, 10], 3)]
)
def test_one_copy_to_the_device_buffers_per_plan(batch: tuple) -> None:
    spec = spec_of()
    first = metadata.build_plan(spec, batch_of(*batch), CPU, None)
    device = first.bufs.storage
    with _Copies() as copies:
        metadata.build_plan(spec, batch_of(*batch), CPU, first)
    into_device = [n for ptr, n in copies.seen if ptr == device.untyped_storage().data_ptr()]
    assert into_device == [device.numel()]  # the whole storage, once


def test_host_staging_alternates_two_copies() -> None:
    """Consecutive plans fill different host copies: the one a plan just sent may still be in
    flight (pinned memory, asynchronous copy) while the next is filled."""
    spec = spec_of()
    plan = metadata.build_plan(spec, batch_of([4, 4], [20, 33], 2), CPU, None)
    hosts = plan.staging.copies
    assert len(hosts) == 2 and hosts[0].storage.data_ptr() != hosts[1].storage.data_ptr()
    assert not any(h.storage.is_pinned() for h in hosts)  # pinned only for a CUDA device
    lens = [[5, 40], [6, 41], [7, 42]]
    for step in lens:
        plan = metadata.build_plan(spec, batch_of([4, 4], step, 2), CPU, plan)
    # the last plan filled copy 1 (plans 0 and 2 went to copy 0), the one before it copy 0
    assert hosts[1].seq_lens[:2].tolist() == lens[2]
    assert hosts[0].seq_lens[:2].tolist() == lens[1]


def test_a_smaller_step_after_a_larger_one_leaves_nothing_behind() -> None:
    spec = spec_of()
    big = batch_of([4, 3, 2, 4, 9], [20, 33, 60, 70, 9], 4)
    small = batch_of([1], [5], 1)
    plan = metadata.build_plan(spec, big, CPU, None)
    for step in (big, small, small):  # the second small plan refills the big plan's host copy
        plan = metadata.build_plan(spec, step, CPU, plan)
    # the same capacity, planned into host and device copies no step has used yet
    fresh = metadata.build_plan(spec, small, CPU, metadata.build_plan(spec, big, CPU, None))
    for name, view in plan.buffers().items():
        assert torch.equal(view, fresh.buffers()[name]), name

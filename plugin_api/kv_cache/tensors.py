"""Carry out on tensors what the manager reports: the step's ``AttentionBatch``, and the
copy-on-write block copies in every layer's KV cache.

The only module of the package that imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..ops.attention import AttentionBatch, KVCache
from .manager import Step
from .pool import check_count


def attention_batch(step: Step, *, pad_to: int | None = None) -> AttentionBatch:
    """``step`` as an ``AttentionBatch``: decodes first (``step``'s order), ``slot_mapping``
    from the block tables and lengths, ``-1`` for the padding rows up to ``pad_to`` tokens."""
    slots = list(step.slot_mapping)
    if pad_to is not None:
        check_count("pad_to", pad_to, step.num_tokens)
        slots += [-1] * (pad_to - step.num_tokens)
    return AttentionBatch.from_lists(
        query_lens=list(step.query_lens),
        seq_lens=list(step.seq_lens),
        block_table=[list(row) for row in step.block_tables],
        slot_mapping=slots,
        num_decodes=step.num_decodes,
    )


def copy_kv_blocks(caches: Sequence[KVCache], copies: Sequence[tuple[int, int]]) -> None:
    """Copy block ``src`` to block ``dst`` for every ``(src, dst)`` of ``copies`` (a step's
    ``Step.copies``) in every layer's cache, K and V, bit for bit; before the step's forward.

    Destinations must be distinct and no destination may be a source (the result would depend
    on the order); the manager's copies always are.
    """
    if not copies:
        return
    src_ids = [s for s, _ in copies]
    dst_ids = [d for _, d in copies]
    if len(set(dst_ids)) != len(dst_ids):
        raise ValueError(f"copy_kv_blocks: copies {list(copies)} repeat a destination")
    both = set(src_ids) & set(dst_ids)
    if both:
        raise ValueError(f"copy_kv_blocks: block(s) {sorted(both)} are both source and destination")
    for i, cache in enumerate(caches):
        if not isinstance(cache, KVCache):
            raise TypeError(
                f"copy_kv_blocks: caches[{i}] must be a KVCache, got {type(cache).__name__}"
            )
        n = cache.num_blocks
        bad = [b for b in src_ids + dst_ids if not 0 <= b < n]
        if bad:
            raise ValueError(f"copy_kv_blocks: block(s) {bad} are outside caches[{i}]'s {n} blocks")
    for cache in caches:
        raw = cache.data.view(torch.uint8)  # bytes: exact for every cache dtype, fp8 included
        dev = raw.device
        src = torch.tensor(src_ids, dtype=torch.int64, device=dev)
        dst = torch.tensor(dst_ids, dtype=torch.int64, device=dev)
        raw.index_copy_(0, dst, raw.index_select(0, src))


__all__ = ["attention_batch", "copy_kv_blocks"]

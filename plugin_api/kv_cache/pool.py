"""The KV cache's block ids: a ``BlockIdPool`` in which every id is allocatable.

Block ids ``0 .. num_blocks - 1`` index dim 0 of every layer's KV cache
(``[num_blocks, 2, num_kv_heads, block_size, head_size]``). A block is free (count 0, on the
free list) or live, with one reference per owner: a sequence's block table, a forked sequence
sharing it, a prefix-cache entry. Unlike the state cache there is no null block: a block table
holds only the blocks a sequence's tokens occupy.
"""

from __future__ import annotations

from ..block_pool import BlockIdPool, PoolKind
from ..block_pool import check_count as check_count  # the cache's other modules import it here
from .errors import KVCacheError, OutOfKVBlocks

KV_POOL = PoolKind(
    name="KV pool",
    misuse=KVCacheError,
    exhausted=OutOfKVBlocks,
    remedy="preempt a sequence, evict prefix-cache entries or grow the pool",
)


class KVBlockPool(BlockIdPool):
    """``num_blocks`` ids, every one allocatable; misuse raises ``KVCacheError``, an empty pool
    ``OutOfKVBlocks``."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks, KV_POOL)

"""The state cache's block ids: a ``BlockIdPool`` with one shared null block, and which blocks
are still uninitialised.

Block ids index dim 0 of a group's state tensors (``[num_blocks, *per_block_shape]``). Id 0 is
the null block: it stands for "no state here" in block tables, is never handed out, never
freed and never counted. Every other id is either free (reference count 0, on the free list) or
live (count >= 1: one per owner, e.g. a request's table and a prefix-cache entry).

Blocks handed out by ``allocate`` hold whatever their last owner left; they stay
"uninitialised" until the caller zeroes (or copies into) them and says so
(``mark_initialised``), which the manager checks. A KV block needs no such record: attention
reads only the positions a sequence has written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..block_pool import BlockIdPool, PoolKind
from ..block_pool import check_count as check_count  # the cache's other modules import it here
from .errors import OutOfStateBlocks, StateCacheError

NULL_BLOCK = 0

STATE_POOL = PoolKind(
    name="state pool",
    misuse=StateCacheError,
    exhausted=OutOfStateBlocks,
    remedy="preempt a request or grow the pool",
    reserved=NULL_BLOCK + 1,
    reserved_role="the shared null block",
)


class BlockPool(BlockIdPool):
    """``num_blocks`` ids, ``0`` the null block, ``1 .. num_blocks - 1`` allocatable; misuse
    raises ``StateCacheError``, an empty pool ``OutOfStateBlocks``."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks, STATE_POOL)
        self._uninit: set[int] = set()

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks, each with one reference and uninitialised; all or nothing."""
        out = super().allocate(n)
        self._uninit.update(out)
        return out

    def release(self, blocks: Sequence[int]) -> list[int]:
        """Drop one reference per listed id; return the ids that became free (see
        ``BlockIdPool.release``)."""
        freed = super().release(blocks)
        self._uninit.difference_update(freed)
        return freed

    def mark_initialised(self, blocks: Iterable[int]) -> None:
        """Record that the caller zeroed (or copied a state into) these allocated blocks."""
        blocks = list(blocks)
        for b in blocks:
            self._check_live("mark_initialised", b)
        self._uninit.difference_update(blocks)

    def uninitialised(self, blocks: Iterable[int]) -> list[int]:
        """Those of ``blocks`` handed out by ``allocate`` and not yet marked initialised."""
        return [b for b in blocks if b in self._uninit]

"""A fixed pool of KV block ids with a free list and one reference per owner.

Block ids ``0 .. num_blocks - 1`` index dim 0 of every layer's KV cache
(``[num_blocks, 2, num_kv_heads, block_size, head_size]``). A block is free (count 0, on the
free list) or live, with one reference per owner: a sequence's block table, a forked sequence
sharing it, a prefix-cache entry. Unlike the state cache there is no null block: a block table
holds only the blocks a sequence's tokens occupy.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import KVCacheError, OutOfKVBlocks


def check_count(name: str, value: object, minimum: int = 0) -> int:
    """``value`` as a plain int >= ``minimum``; the error names the argument."""
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


class KVBlockPool:
    """``num_blocks`` ids, every one allocatable.

    The free list is a stack: the most recently freed block is handed out first, so reuse of a
    block (and so any missed copy or stale read) is the common case, not the rare one.
    """

    def __init__(self, num_blocks: int) -> None:
        check_count("num_blocks", num_blocks, 1)
        self._refs = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self.peak_used = 0

    @property
    def num_blocks(self) -> int:
        """Ids in the pool (dim 0 of the KV caches)."""
        return len(self._refs)

    @property
    def capacity(self) -> int:
        """Blocks that can be live at once: all of them."""
        return len(self._refs)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._refs) - len(self._free)

    def refcount(self, block: int) -> int:
        self._check_id(block)
        return self._refs[block]

    def refcounts(self) -> tuple[int, ...]:
        """Every block's reference count, indexed by id."""
        return tuple(self._refs)

    def free_ids(self) -> tuple[int, ...]:
        """The free list, top of the stack last."""
        return tuple(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks, each with one reference; all or nothing."""
        check_count("n", n)
        if n > len(self._free):
            raise OutOfKVBlocks(
                f"KV pool: {n} block(s) needed, {len(self._free)} free of {self.capacity}; "
                "preempt a sequence, evict prefix-cache entries or grow the pool",
                needed=n,
                free=len(self._free),
            )
        free, refs = self._free, self._refs
        out = [free.pop() for _ in range(n)]
        for b in out:
            refs[b] = 1
        used = len(refs) - len(free)
        if used > self.peak_used:
            self.peak_used = used
        return out

    def retain(self, block: int) -> None:
        """Add an owner to a live block (a forked sequence, a prefix-cache entry or hit)."""
        self._check_live("retain", block)
        self._refs[block] += 1

    def release(self, blocks: Sequence[int]) -> list[int]:
        """Drop one reference per listed id; return the ids that became free.

        Every id is checked first (free block, more releases than references), so a rejected
        call changes nothing.
        """
        refs = self._refs
        seen: dict[int, int] = {}
        for b in blocks:
            self._check_live("release", b)
            seen[b] = seen.get(b, 0) + 1
            if seen[b] > refs[b]:
                raise KVCacheError(
                    f"release: block {b} listed {seen[b]} times but has {refs[b]} "
                    "reference(s): double free"
                )
        freed = []
        for b in blocks:
            refs[b] -= 1
            if refs[b] == 0:
                freed.append(b)
        self._free.extend(freed)
        return freed

    def _check_id(self, block: object) -> None:
        if type(block) is not int:
            raise TypeError(f"block must be an int block id, got {type(block).__name__}")
        if not 0 <= block < len(self._refs):
            raise KVCacheError(f"block={block} is outside the pool [0, {len(self._refs)})")

    def _check_live(self, op: str, block: object) -> None:
        self._check_id(block)
        assert isinstance(block, int)
        if self._refs[block] == 0:
            raise KVCacheError(f"{op}: block {block} is free (use after free or double free)")

"""A fixed pool of block ids with a free list and one reference per owner (pure Python).

Both block managers keep their ids here: ``kv_cache.KVBlockPool`` (every id allocatable) and
``state_cache.BlockPool`` (id 0 the null block). Ids ``0 .. num_blocks - 1`` index dim 0 of the
cache tensors. The first ``reserved`` ids are never handed out, freed or counted; every other id
is free (count 0, on the free list) or live, with one reference per owner (a table, a forked
sequence sharing it, a prefix-cache entry). A ``PoolKind`` names what sets one cache's pool
apart, so a caller sees the errors of the cache it uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


def check_count(name: str, value: object, minimum: int = 0) -> int:
    """``value`` as a plain int >= ``minimum``; the error names the argument."""
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


class OutOfBlocksError(Protocol):
    """The exception class ``allocate`` raises when short (``OutOfKVBlocks``, ...)."""

    def __call__(self, message: str, *, needed: int, free: int) -> Exception: ...


@dataclass(frozen=True, slots=True)
class PoolKind:
    """One cache's pool: its reserved ids and the errors and advice its callers get."""

    name: str  # names the pool in messages, e.g. "KV pool"
    misuse: type[Exception]  # a call that would corrupt the books (double free, use after free)
    exhausted: OutOfBlocksError  # fewer free blocks than ``allocate`` needs
    remedy: str  # what the caller does about an exhausted pool
    reserved: int = 0  # ids 0 .. reserved - 1 are never handed out, freed or counted
    reserved_role: str = "a reserved block"  # what a reserved id stands for, in errors

    def __post_init__(self) -> None:
        check_count("reserved", self.reserved)


class BlockIdPool:
    """``num_blocks`` ids, ``kind.reserved .. num_blocks - 1`` allocatable.

    The free list is a stack: the most recently freed block is handed out first, so reuse of a
    block (and so any missed zeroing or copy, or a stale read) is the common case, not the rare
    one. Every call checks its arguments first, so a call that raises has changed nothing.
    """

    def __init__(self, num_blocks: int, kind: PoolKind) -> None:
        if not isinstance(kind, PoolKind):
            raise TypeError(f"kind must be a PoolKind, got {type(kind).__name__}")
        check_count("num_blocks", num_blocks, kind.reserved + 1)
        self.kind = kind
        self._reserved = kind.reserved
        self._refs = [0] * num_blocks
        self._free = list(range(num_blocks - 1, kind.reserved - 1, -1))
        self.peak_used = 0

    @property
    def num_blocks(self) -> int:
        """Ids in the pool, the reserved ones included (dim 0 of the cache tensors)."""
        return len(self._refs)

    @property
    def capacity(self) -> int:
        """Blocks that can be live at once (the reserved ones excluded)."""
        return len(self._refs) - self._reserved

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._refs) - self._reserved - len(self._free)

    def refcount(self, block: int) -> int:
        self._check_id(block)
        return self._refs[block]

    def refcounts(self) -> tuple[int, ...]:
        """Every block's reference count, indexed by id (a reserved block's is 0)."""
        return tuple(self._refs)

    def free_ids(self) -> tuple[int, ...]:
        """The free list, top of the stack last."""
        return tuple(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks, each with one reference; all or nothing."""
        check_count("n", n)
        free, refs = self._free, self._refs
        if n > len(free):
            raise self.kind.exhausted(
                f"{self.kind.name}: {n} block(s) needed, {len(free)} free of {self.capacity}; "
                f"{self.kind.remedy}",
                needed=n,
                free=len(free),
            )
        out = [free.pop() for _ in range(n)]
        for b in out:
            refs[b] = 1
        used = len(refs) - self._reserved - len(free)
        if used > self.peak_used:
            self.peak_used = used
        return out

    def retain(self, block: int) -> None:
        """Add an owner to a live block (a forked sequence, a prefix-cache entry or hit)."""
        self._check_live("retain", block)
        self._refs[block] += 1

    def release(self, blocks: Sequence[int]) -> list[int]:
        """Drop one reference per listed id; return the ids that became free.

        Every id is checked first (reserved block, free block, more releases than references),
        so a rejected call changes nothing.
        """
        refs = self._refs
        if len(blocks) == 1:  # the common case: one block, which cannot be listed twice
            self._check_live("release", blocks[0])
        else:
            seen: dict[int, int] = {}
            for b in blocks:
                self._check_live("release", b)
                seen[b] = seen.get(b, 0) + 1
                if seen[b] > refs[b]:
                    raise self.kind.misuse(
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
            raise self.kind.misuse(f"block={block} is outside the pool [0, {len(self._refs)})")

    def _check_live(self, op: str, block: object) -> None:
        self._check_id(block)
        assert isinstance(block, int)
        if block < self._reserved:
            raise self.kind.misuse(
                f"{op}: block {block} is {self.kind.reserved_role}; it has no owner"
            )
        if self._refs[block] == 0:
            raise self.kind.misuse(f"{op}: block {block} is free (use after free or double free)")

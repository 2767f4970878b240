"""A fixed pool of state block ids with one shared null block, a free list and reference counts.

Block ids index dim 0 of a group's state tensors (``[num_blocks, *per_block_shape]``). Id 0 is
the null block: it stands for "no state here" in block tables, is never handed out, never
freed and never counted. Every other id is either free (reference count 0, on the free list) or
live (count >= 1: one per owner, e.g. a request's table and a prefix-cache entry).

Blocks handed out by ``allocate`` hold whatever their last owner left; they stay
"uninitialised" until the caller zeroes (or copies into) them and says so
(``mark_initialised``), which the manager checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .errors import OutOfStateBlocks, StateCacheError

NULL_BLOCK = 0


def check_count(name: str, value: object, minimum: int = 0) -> int:
    """``value`` as a plain int >= ``minimum``; the error names the argument."""
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


class BlockPool:
    """``num_blocks`` ids, ``0`` the null block, ``1 .. num_blocks - 1`` allocatable.

    The free list is a stack: the most recently freed block is handed out first, which keeps
    the working set small and makes reuse (and so the need to zero) the common case.
    """

    def __init__(self, num_blocks: int) -> None:
        check_count("num_blocks", num_blocks, 2)
        self._refs = [0] * num_blocks
        self._free = list(range(num_blocks - 1, 0, -1))
        self._uninit: set[int] = set()
        self.peak_used = 0

    @property
    def num_blocks(self) -> int:
        """Ids in the pool, the null block included (dim 0 of the state tensors)."""
        return len(self._refs)

    @property
    def capacity(self) -> int:
        """Blocks that can be live at once (the null block excluded)."""
        return len(self._refs) - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._refs) - 1 - len(self._free)

    def refcount(self, block: int) -> int:
        self._check_id("block", block)
        return self._refs[block]

    def refcounts(self) -> tuple[int, ...]:
        """Every block's reference count, indexed by id (the null block's is 0)."""
        return tuple(self._refs)

    def free_ids(self) -> tuple[int, ...]:
        """The free list, top of the stack last."""
        return tuple(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks, each with one reference; all or nothing."""
        check_count("n", n)
        if n > len(self._free):
            raise OutOfStateBlocks(
                f"state pool: {n} block(s) needed, {len(self._free)} free "
                f"of {self.capacity}; preempt a request or grow the pool",
                needed=n,
                free=len(self._free),
            )
        free, refs = self._free, self._refs
        out = [free.pop() for _ in range(n)]
        for b in out:
            refs[b] = 1
        self._uninit.update(out)
        used = len(refs) - 1 - len(free)
        if used > self.peak_used:
            self.peak_used = used
        return out

    def retain(self, block: int) -> None:
        """Add an owner to a live block (a prefix-cache entry, a forked request)."""
        self._check_live("retain", block)
        self._refs[block] += 1

    def release(self, blocks: Sequence[int]) -> list[int]:
        """Drop one reference per listed id; return the ids that became free.

        Every id is checked first (null block, free block, more releases than references),
        so a rejected call changes nothing.
        """
        refs = self._refs
        if len(blocks) == 1:  # the common case: one retired block per step
            self._check_live("release", blocks[0])
        else:
            seen: dict[int, int] = {}
            for b in blocks:
                self._check_live("release", b)
                seen[b] = seen.get(b, 0) + 1
                if seen[b] > refs[b]:
                    raise StateCacheError(
                        f"release: block {b} listed {seen[b]} times but has {refs[b]} "
                        "reference(s): double free"
                    )
        freed = []
        for b in blocks:
            refs[b] -= 1
            if refs[b] == 0:
                freed.append(b)
        self._free.extend(freed)
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

    def _check_id(self, name: str, block: object) -> None:
        if type(block) is not int:
            raise TypeError(f"{name} must be an int block id, got {type(block).__name__}")
        if not 0 <= block < len(self._refs):
            raise StateCacheError(f"{name}={block} is outside the pool [0, {len(self._refs)})")

    def _check_live(self, op: str, block: object) -> None:
        self._check_id("block", block)
        assert isinstance(block, int)
        if block == NULL_BLOCK:
            raise StateCacheError(f"{op}: block 0 is the shared null block; it has no owner")
        if self._refs[block] == 0:
            raise StateCacheError(f"{op}: block {block} is free (use after free or double free)")

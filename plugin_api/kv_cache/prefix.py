"""Full KV blocks kept for later sequences with the same token prefix (LRU, by entry count).

An entry is one reference on a full block, so a sequence freeing the block only drops its own
reference and the block's K/V survive for the next hit. Keys are the caller's: typically a
hash chain over the prompt's blocks (``key[i]`` names tokens ``[0, (i + 1) * block_size)``),
so equal keys mean equal K/V. The cache only needs them hashable.

A full block is never written again by anyone: appends write at positions past a sequence's
length, and a sequence truncated back into a shared block copies it before writing
(``Step.copies``). So a cached block keeps what its key names for as long as the entry lives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from .pool import KVBlockPool, check_count


class PrefixCache:
    """At most ``capacity`` entries ``key -> block``; least recently used out first."""

    def __init__(self, pool: KVBlockPool, *, capacity: int) -> None:
        if not isinstance(pool, KVBlockPool):
            raise TypeError(f"pool must be a KVBlockPool, got {type(pool).__name__}")
        self.pool = pool
        self.capacity = check_count("capacity", capacity, 1)
        self._entries: OrderedDict[Hashable, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def blocks(self) -> list[int]:
        """The block of every entry (one reference each)."""
        return list(self._entries.values())

    def insert(self, key: Hashable, block: int) -> bool:
        """Keep ``block`` (a full block whose K/V ``key`` names) under ``key``.

        Returns False, taking no reference, when ``key`` is already cached. When full, drops the
        least recently used entry first.
        """
        if key in self._entries:
            self._entries.move_to_end(key)
            return False
        self.pool.retain(block)  # checks that the block is live
        if len(self._entries) >= self.capacity:
            _, old = self._entries.popitem(last=False)
            self.pool.release([old])
        self._entries[key] = block
        return True

    def lookup(self, keys: Sequence[Hashable]) -> tuple[int, ...]:
        """The blocks of the longest run of leading ``keys`` that are all cached (most recently
        used now). Pass them to ``KVCacheManager.add_sequence(..., prefix=...)``."""
        entries = self._entries
        found = []
        for key in keys:
            block = entries.get(key)
            if block is None:
                break
            found.append(block)
            entries.move_to_end(key)
        return tuple(found)

    def evict(self, n: int = 1) -> list[int]:
        """Drop up to ``n`` least recently used entries that hold the only reference to their
        block (entries still shared by a sequence would free nothing); return the freed
        blocks."""
        check_count("n", n)
        victims: list[Hashable] = []
        for key, block in self._entries.items():
            if len(victims) == n:
                break
            if self.pool.refcount(block) == 1:
                victims.append(key)
        blocks = [self._entries.pop(k) for k in victims]
        return self.pool.release(blocks) if blocks else []

    def clear(self) -> list[int]:
        """Drop every entry; return the blocks that became free."""
        blocks = list(self._entries.values())
        self._entries.clear()
        return self.pool.release(blocks) if blocks else []

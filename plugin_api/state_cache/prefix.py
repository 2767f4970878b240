"""Boundary states kept for later requests with the same token prefix (LRU, by entry count).

An entry is one reference on a pool block, so a request retiring or freeing that block only
releases its own reference and the state survives for the next hit. Keys are the caller's
(typically a hash chain over the prompt's blocks); the cache only needs them hashable.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from .errors import StateCacheError
from .modes import CacheMode, parse_mode
from .pool import NULL_BLOCK, BlockPool, check_count


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Cached states covering a prompt's first ``num_tokens`` tokens (a block multiple).

    ``blocks[i]`` is the state after ``(i + 1) * block_size`` tokens, or ``NULL_BLOCK`` where
    the mode does not need it (``align`` needs only the last). The cache keeps its own
    references; admitting a request with the hit adds the request's.
    """

    num_tokens: int
    blocks: tuple[int, ...]


class PrefixCache:
    """At most ``capacity`` entries ``key -> (num_tokens, block)``; least recently used out
    first."""

    def __init__(self, pool: BlockPool, *, block_size: int, capacity: int) -> None:
        self.pool = pool
        self.block_size = check_count("block_size", block_size, 1)
        self.capacity = check_count("capacity", capacity, 1)
        self._entries: OrderedDict[Hashable, tuple[int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def blocks(self) -> list[int]:
        """The block of every entry (one reference each)."""
        return [b for _, b in self._entries.values()]

    def insert(self, key: Hashable, num_tokens: int, block: int) -> bool:
        """Keep ``block`` (the state after ``num_tokens`` tokens) under ``key``.

        Returns False, taking no reference, when ``key`` is already cached. Evicts the least
        recently used entry when full.
        """
        self._check_tokens(num_tokens)
        if key in self._entries:
            self._entries.move_to_end(key)
            return False
        self.pool.retain(block)  # checks that the block is live and not the null block
        while len(self._entries) >= self.capacity:
            self.evict(1)
        self._entries[key] = (num_tokens, block)
        return True

    def lookup(self, keys: Sequence[Hashable], mode: CacheMode | str) -> PrefixHit | None:
        """The longest cached prefix usable in ``mode``; ``keys[i]`` names ``(i+1)*block_size``
        tokens. ``all`` needs every boundary state up to the hit; ``align`` only the last."""
        mode = parse_mode(mode)
        if not mode.traits.boundary_states:
            raise StateCacheError(f"mode {mode.value!r} keeps no boundary states to look up")
        entries = self._entries
        if mode.traits.positionally_stable:
            found = []
            for i, key in enumerate(keys):
                entry = entries.get(key)
                if entry is None:
                    break
                self._check_entry(key, entry, i)
                found.append(key)
            if not found:
                return None
            for key in found:
                entries.move_to_end(key)
            return PrefixHit(len(found) * self.block_size, tuple(entries[k][1] for k in found))
        for i in range(len(keys) - 1, -1, -1):
            entry = entries.get(keys[i])
            if entry is not None:
                self._check_entry(keys[i], entry, i)
                entries.move_to_end(keys[i])
                return PrefixHit(entry[0], (NULL_BLOCK,) * i + (entry[1],))
        return None

    def evict(self, n: int = 1) -> list[int]:
        """Drop the ``n`` least recently used entries; return the blocks that became free."""
        check_count("n", n)
        victims = []
        for _ in range(min(n, len(self._entries))):
            _, (_, block) = self._entries.popitem(last=False)
            victims.append(block)
        return self.pool.release(victims) if victims else []

    def clear(self) -> list[int]:
        return self.evict(len(self._entries))

    def _check_tokens(self, num_tokens: int) -> None:
        check_count("num_tokens", num_tokens, 1)
        if num_tokens % self.block_size:
            raise StateCacheError(
                f"num_tokens={num_tokens} is not a multiple of block_size={self.block_size}; "
                "only block-aligned states can be cached"
            )

    def _check_entry(self, key: Hashable, entry: tuple[int, int], i: int) -> None:
        if entry[0] != (i + 1) * self.block_size:
            raise StateCacheError(
                f"keys[{i}]={key!r} names a state after {entry[0]} tokens, "
                f"but position {i} means {(i + 1) * self.block_size}"
            )

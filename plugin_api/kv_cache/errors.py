"""Errors of the KV cache: misuse is a ``ValueError``; an empty pool is its own condition."""

from __future__ import annotations

from ..errors import PluginApiError


class KVCacheError(PluginApiError, ValueError):
    """A bookkeeping call that would corrupt the cache: an unknown or duplicate sequence id,
    a sequence past ``max_seq_len``, a double free, a block used after it was freed. Raised
    before anything changes."""


class OutOfKVBlocks(PluginApiError):
    """The pool has fewer free blocks than a call needs; nothing was allocated.

    An engine catches this and preempts a sequence (or evicts prefix-cache entries), then
    retries. ``needed`` and ``free`` are block counts; ``needed`` larger than the pool's
    ``capacity`` can never be met.
    """

    def __init__(self, message: str, *, needed: int, free: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.free = free

"""Errors of the state cache: misuse is a ``ValueError``; an empty pool is its own condition."""

from __future__ import annotations

from ..errors import PluginApiError


class StateCacheError(PluginApiError, ValueError):
    """A bookkeeping call that would corrupt the cache: double free, freeing the null block,
    using a freed block, an unknown request, a range outside a block table. Raised before
    anything changes."""


class OutOfStateBlocks(PluginApiError):
    """The pool has fewer free blocks than a call needs; nothing was allocated.

    A scheduler catches this and preempts or waits. ``needed`` and ``free`` are block counts.
    """

    def __init__(self, message: str, *, needed: int, free: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.free = free

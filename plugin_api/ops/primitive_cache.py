"""An LRU cache of built kernels ("primitives") keyed by a full problem descriptor.

The key is the descriptor object itself (a frozen dataclass such as ``GemmProblem``), so every
field takes part in lookup: two problems that differ in any field never share a primitive.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    size: int
    capacity: int


class PrimitiveCache(Generic[K, V]):
    def __init__(self, capacity: int = 256) -> None:
        if capacity < 1:
            raise ValueError(f"PrimitiveCache: capacity={capacity} must be >= 1")
        self._capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    def get_or_build(self, key: K, build: Callable[[K], V]) -> V:
        with self._lock:
            if key in self._items:
                self._hits += 1
                self._items.move_to_end(key)
                return self._items[key]
        value = build(key)  # outside the lock: building may take long (JIT, prepacking)
        with self._lock:
            self._misses += 1
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
                self._evictions += 1
            return value

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def problems(self) -> tuple[K, ...]:
        """The problems with a primitive now, least recently used first."""
        with self._lock:
            return tuple(self._items)

    def stats(self) -> CacheStats:
        return CacheStats(
            self._hits, self._misses, self._evictions, len(self._items), self._capacity
        )

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

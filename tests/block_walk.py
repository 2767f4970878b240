"""What the two cache walks share: live entries by name, preemption, and the pool's books.

``kv_cache_walk.Walk`` (sequences) and ``state_cache_walk.Walk`` (requests) subclass
``BlockWalk`` and add their events, their model of device memory and their own invariants.
Every choice comes from ``choose(n)``, so hypothesis can shrink a list of choices and a seeded
``random.Random`` can run long walks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from plugin_api.block_pool import BlockIdPool

Entry = TypeVar("Entry")  # a sequence or a request
W = TypeVar("W", bound="BlockWalk[Any]")


class CachedBlocks(Protocol):
    """A cache's prefix cache, as far as the books go: one reference per entry."""

    def blocks(self) -> list[int]: ...

    def clear(self) -> list[int]: ...


class BlockWalk(ABC, Generic[Entry]):
    name_prefix: ClassVar[str]  # of the names ``new_name`` makes
    pool: BlockIdPool
    cache: CachedBlocks | None  # None: no prefix cache

    def __init__(self, choose: Callable[[int], int], max_live: int) -> None:
        self.choose = choose
        self.max_live = max_live
        self.live: dict[str, Entry] = {}
        self.preempted: list[Entry] = []
        self.serial = 0
        self.steps = 0
        self.hits = 0
        self.out_of_blocks = 0

    # ---- what each walk defines --------------------------------------------------------------

    @abstractmethod
    def event(self) -> None:
        """One random event, then ``check``."""

    @abstractmethod
    def start(self, entry: Entry) -> None:
        """Add an entry to the manager (from a prefix-cache hit where there is one)."""

    @abstractmethod
    def end(self, entry: Entry, *, preempt: bool) -> None:
        """Finish, abort or preempt (a preempted entry resumes later and recomputes)."""

    @abstractmethod
    def gone(self, freed: tuple[int, ...] | list[int]) -> None:
        """Blocks that became free turn to garbage in the model of device memory."""

    @abstractmethod
    def check(self) -> None:
        """Every invariant, after every event (``check_books`` among them)."""

    # ---- shared ----------------------------------------------------------------------------

    def pick(self) -> Entry:
        names = list(self.live)
        return self.live[names[self.choose(len(names))]]

    def new_name(self) -> str:
        self.serial += 1
        return f"{self.name_prefix}{self.serial}"

    def full(self) -> bool:
        """No room for another live entry (admit, resume and fork wait)."""
        return len(self.live) >= self.max_live

    def resume(self) -> None:
        if self.preempted and not self.full():
            self.start(self.preempted.pop(self.choose(len(self.preempted))))

    def finish_all(self) -> None:
        for entry in list(self.live.values()):
            self.end(entry, preempt=False)
        self.preempted.clear()
        if self.cache is not None:
            self.gone(self.cache.clear())

    def check_books(self, owners: list[int]) -> None:
        """The pool's counts are the owners the walk knows of (``owners``: the tables'), plus
        the prefix cache's; its free list is exactly the unowned, unreserved blocks."""
        if self.cache is not None:
            for b in self.cache.blocks():
                owners[b] += 1
        refs = self.pool.refcounts()
        assert list(refs) == owners, "reference counts differ from the owners"
        free = self.pool.free_ids()
        assert len(set(free)) == len(free), "a block is on the free list twice"
        reserved = self.pool.kind.reserved
        unowned = {b for b, r in enumerate(refs) if r == 0 and b >= reserved}
        assert set(free) == unowned, "free list != unowned"


def drive(walk: W, events: int) -> W:
    """``events`` random events, then everything finished: the pool must be whole again."""
    for _ in range(events):
        walk.event()
    walk.finish_all()
    walk.check()
    assert not walk.live
    assert walk.pool.num_free == walk.pool.capacity, "leak: blocks still held at the end"
    return walk


def chooser(choices: list[int]) -> Callable[[int], int]:
    """A walk's ``choose`` that replays ``choices`` (hypothesis shrinks them), then picks 0."""
    it = iter(choices)

    def choose(n: int) -> int:
        return next(it, 0) % n

    return choose

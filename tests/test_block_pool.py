"""The block pool both caches share: reserved ids, and each cache's own errors."""

from __future__ import annotations

import pytest

from plugin_api.block_pool import BlockIdPool, PoolKind
from plugin_api.kv_cache import KVBlockPool, KVCacheError, OutOfKVBlocks
from plugin_api.state_cache import NULL_BLOCK, BlockPool, OutOfStateBlocks, StateCacheError


class Misuse(ValueError):
    pass


class Exhausted(Exception):
    def __init__(self, message: str, *, needed: int, free: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.free = free


TWO_RESERVED = PoolKind(
    name="test pool",
    misuse=Misuse,
    exhausted=Exhausted,
    remedy="wait",
    reserved=2,
    reserved_role="a sentinel",
)


def test_reserved_ids_are_never_handed_out_freed_or_counted():
    pool = BlockIdPool(5, TWO_RESERVED)
    assert (pool.num_blocks, pool.capacity, pool.num_free) == (5, 3, 3)
    assert sorted(pool.allocate(3)) == [2, 3, 4] and pool.num_used == 3
    for block in (0, 1):
        with pytest.raises(Misuse, match=f"retain: block {block} is a sentinel; it has no owner"):
            pool.retain(block)
        assert pool.refcount(block) == 0
    with pytest.raises(Exhausted, match=r"test pool: 1 block\(s\) needed, 0 free of 3; wait"):
        pool.allocate(1)


def test_the_kv_pool_reserves_nothing():
    pool = KVBlockPool(3)
    assert pool.capacity == 3 and sorted(pool.allocate(3)) == [0, 1, 2]
    pool.retain(0)
    assert pool.release([0, 0]) == [0]


@pytest.mark.parametrize(
    ("make", "misuse", "exhausted", "name"),
    [
        (KVBlockPool, KVCacheError, OutOfKVBlocks, "KV pool"),
        (BlockPool, StateCacheError, OutOfStateBlocks, "state pool"),
    ],
)
def test_each_cache_sees_its_own_errors(make, misuse, exhausted, name):
    pool = make(4)
    a, b = pool.allocate(2)
    with pytest.raises(misuse, match="double free"):
        pool.release([a, a])
    pool.release([b])
    with pytest.raises(misuse, match="use after free"):
        pool.retain(b)
    with pytest.raises(misuse, match="outside the pool"):
        pool.refcount(4)
    with pytest.raises(exhausted, match=f"^{name}: 9 block") as e:
        pool.allocate(9)
    assert (e.value.needed, e.value.free) == (9, pool.num_free)
    assert pool.refcount(a) == 1  # nothing above changed the books


def test_only_the_state_pool_has_a_null_block():
    pool = BlockPool(3)
    with pytest.raises(StateCacheError, match="block 0 is the shared null block"):
        pool.release([NULL_BLOCK])
    assert not hasattr(KVBlockPool(3), "mark_initialised")


def test_bad_kinds_and_sizes_name_the_argument():
    with pytest.raises(ValueError, match="reserved=-1 must be >= 0"):
        PoolKind(name="p", misuse=Misuse, exhausted=Exhausted, remedy="", reserved=-1)
    with pytest.raises(ValueError, match="num_blocks=2 must be >= 3"):
        BlockIdPool(2, TWO_RESERVED)
    with pytest.raises(TypeError, match="kind must be a PoolKind, got str"):
        BlockIdPool(4, "kv")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_blocks=0 must be >= 1"):
        KVBlockPool(0)

"""The block pool and the prefix cache: ownership, errors before any change, LRU release."""

from __future__ import annotations

import pytest

from plugin_api.state_cache import (
    NULL_BLOCK,
    BlockPool,
    CacheMode,
    OutOfStateBlocks,
    PrefixCache,
    PrefixHit,
    StateCacheError,
)


def test_allocate_and_release_round_trip():
    pool = BlockPool(6)
    assert (pool.capacity, pool.num_free, pool.num_used) == (5, 5, 0)
    a = pool.allocate(3)
    assert len(set(a)) == 3 and NULL_BLOCK not in a
    assert all(pool.refcount(b) == 1 for b in a)
    assert (pool.num_free, pool.peak_used) == (2, 3)
    assert pool.release(a) == a
    assert pool.num_free == 5 and pool.peak_used == 3
    assert pool.allocate(1) == [a[-1]]  # a stack: the last freed comes back first


def test_out_of_blocks_allocates_nothing():
    pool = BlockPool(3)
    pool.allocate(1)
    before = pool.free_ids()
    with pytest.raises(OutOfStateBlocks, match=r"2 block\(s\) needed, 1 free of 2") as e:
        pool.allocate(2)
    assert (e.value.needed, e.value.free) == (2, 1)
    assert pool.free_ids() == before


def test_double_free_is_an_error_and_changes_nothing():
    pool = BlockPool(4)
    (a,) = pool.allocate(1)
    with pytest.raises(StateCacheError, match="listed 2 times but has 1 reference"):
        pool.release([a, a])
    assert pool.refcount(a) == 1
    pool.release([a])
    with pytest.raises(StateCacheError, match=f"block {a} is free"):
        pool.release([a])


def test_null_block_has_no_owner():
    pool = BlockPool(4)
    for call in (lambda: pool.release([NULL_BLOCK]), lambda: pool.retain(NULL_BLOCK)):
        with pytest.raises(StateCacheError, match="null block"):
            call()
    assert NULL_BLOCK not in pool.free_ids() and pool.refcount(NULL_BLOCK) == 0


def test_use_of_a_freed_block_is_an_error():
    pool = BlockPool(4)
    (a,) = pool.allocate(1)
    pool.release([a])
    for call in (lambda: pool.retain(a), lambda: pool.mark_initialised([a])):
        with pytest.raises(StateCacheError, match="use after free"):
            call()


def test_mixed_release_checks_every_id_first():
    pool = BlockPool(5)
    a, b = pool.allocate(2)
    pool.release([b])
    with pytest.raises(StateCacheError):
        pool.release([a, b])  # b is free: a must not have been released either
    assert pool.refcount(a) == 1


def test_bad_ids_and_sizes():
    pool = BlockPool(4)
    with pytest.raises(StateCacheError, match=r"outside the pool \[0, 4\)"):
        pool.refcount(4)
    with pytest.raises(TypeError, match="int block id"):
        pool.retain("1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="n must be an int"):
        pool.allocate(True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_blocks=1 must be >= 2"):
        BlockPool(1)


def test_reallocated_blocks_are_uninitialised_until_marked():
    pool = BlockPool(4)
    a = pool.allocate(2)
    assert pool.uninitialised(a) == a
    pool.mark_initialised(a)
    assert pool.uninitialised(a) == []
    pool.release(a)
    again = pool.allocate(2)
    assert sorted(again) == sorted(a) and pool.uninitialised(again) == again


def test_prefix_cache_reference_outlives_the_owner():
    pool = BlockPool(4)
    cache = PrefixCache(pool, block_size=4, capacity=2)
    (a,) = pool.allocate(1)
    assert cache.insert("k8", 8, a) is True
    assert cache.insert("k8", 8, a) is False  # already cached: no second reference
    assert pool.refcount(a) == 2
    assert pool.release([a]) == []  # the owner lets go; the cache still holds it
    assert cache.evict() == [a]
    assert pool.num_free == pool.capacity


def test_prefix_cache_evicts_least_recently_used():
    pool = BlockPool(6)
    cache = PrefixCache(pool, block_size=2, capacity=2)
    a, b, c = pool.allocate(3)
    cache.insert("x", 2, a)
    cache.insert("y", 2, b)
    assert cache.lookup(["x"], CacheMode.ALIGN) == PrefixHit(2, (a,))  # x is now the newest
    pool.release([a, b])  # only the cache holds a and b now
    assert cache.insert("z", 2, c)  # full: y, the least recently used, goes
    assert "y" not in cache and "x" in cache
    assert pool.refcount(b) == 0 and b in pool.free_ids()


def test_prefix_lookup_per_mode():
    pool = BlockPool(8)
    cache = PrefixCache(pool, block_size=4, capacity=8)
    a, b, c = pool.allocate(3)
    cache.insert("k4", 4, a)
    cache.insert("k12", 12, c)
    keys = ["k4", "k8", "k12", "k16"]
    assert cache.lookup(keys, "align") == PrefixHit(12, (NULL_BLOCK, NULL_BLOCK, c))
    assert cache.lookup(keys, "all") == PrefixHit(4, (a,))  # k8 missing breaks the chain
    cache.insert("k8", 8, b)
    assert cache.lookup(keys, "all") == PrefixHit(12, (a, b, c))
    assert cache.lookup(["nope"], "all") is None
    with pytest.raises(StateCacheError, match="keeps no boundary states"):
        cache.lookup(keys, "none")
    with pytest.raises(StateCacheError, match="position 0 means 4"):
        cache.lookup(["k8"], "align")


def test_prefix_cache_takes_only_aligned_live_states():
    pool = BlockPool(4)
    cache = PrefixCache(pool, block_size=4, capacity=2)
    (a,) = pool.allocate(1)
    with pytest.raises(StateCacheError, match="not a multiple of block_size=4"):
        cache.insert("k", 6, a)
    with pytest.raises(StateCacheError, match="null block"):
        cache.insert("k", 4, NULL_BLOCK)
    pool.release([a])
    with pytest.raises(StateCacheError, match="use after free"):
        cache.insert("k", 4, a)
    assert len(cache) == 0

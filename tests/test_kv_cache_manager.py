"""The KV block manager case by case: copy-on-write, the step's batch, errors that change
nothing, the prefix cache, and the KV copies on real tensors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from plugin_api.kv_cache import (
    KVBlockPool,
    KVCacheError,
    KVCacheManager,
    OutOfKVBlocks,
    PrefixCache,
)
from plugin_api.kv_cache.tensors import copy_kv_blocks
from plugin_api.ops.attention import AttentionSpec, allocate_kv_cache, validate_batch


def manager(num_blocks: int = 8, block_size: int = 4, **kw: int) -> KVCacheManager:
    return KVCacheManager(KVBlockPool(num_blocks), block_size=block_size, **kw)


def state(m: KVCacheManager) -> tuple[object, ...]:
    return (
        tuple((s, m.table(s), m.num_tokens(s)) for s in m.sequences()),
        m.pool.refcounts(),
        m.pool.free_ids(),
    )


def test_fork_shares_every_block_and_the_first_writer_copies_the_partial_one():
    m = manager()
    m.add_sequence("a")
    m.schedule({"a": 6})  # blocks [b0 full, b1 with 2 of 4 tokens]
    b0, b1 = m.table("a")
    m.fork("a", "b")
    assert m.table("b") == (b0, b1)
    assert m.pool.refcount(b0) == m.pool.refcount(b1) == 2
    assert m.blocks_needed({"a": 1, "b": 1}) == 1  # one copy: the second writer is alone
    step = m.schedule({"a": 1, "b": 1})
    (new,) = step.fresh
    assert step.copies == ((b1, new),)  # a, first, moved to a copy of b1
    assert m.table("a") == (b0, new) and m.table("b") == (b0, b1)
    assert m.pool.refcount(b1) == m.pool.refcount(new) == 1 and m.pool.refcount(b0) == 2
    assert step.slot_mapping == (new * 4 + 2, b1 * 4 + 2)
    step = m.schedule({"b": 1})  # b owns b1 alone now: in place
    assert step.copies == () and step.fresh == ()


def test_a_full_last_block_is_shared_without_a_copy():
    m = manager()
    m.add_sequence("a")
    m.schedule({"a": 4})
    m.fork("a", "b")
    step = m.schedule({"a": 1, "b": 1})
    assert step.copies == () and len(step.fresh) == 2


def test_three_owners_copy_twice_and_the_last_writes_in_place():
    m = manager()
    m.add_sequence("a")
    m.schedule({"a": 3})
    (b,) = m.table("a")
    m.fork("a", "b")
    m.fork("a", "c")
    assert m.blocks_needed([("c", 1), ("a", 1), ("b", 1)]) == 2
    step = m.schedule([("c", 1), ("a", 1), ("b", 1)])
    assert [src for src, _ in step.copies] == [b, b]
    assert m.table("b") == (b,) and m.pool.refcount(b) == 1


def test_truncating_into_a_shared_block_copies_it_on_the_next_write():
    m = manager()
    cache = PrefixCache(m.pool, capacity=4)
    m.add_sequence("a")
    m.schedule({"a": 8})
    for i, blk in enumerate(m.full_blocks("a")):
        cache.insert(("key", i), blk)
    b1 = m.table("a")[1]
    out = m.truncate("a", 5)  # a rejected draft: back into the cached block
    assert out.freed == () and out.shared == ()
    step = m.schedule({"a": 1})
    assert step.copies == ((b1, step.fresh[0]),)
    assert m.pool.refcount(b1) == 1  # the cache's entry alone


def test_step_orders_decodes_first_and_maps_slots():
    m = manager(num_blocks=16, block_size=4, num_speculative_tokens=1)
    for s, n in (("p", 5), ("d", 3), ("e", 2)):
        m.add_sequence(s)
        m.schedule({s: n})
    step = m.schedule([("p", 3), ("d", 1), ("e", 2)])
    assert step.seq_ids == ("d", "e", "p") and step.num_decodes == 2
    assert step.query_lens == (1, 2, 3) and step.seq_lens == (4, 4, 8)
    assert step.positions == (3, 2, 3, 5, 6, 7)
    assert step.last_token_indices == (0, 2, 5)
    p = m.table("p")
    assert step.slot_mapping[3:] == (p[1] * 4 + 1, p[1] * 4 + 2, p[1] * 4 + 3)
    batch = step.attention_batch(pad_to=8)
    assert batch.query_start_loc.tolist() == [0, 1, 3, 6]
    assert batch.seq_lens.tolist() == [4, 4, 8] and batch.num_decodes == 2
    assert batch.slot_mapping.tolist() == [*step.slot_mapping, -1, -1]
    assert batch.block_table[2].tolist() == list(p)
    assert batch.block_table[0, : len(m.table("d"))].tolist() == list(m.table("d"))
    spec = AttentionSpec(4, 2, 16, block_size=4, num_speculative_tokens=1)
    assert validate_batch(spec, batch, 16) == max(b for s in "dep" for b in m.table(s))
    with pytest.raises(ValueError, match="pad_to=5 must be >= 6"):
        step.attention_batch(pad_to=5)


def test_out_of_blocks_changes_nothing_and_says_how_many():
    m = manager(num_blocks=3)
    m.add_sequence("a")
    m.add_sequence("b")
    m.schedule({"a": 5})
    before = state(m)
    with pytest.raises(OutOfKVBlocks, match="2 KV block") as e:
        m.schedule({"a": 1, "b": 5})
    assert (e.value.needed, e.value.free) == (2, 1)
    assert state(m) == before
    with pytest.raises(OutOfKVBlocks, match="more than the whole pool"):
        m.schedule({"b": 13})
    m.free("a")  # preempt, then the retry fits
    assert m.schedule({"b": 5}).seq_lens == (5,)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: m.schedule({"nope": 1}), KVCacheError, "sequence 'nope' is not allocated"),
        (lambda m: m.schedule([("a", 1), ("a", 1)]), KVCacheError, "'a' is listed twice"),
        (lambda m: m.schedule({"a": 0}), ValueError, "num_tokens of sequence 'a'=0 must be >= 1"),
        (lambda m: m.schedule({"a": 1.0}), TypeError, "num_tokens of sequence 'a' must be an int"),
        (lambda m: m.schedule(["a"]), TypeError, r"work\[0\] must be a \(seq_id, num_tokens\)"),
        (lambda m: m.schedule({"a": 1, "b": 10}), KVCacheError, "11 tokens long, past max_seq_len"),
        (lambda m: m.add_sequence("a"), KVCacheError, "'a' already exists"),
        (lambda m: m.add_sequence("c", prefix=[7]), KVCacheError, r"prefix\[0\]=7 is a free"),
        (lambda m: m.add_sequence("c", prefix=[99]), KVCacheError, "outside the pool"),
        (lambda m: m.add_sequence("c", prefix=[0, 0]), KVCacheError, "lists a block twice"),
        (lambda m: m.add_sequence("c", prefix=[0, 1, 2]), KVCacheError, "max_seq_len=10"),
        (lambda m: m.fork("a", "b"), KVCacheError, "fork: sequence 'b' already exists"),
        (lambda m: m.fork("x", "y"), KVCacheError, "fork: sequence 'x' is not allocated"),
        (lambda m: m.truncate("a", 6), KVCacheError, "num_tokens=6 is past sequence 'a'"),
        (lambda m: m.free("x"), KVCacheError, "free: sequence 'x' is not allocated"),
        (lambda m: m.table(["x"]), TypeError, "seq_id must be hashable"),
    ],
)
def test_misuse_is_refused_naming_the_argument_and_changes_nothing(call, error, match):
    m = manager(max_seq_len=10)
    m.add_sequence("a")
    m.add_sequence("b")
    m.schedule({"a": 5, "b": 1})
    before = state(m)
    with pytest.raises(error, match=match):
        call(m)
    assert state(m) == before


def test_free_reports_what_stays_shared():
    m = manager()
    m.add_sequence("a")
    m.schedule({"a": 6})
    m.fork("a", "b")
    m.schedule({"b": 1})  # b copies the partial block
    b0, b1 = m.table("a")
    out = m.free("a")
    assert out.freed == (b1,) and out.shared == (b0,)
    with pytest.raises(KVCacheError, match="double free"):
        m.pool.release([b0, b0])
    assert m.pool.refcount(b0) == 1


def test_prefix_hit_shares_full_blocks_and_eviction_keeps_used_ones():
    m = manager()
    cache = PrefixCache(m.pool, capacity=2)
    m.add_sequence("a")
    m.schedule({"a": 9})
    b0, b1, _ = m.table("a")
    assert cache.insert("k0", b0) and cache.insert("k1", b1) and not cache.insert("k0", b0)
    assert cache.lookup(["k0", "zz", "k1"]) == (b0,)
    hit = cache.lookup(["k0", "k1", "k2"])
    m.add_sequence("b", prefix=hit)
    assert m.num_tokens("b") == 8 and m.pool.refcount(b0) == 3
    step = m.schedule({"b": 1})  # block-aligned: a new block, nothing copied
    assert step.copies == () and step.positions == (8,)
    m.free("a")
    m.free("b")
    cache.lookup(["k0"])  # k1 is now the least recently used
    assert cache.evict(1) == [b1]  # held only by the cache now: freed
    assert cache.evict(5) == [b0]
    assert len(cache) == 0 and m.pool.num_free == m.pool.capacity


def test_prefix_cache_evicts_nothing_a_sequence_still_holds():
    m = manager()
    cache = PrefixCache(m.pool, capacity=4)
    m.add_sequence("a")
    m.schedule({"a": 4})
    cache.insert("k", m.table("a")[0])
    assert cache.evict(1) == [] and len(cache) == 1
    assert cache.clear() == [] and m.pool.refcount(m.table("a")[0]) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_copy_kv_blocks_copies_bits_of_every_layer_and_nothing_else(dtype):
    spec = AttentionSpec(4, 2, 16, dtype=torch.bfloat16, kv_cache_dtype=dtype, block_size=4)
    caches = [allocate_kv_cache(spec, 6, "cpu") for _ in range(2)]
    for c in caches:
        c.data.view(torch.uint8).copy_(
            torch.randint(0, 256, c.data.view(torch.uint8).shape, dtype=torch.uint8)
        )
    before = [c.data.view(torch.uint8).clone() for c in caches]
    copy_kv_blocks(caches, [(1, 4), (3, 0)])
    for c, old in zip(caches, before, strict=True):
        raw = c.data.view(torch.uint8)
        assert torch.equal(raw[4], old[1]) and torch.equal(raw[0], old[3])
        for b in (1, 2, 3, 5):
            assert torch.equal(raw[b], old[b])


def test_copy_kv_blocks_refuses_order_dependent_or_out_of_range_copies():
    spec = AttentionSpec(4, 2, 16, dtype=torch.float32, block_size=4)
    caches = [allocate_kv_cache(spec, 4, "cpu")]
    with pytest.raises(ValueError, match="repeat a destination"):
        copy_kv_blocks(caches, [(0, 1), (2, 1)])
    with pytest.raises(ValueError, match=r"\[1\] are both source and destination"):
        copy_kv_blocks(caches, [(0, 1), (1, 2)])
    with pytest.raises(ValueError, match=r"block\(s\) \[4\] are outside caches\[0\]'s 4"):
        copy_kv_blocks(caches, [(0, 4)])
    with pytest.raises(TypeError, match=r"caches\[0\] must be a KVCache"):
        copy_kv_blocks([caches[0].data], [(0, 1)])  # type: ignore[list-item]


def test_the_manager_imports_no_torch():
    """A scheduler process keeps the books without torch; ``plugin_api`` exports lazily."""
    code = """
import sys
import plugin_api
from plugin_api import KVBlockPool, KVCacheManager, OutOfKVBlocks
from plugin_api.kv_cache import PrefixCache
m = KVCacheManager(KVBlockPool(4), block_size=2)
m.add_sequence("a")
assert m.schedule({"a": 3}).slot_mapping == (0, 1, 2)
assert "torch" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    import plugin_api

    assert plugin_api.copy_kv_blocks is copy_kv_blocks

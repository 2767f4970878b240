"""The state-cache manager, case by case: retirement across null holes, ranges, watermarks,
shared blocks, relocated drafts, zeroing checks, declared positional stability."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from plugin_api.state_cache import (
    NULL_BLOCK,
    BlockPool,
    CacheMode,
    OutOfStateBlocks,
    PrefixCache,
    Released,
    StateCacheError,
    StateCacheManager,
)
from plugin_api.state_cache.offload import completed_states

N = NULL_BLOCK


def manager(mode="align", *, blocks=16, block_size=4, spec=2, check=False) -> StateCacheManager:
    return StateCacheManager(
        BlockPool(blocks),
        block_size=block_size,
        mode=mode,
        num_speculative_tokens=spec,
        check_initialised=check,
    )


def null_hole_table(m: StateCacheManager) -> tuple[int, int, int]:
    """Pipelined chunks [0,4) [4,12) [12,16) leave ``[old, NULL, committed, in_flight]``."""
    m.add_request("r")
    (old,) = m.schedule("r", 4).fresh
    (committed,) = m.schedule("r", 8).fresh  # ends in slot 2; slot 1 is skipped
    m.commit("r")
    (in_flight,) = m.schedule("r", 4).fresh
    m.commit("r", retire=False)
    assert m.table("r") == (old, N, committed, in_flight)
    assert m.computed("r") == 12 and m.slot(12) == 2
    return old, committed, in_flight


def test_retirement_crosses_null_holes():
    m = manager()
    old, committed, in_flight = null_hole_table(m)
    assert m.retire("r", 0, 2) == Released(freed=(old,))
    assert m.table("r") == (N, N, committed, in_flight)
    assert m.watermark("r") == 2
    assert m.retire("r", 0, 2) == Released()  # repeating frees nothing
    assert m.watermark("r") == 2
    assert m.pool.refcount(committed) == m.pool.refcount(in_flight) == 1
    assert m.pool.refcount(old) == 0


def test_commit_retires_the_same_range():
    m = manager()
    m.add_request("r")
    (old,) = m.schedule("r", 4).fresh
    m.schedule("r", 8)
    m.commit("r")
    m.schedule("r", 4)
    assert m.commit("r").retired == Released(freed=(old,))
    assert m.retire("r", 0, 2) == Released()


def test_retire_range_is_checked_not_clamped():
    m = manager()
    null_hole_table(m)
    with pytest.raises(StateCacheError, match=r"\[0, 5\) is outside 'r''s table of 4 slot"):
        m.retire("r", 0, 5)
    with pytest.raises(StateCacheError, match="slot 2 and above hold 'r''s committed state"):
        m.retire("r", 0, 3)
    with pytest.raises(ValueError, match="start=2 > stop=1"):
        m.retire("r", 2, 1)
    with pytest.raises(ValueError, match="start=-1 must be >= 0"):
        m.retire("r", -1, 1)
    with pytest.raises(TypeError, match="stop must be an int"):
        m.retire("r", 0, 1.0)  # type: ignore[arg-type]
    with pytest.raises(StateCacheError, match="unknown request 'x'"):
        m.retire("x", 0, 0)
    assert m.watermark("r") == 0  # nothing was retired by the refused calls


def test_retire_above_the_watermark_keeps_it():
    m = manager()
    old, _, _ = null_hole_table(m)
    assert m.retire("r", 1, 2) == Released()  # a hole only; slot 0 is still live
    assert m.watermark("r") == 0
    assert m.retire("r", 0, 2).freed == (old,)


def test_watermark_lives_and_dies_with_the_request():
    m = manager()
    null_hole_table(m)
    m.retire("r", 0, 2)
    m.commit("r")
    assert m.watermark("r") == 3
    m.free("r")
    with pytest.raises(StateCacheError, match="unknown request 'r'"):
        m.watermark("r")
    m.add_request("r")  # a new request under the same id starts from scratch
    assert (m.watermark("r"), m.table("r"), m.computed("r")) == (0, (), 0)
    assert m.pool.num_free == m.pool.capacity


def test_free_releases_everything_and_needs_no_step_in_flight():
    m = manager()
    null_hole_table(m)
    with pytest.raises(StateCacheError, match=r"1 step\(s\) in flight"):
        m.free("r")
    in_flight = m.table("r")[3]
    assert len(m.commit("r").retired.freed) == 2
    assert m.free("r") == Released(freed=(in_flight,))
    assert m.pool.num_free == m.pool.capacity
    with pytest.raises(StateCacheError, match="unknown request"):
        m.free("r")


def test_prefix_cache_state_is_released_not_freed():
    m = manager()
    cache = PrefixCache(m.pool, block_size=4, capacity=4)
    m.add_request("a")
    m.schedule("a", 8)
    ((n, state),) = m.commit("a").boundary_states
    assert n == 8
    cache.insert(("sys", 8), 8, state)
    m.schedule("a", 4)
    c = m.commit("a")  # slot 1 (the cached state) is below the committed state now
    assert c.retired == Released(shared=(state,))
    assert m.pool.refcount(state) == 1  # the cache's reference
    m.free("a")
    hit = cache.lookup([("sys", 4), ("sys", 8)], "align")
    assert hit is not None and hit.blocks == (N, state)
    m.add_request("b", hit)
    step = m.schedule("b", 3)
    assert step.read == state and step.start == 8
    assert state not in step.fresh and all(b != state for _, b in step.writes)
    m.commit("b")
    assert m.retire("b", 0, m.slot(11)) == Released()
    assert m.pool.refcount(state) == 1  # retired by b: the cache keeps it
    assert cache.clear() == [state]
    m.free("b")
    assert m.pool.num_free == m.pool.capacity


def test_hits_are_validated():
    m = manager()
    cache = PrefixCache(m.pool, block_size=4, capacity=4)
    (a,) = m.pool.allocate(1)
    cache.insert("k", 4, a)
    m.pool.release([a])
    hit = cache.lookup(["k"], "align")
    assert hit is not None
    with pytest.raises(StateCacheError, match="the state to resume from"):
        m.add_request("x", type(hit)(4, (N,)))
    with pytest.raises(StateCacheError, match="needs a multiple of 4 tokens"):
        m.add_request("x", type(hit)(6, (a,)))
    cache.clear()
    with pytest.raises(StateCacheError, match="is free"):
        m.add_request("x", hit)
    assert "x" not in m
    with pytest.raises(StateCacheError, match="cannot start from cached states"):
        manager("none").add_request("x", hit)


def test_accepted_drafts_move_into_the_table():
    m = manager(spec=2)
    m.add_request("r")
    m.schedule("r", 4)
    m.commit("r")
    (x,) = m.table("r")
    step = m.schedule("r", 1, 2)  # the state after 5 tokens starts slot 1
    y, d0, d1 = step.fresh
    assert (step.read, step.writes, step.drafts) == (x, ((5, y),), (d0, d1))
    c = m.commit("r", 2)
    assert c.computed == 7
    assert m.table("r") == (N, d1) and m.spec_blocks("r") == (d0, y)
    assert c.retired == Released(freed=(x,))
    step = m.schedule("r", 1, 2)  # in place in slot 1; the spec blocks are reused
    assert (step.read, step.fresh, step.drafts) == (d1, (), (d0, y))
    c = m.commit("r", 0)
    assert c.computed == 8 and m.table("r") == (N, d1) and c.boundary_states == ((8, d1),)


def test_an_accepted_draft_into_a_new_slot_is_refilled_next_time():
    m = manager(spec=2, block_size=3)
    m.add_request("r")
    m.schedule("r", 1)
    m.commit("r")
    step = m.schedule("r", 1, 2)  # states after 2 (in place), 3 (draft) and 4 (draft, slot 1)
    assert len(step.fresh) == 2
    m.commit("r", 2)
    assert m.table("r") == (N, step.drafts[1]) and m.spec_blocks("r") == (step.drafts[0],)
    nxt = m.schedule("r", 1, 2)
    assert len(nxt.fresh) == 1 and nxt.drafts == (step.drafts[0], nxt.fresh[0])


def test_all_mode_keeps_every_boundary_state_in_place():
    m = manager("all", spec=2)
    m.add_request("r")
    step = m.schedule("r", 10)
    a, b, c = step.fresh
    assert step.writes == ((4, a), (8, b), (10, c)) and step.read == a
    assert m.commit("r").boundary_states == ((4, a), (8, b))
    d = m.schedule("r", 1, 2)  # states after 11, 12 (a boundary, in a draft) and 13
    m.commit("r", 2)
    table = m.table("r")
    assert table[:2] == (a, b) and table[2] == d.drafts[0] and len(table) == 4
    assert completed_states(m, "r") == ((4, a), (8, b), (12, d.drafts[0]))
    assert completed_states(m, "r", 2) == ((12, d.drafts[0]),)
    with pytest.raises(StateCacheError, match="keeps every state"):
        m.retire("r", 0, 1)


def test_positional_stability_is_declared_and_checked():
    assert CacheMode.ALL.positionally_stable
    assert not CacheMode.ALIGN.positionally_stable
    assert not CacheMode.NONE.positionally_stable
    for mode in ("align", "none"):
        m = manager(mode)
        m.add_request("r")
        with pytest.raises(StateCacheError, match="not positionally stable"):
            completed_states(m, "r")


def test_none_mode_has_one_running_state():
    m = manager("none", spec=1)
    m.add_request("r")
    (run,) = m.schedule("r", 100).fresh
    m.commit("r")
    step = m.schedule("r", 1, 1)
    assert step.read == run and step.writes == ((101, run),)
    c = m.commit("r", 1)
    assert m.table("r") == step.drafts and m.spec_blocks("r") == (run,)
    assert c.boundary_states == () and c.retired == Released()


def test_fork_shares_complete_states_and_copies_the_running_one():
    m = manager("all")
    m.add_request("p")
    m.schedule("p", 6)
    m.commit("p")
    a, b = m.table("p")
    f = m.fork("p", "c")
    ((src, dst),) = f.copies
    assert src == b and m.table("c") == (a, dst)
    assert m.pool.refcount(a) == 2 and m.pool.refcount(b) == 1
    m.free("p")
    assert m.pool.refcount(a) == 1
    m.free("c")
    assert m.pool.num_free == m.pool.capacity


def test_fork_at_a_boundary_shares_without_copies():
    m = manager("align")
    m.add_request("p")
    m.schedule("p", 8)
    m.commit("p")
    assert m.fork("p", "c").copies == ()
    assert m.table("c") == m.table("p") and m.pool.refcount(m.table("p")[1]) == 2
    m.schedule("c", 1)
    assert m.commit("c").retired.shared == (m.table("p")[1],)


def test_commit_refuses_blocks_that_were_never_zeroed():
    m = manager(check=True)
    m.add_request("r")
    step = m.schedule("r", 3)
    with pytest.raises(StateCacheError, match=r"never zeroed \(zero_fresh_blocks\)"):
        m.commit("r")
    assert m.in_flight("r") == (step,)  # nothing changed
    m.pool.mark_initialised(step.fresh)
    m.commit("r")
    f = m.fork("r", "c")  # not aligned: the running state is copied
    m.schedule("c", 1)
    with pytest.raises(StateCacheError, match=r"copied into \(fork\)"):
        m.commit("c")
    m.pool.mark_initialised([d for _, d in f.copies])
    m.commit("c")


def test_step_arguments_are_checked_before_anything_changes():
    m = manager(blocks=3, spec=2)
    m.add_request("r")
    with pytest.raises(ValueError, match="num_drafts=3 exceeds num_speculative_tokens=2"):
        m.schedule("r", 1, 3)
    with pytest.raises(ValueError, match="num_tokens=0 must be >= 1"):
        m.schedule("r", 0)
    with pytest.raises(OutOfStateBlocks, match=r"3 block\(s\) needed, 2 free"):
        m.schedule("r", 1, 2)  # a running block and two draft blocks
    assert m.table("r") == () and m.spec_blocks("r") == () and m.pool.num_free == 2
    m.schedule("r", 1, 1)
    with pytest.raises(StateCacheError, match="must be committed before the next one"):
        m.schedule("r", 1)
    with pytest.raises(ValueError, match="accepted=2 exceeds the step's 1 drafts"):
        m.commit("r", 2)
    with pytest.raises(StateCacheError, match="already exists"):
        m.add_request("r")
    with pytest.raises(ValueError, match="mode='ring' is not a cache mode"):
        manager("ring")


def test_package_import_is_light():
    code = (
        "import sys, json, plugin_api.state_cache, plugin_api.state_cache.replay;"
        "print(json.dumps('torch' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) is False

"""The manager's reports carried out on real state tensors through the host ops (reference
backend), with a toy recurrence whose state after ``p`` tokens is exactly ``p``: a block that
was not zeroed, or a wrong copy, shows up as a wrong number."""

from __future__ import annotations

import pytest
import torch

from plugin_api.backend import backend_for
from plugin_api.contract.provenance import record_ops
from plugin_api.state_cache import BlockPool, PrefixCache, StateCacheError, StateCacheManager
from plugin_api.state_cache.tensors import copy_fork_blocks, zero_fresh_blocks

BLOCKS = 10


@pytest.fixture(scope="module")
def reference():
    return backend_for("reference")


def garbage_states() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)  # what earlier owners left behind
    return [
        torch.randn(BLOCKS, 3, 2, generator=g) + 50,
        (torch.randn(BLOCKS, 4, generator=g) + 50).to(torch.bfloat16),
    ]


def forward(states, step, accepted: int) -> None:
    """h(p) = h(start) + (p - start): every written state is its token count; rejected drafts
    get a wrong value."""
    h = states[0][step.read].clone()
    assert torch.equal(h, torch.full_like(h, float(step.start))), "read a wrong state"
    for n, b in step.writes:
        for t in states:
            t[b] = n
    for j, b in enumerate(step.drafts):
        p = step.end + j + 1
        for t in states:
            t[b] = p if j < accepted else -p


def run(m, states, req, n, drafts=0, accepted=0, *, zero=True, backend=None):
    step = m.schedule(req, n, drafts)
    if zero:
        zero_fresh_blocks(m.pool, states, step.fresh, backend=backend)
    forward(states, step, accepted)
    return m.commit(req, accepted)


def test_reused_blocks_are_zeroed_through_the_host_op(reference):
    states = garbage_states()
    pool = BlockPool(BLOCKS)
    m = StateCacheManager(pool, block_size=4, mode="align", num_speculative_tokens=2)
    m.add_request("a")
    with record_ops() as calls:
        run(m, states, "a", 6, backend=reference)
    assert [c.impl for c in calls] == ["reference"] and not calls[0].fallback
    run(m, states, "a", 1, drafts=2, accepted=1, backend=reference)
    run(m, states, "a", 1, drafts=2, accepted=2, backend=reference)
    held = set(m.table("a")) | set(m.spec_blocks("a"))
    m.free("a")
    m.add_request("b")  # gets a's blocks back, full of a's states
    step = m.schedule("b", 5)
    assert set(step.fresh) & held
    before = [t.clone() for t in states]
    zero_fresh_blocks(pool, states, step.fresh, backend=reference)
    for t, b in zip(states, before, strict=True):
        expect = b.clone()
        expect[list(step.fresh)] = 0
        assert torch.equal(t, expect)  # the fresh blocks and nothing else
    forward(states, step, 0)
    m.commit("b")


def test_a_skipped_zeroing_is_caught(reference):
    states = garbage_states()
    m = StateCacheManager(BlockPool(BLOCKS), block_size=4, mode="align")
    m.add_request("a")
    step = m.schedule("a", 3)
    with pytest.raises(AssertionError, match="read a wrong state"):
        forward(states, step, 0)  # what the forward would have seen: garbage
    with pytest.raises(StateCacheError, match="never zeroed"):
        m.commit("a")


def test_fork_copy_and_prefix_hit_resume_the_right_state(reference):
    states = garbage_states()
    pool = BlockPool(BLOCKS)
    m = StateCacheManager(pool, block_size=4, mode="align", num_speculative_tokens=1)
    cache = PrefixCache(pool, block_size=4, capacity=2)
    m.add_request("p")
    for n, b in run(m, states, "p", 8, backend=reference).boundary_states:
        cache.insert(("sys", n), n, b)
    run(m, states, "p", 3, backend=reference)
    f = m.fork("p", "c")  # 11 tokens: the running state is copied
    assert len(f.copies) == 1
    copy_fork_blocks(pool, states, f.copies, backend=reference)
    run(m, states, "c", 1, drafts=1, accepted=1, backend=reference)
    run(m, states, "p", 2, backend=reference)
    assert m.computed("c") == 13 and m.computed("p") == 13
    m.free("p")
    m.free("c")
    hit = cache.lookup([("sys", 4), ("sys", 8)], "align")
    assert hit is not None and hit.num_tokens == 8
    m.add_request("q", hit)
    run(m, states, "q", 2, backend=reference)  # reads the cached state after 8 tokens
    m.free("q")
    cache.clear()
    assert pool.num_free == pool.capacity

"""Conformance: state-block copies and zeroing touch exactly the named blocks, including the
blocks the host's state-cache manager hands out again for zeroing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from plugin_api.contract import OpFamily
from plugin_api.contract.provenance import record_ops
from plugin_api.ops.state import StateSpec, copy_state_blocks, zero_state_blocks
from plugin_api.state_cache import BlockPool, StateCacheManager
from plugin_api.state_cache.tensors import zero_fresh_blocks

from .plugin import own_or_skip

if TYPE_CHECKING:
    from plugin_api.backend import Backend

# A small Mamba2-like group: conv state [conv_dim, d_conv - 1], SSM state [heads, head_dim, N].
SHAPES = [((40, 3), (4, 8, 16))]


def _states(
    device: torch.device, dtypes: tuple[torch.dtype, ...], blocks: int = 12, seed: int = 0
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn((blocks, *shape), generator=g).to(dt).to(device)
        for shape, dt in zip(SHAPES[0], dtypes, strict=True)
    ]


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float16),
        (torch.float32, torch.float32),
    ],
    ids=["bf16+fp32", "fp16", "fp32"],
)
def test_copy_blocks(
    plugin_api_backend: Backend, kit_device: torch.device, dtypes: tuple[torch.dtype, torch.dtype]
) -> None:
    states = _states(kit_device, dtypes)
    own_or_skip(
        plugin_api_backend, OpFamily.STATE, StateSpec(tuple(t.shape[1:] for t in states), dtypes)
    )
    before = [t.clone() for t in states]
    src, dst = torch.tensor([0, 3, 7]), torch.tensor([5, 1, 11])
    with record_ops() as calls:
        copy_state_blocks(states, src, dst, backend=plugin_api_backend)
    assert len(calls) == 1 and not calls[0].fallback
    for t, b in zip(states, before, strict=True):
        expect = b.clone()
        for s, d in zip(src.tolist(), dst.tolist(), strict=True):
            expect[d] = b[s]
        assert torch.equal(t, expect)


def test_zero_blocks(plugin_api_backend: Backend, kit_device: torch.device) -> None:
    dtypes = (torch.bfloat16, torch.float32)
    states = _states(kit_device, dtypes, seed=1)
    own_or_skip(
        plugin_api_backend, OpFamily.STATE, StateSpec(tuple(t.shape[1:] for t in states), dtypes)
    )
    before = [t.clone() for t in states]
    zero_state_blocks(states, torch.tensor([2, 9]), backend=plugin_api_backend)
    for t, b in zip(states, before, strict=True):
        expect = b.clone()
        expect[[2, 9]] = 0
        assert torch.equal(t, expect)


def test_reallocated_state_blocks_are_zeroed(
    plugin_api_backend: Backend, kit_device: torch.device
) -> None:
    """Who zeroes: the caller, through ``zero_fresh_blocks`` and this backend's kernel. Blocks
    a finished request filled come back from the pool for the next one; after zeroing they
    read zero, every other block is unchanged, and the manager accepts the step."""
    dtypes = (torch.bfloat16, torch.float32)
    states = _states(kit_device, dtypes, blocks=8, seed=2)
    own_or_skip(
        plugin_api_backend, OpFamily.STATE, StateSpec(tuple(t.shape[1:] for t in states), dtypes)
    )
    pool = BlockPool(8)
    m = StateCacheManager(pool, block_size=4, mode="align", num_speculative_tokens=2)
    m.add_request("a")
    for tokens, drafts in ((4, 0), (3, 0), (1, 2)):
        step = m.schedule("a", tokens, drafts)
        zero_fresh_blocks(pool, states, step.fresh, backend=plugin_api_backend)
        written = [b for _, b in step.writes] + list(step.drafts)
        for t in states:  # the forward leaves non-zero states behind
            t[written] = torch.randn((len(written), *t.shape[1:])).to(t.dtype).to(kit_device) + 3
        m.commit("a", drafts)
    held = set(m.table("a")) | set(m.spec_blocks("a"))
    m.free("a")
    m.add_request("b")
    step = m.schedule("b", 1, 0)
    assert set(step.fresh) <= held - {0}  # reused, not fresh memory
    before = [t.clone() for t in states]
    with record_ops() as calls:
        zero_fresh_blocks(pool, states, step.fresh, backend=plugin_api_backend)
    assert len(calls) == 1 and not calls[0].fallback
    for t, b in zip(states, before, strict=True):
        expect = b.clone()
        expect[list(step.fresh)] = 0
        assert torch.equal(t, expect)
    m.commit("b")

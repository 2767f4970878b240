"""The Triton state-block copy through the host ops: exactly the named blocks change."""

from __future__ import annotations

import pytest
import torch

from plugin_api.contract.decision import ImplPath
from plugin_api.contract.provenance import record_ops
from plugin_api.ops.state import copy_state_blocks, zero_state_blocks

# A Mamba2-like group, plus a block larger than any launch table's tile (several programs).
SHAPES = ((40, 3), (4, 8, 16), (3, 3000))


def _states(device, dtypes, blocks=9):
    g = torch.Generator().manual_seed(0)
    states = [
        torch.randn((blocks, *shape), generator=g).to(dt)
        for shape, dt in zip(SHAPES, dtypes, strict=True)
    ]
    raw = states[0].view(torch.int16 if states[0].element_size() == 2 else torch.int32)
    raw[3, 0, 0] = -1  # a NaN with a payload: the copy moves bits, not values
    return [t.to(device) for t in states]


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.bfloat16, torch.float32, torch.float16),
        (torch.float32, torch.float32, torch.float32),
    ],
    ids=["bf16+fp32+fp16", "fp32"],
)
def test_copy_blocks(triton_backend, triton_device, dtypes):
    states = _states(triton_device, dtypes)
    before = [t.cpu().clone() for t in states]
    src, dst = torch.tensor([0, 3, 7]), torch.tensor([5, 1, 8])
    with record_ops() as calls:
        copy_state_blocks(states, src, dst, backend=triton_backend)
    assert [(c.path, c.fallback) for c in calls] == [(ImplPath.TRITON, False)]
    for t, b in zip(states, before, strict=True):
        expect = b.clone()
        expect[dst] = b[src]
        assert torch.equal(t.cpu().view(torch.uint8), expect.view(torch.uint8))


def test_zero_blocks(triton_backend, triton_device):
    states = _states(triton_device, (torch.bfloat16, torch.float32, torch.float16))
    before = [t.cpu().clone() for t in states]
    with record_ops() as calls:
        zero_state_blocks(states, torch.tensor([2, 8]), backend=triton_backend)
    assert [(c.path, c.fallback) for c in calls] == [(ImplPath.TRITON, False)]
    for t, b in zip(states, before, strict=True):
        expect = b.clone()
        expect[[2, 8]] = 0
        assert torch.equal(t.cpu().view(torch.uint8), expect.view(torch.uint8))

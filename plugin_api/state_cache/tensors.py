"""Carry out on the state tensors what the manager reports: zero fresh blocks, copy forks.

The only module of the package that touches tensors. Both run the host ops (so the selected
backend's kernels, with provenance) and then tell the pool the blocks are initialised, which
``StateCacheManager.commit`` checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..ops.state import copy_state_blocks, zero_state_blocks
from .pool import BlockPool

if TYPE_CHECKING:
    from ..backend import Backend


def zero_fresh_blocks(
    pool: BlockPool,
    states: Sequence[torch.Tensor],
    blocks: Sequence[int],
    *,
    backend: Backend | None = None,
) -> None:
    """Zero ``blocks`` (a step's ``StepBlocks.fresh``) in every ``[num_blocks, ...]`` state
    tensor of the group, before the step's forward."""
    if not blocks:
        return
    zero_state_blocks(states, torch.tensor(list(blocks), dtype=torch.int64), backend=backend)
    pool.mark_initialised(blocks)


def copy_fork_blocks(
    pool: BlockPool,
    states: Sequence[torch.Tensor],
    copies: Sequence[tuple[int, int]],
    *,
    backend: Backend | None = None,
) -> None:
    """Run a fork's ``(src, dst)`` copies (``Fork.copies``) before the child's first step."""
    if not copies:
        return
    src = torch.tensor([s for s, _ in copies], dtype=torch.int64)
    dst = torch.tensor([d for _, d in copies], dtype=torch.int64)
    copy_state_blocks(states, src, dst, backend=backend)
    pool.mark_initialised([d for _, d in copies])

"""Triton kernel: copy or zero whole blocks of a state tensor ``[num_blocks, *per_block]``.

The data moves as raw bits (the tensor is viewed as an integer type of the same width), so the
copy is exact for every dtype, NaN payloads included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import table_for

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def _block_copy_kernel(
    t_ptr: tl.tensor,
    src_ptr: tl.tensor,
    dst_ptr: tl.tensor,
    block_elems: tl.tensor,
    ZERO: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    i = tl.program_id(0)
    chunk = tl.program_id(1).to(tl.int64) * BLOCK
    offs = chunk + tl.arange(0, BLOCK)
    mask = offs < block_elems
    dst = tl.load(dst_ptr + i).to(tl.int64) * block_elems
    if ZERO:
        value = tl.zeros([BLOCK], dtype=t_ptr.dtype.element_ty)
    else:
        src = tl.load(src_ptr + i).to(tl.int64) * block_elems
        value = tl.load(t_ptr + src + offs, mask=mask)
    tl.store(t_ptr + dst + offs, value, mask=mask)


def _launch(t: torch.Tensor, src: torch.Tensor | None, dst: torch.Tensor) -> None:
    cfg = table_for(t.device).copy
    raw = t.view(_BITS[t.element_size()])
    elems = raw[0].numel()
    grid = (dst.numel(), triton.cdiv(elems, cfg.block))
    _block_copy_kernel[grid](
        raw,
        dst if src is None else src,
        dst,
        elems,
        ZERO=src is None,
        BLOCK=cfg.block,
        num_warps=cfg.num_warps,
    )


def copy_blocks(states: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """``t[dst[i]] = t[src[i]]`` for every contiguous ``t`` in ``states``; ``src``/``dst`` int64
    on the states' device, validated by the host (in range, no overlap, no repeats)."""
    for t in states:
        _launch(t, src, dst)


def zero_blocks(states: list[torch.Tensor], ids: torch.Tensor) -> None:
    """``t[ids[i]] = 0`` for every contiguous ``t`` in ``states``; ``ids`` int64, validated."""
    for t in states:
        _launch(t, None, ids)

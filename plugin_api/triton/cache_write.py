"""Triton kernel: write this step's K/V into the paged cache at their slots.

Cache layout ``[num_blocks, 2, num_kv_heads, block_size, head_size]`` (index 1: K=0, V=1); token
``t`` goes to ``slot_mapping[t] = block * block_size + offset``, and slot -1 (padding) writes
nothing. An fp8 cache stores ``cast_rne(clamp(k / k_scale, -448, 448))`` with an IEEE division
and the exact fp8 rounding of ``numerics``, so the bits equal the reference's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import table_for
from .numerics import fp8e4m3_bits


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def _to_cache(x: tl.tensor, scale: tl.tensor, FP8: tl.constexpr) -> tl.tensor:
    if FP8:  # one return per branch (see quant._quantize)
        y = tl.math.div_rn(x.to(tl.float32), scale)
        return fp8e4m3_bits(tl.minimum(tl.maximum(y, -448.0), 448.0)).to(tl.uint8)
    else:
        return x


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def _cache_write_kernel(
    k_ptr: tl.tensor,
    v_ptr: tl.tensor,
    cache_ptr: tl.tensor,
    slot_ptr: tl.tensor,
    num_slots: tl.tensor,
    stride_kt: tl.tensor,
    stride_kh: tl.tensor,
    stride_vt: tl.tensor,
    stride_vh: tl.tensor,
    stride_cb: tl.tensor,
    stride_ckv: tl.tensor,
    stride_ch: tl.tensor,
    stride_cs: tl.tensor,
    k_scale: tl.tensor,
    v_scale: tl.tensor,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,
) -> None:
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slot_ptr + t, mask=t < num_slots, other=-1)
    keep = slot >= 0  # -1: a padding token, write nothing (and read nothing)
    slot = tl.maximum(slot, 0)
    dst_tok = (slot // PAGE) * stride_cb + (slot % PAGE) * stride_cs
    h = tl.arange(0, BLOCK_H)[None, :, None]
    d = tl.arange(0, BLOCK_D)[None, None, :]
    mask = keep[:, None, None] & (h < NUM_KV_HEADS) & (d < HEAD_SIZE)
    dst = cache_ptr + dst_tok[:, None, None] + h * stride_ch + d
    row = t[:, None, None]
    k = tl.load(k_ptr + row * stride_kt + h * stride_kh + d, mask=mask)
    tl.store(dst, _to_cache(k, k_scale, FP8), mask=mask)
    v = tl.load(v_ptr + row * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(dst + stride_ckv, _to_cache(v, v_scale, FP8), mask=mask)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    cache: torch.Tensor,
    slots: torch.Tensor,
    k_scale: float,
    v_scale: float,
) -> None:
    """Store ``key``/``value`` ``[>= len(slots), num_kv_heads, head_size]`` (last dim
    contiguous) into ``cache`` (contiguous, the layout above) at int64 ``slots`` (-1: skip).

    Rows of ``key``/``value`` whose slot is -1 are never read, so padding rows past the batch
    are safe. The caller has validated every argument.
    """
    _, _, kv_heads, page, head_size = cache.shape
    fp8 = cache.dtype == torch.float8_e4m3fn
    data = cache.view(torch.uint8) if fp8 else cache
    cfg = table_for(cache.device).copy
    n = slots.numel()
    if n == 0:
        return
    _cache_write_kernel[(triton.cdiv(n, cfg.write_tokens),)](
        key,
        value,
        data,
        slots,
        n,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *data.stride()[:4],
        k_scale,
        v_scale,
        NUM_KV_HEADS=kv_heads,
        HEAD_SIZE=head_size,
        PAGE=page,
        BLOCK_T=cfg.write_tokens,
        BLOCK_H=triton.next_power_of_2(kv_heads),
        BLOCK_D=triton.next_power_of_2(head_size),
        FP8=fp8,
        num_warps=cfg.num_warps,
    )

"""Triton kernel: per-token-group quantization to int8 or fp8 e4m3, bit-exact with docs/ops.md.

Per row and group: ``a = max(max|x|, eps)`` in fp32, ``s = a / qmax`` (rounded up to a power of
two for ue8m0), ``q = x / s`` clamped and rounded. Both divisions are ``tl.math.div_rn`` (IEEE
round-to-nearest; a plain ``/`` may lower to an approximate division). Rounding (int8 half to
even, the fp8 e4m3 RNE cast after clamping to +-448) is exact integer/fp32 arithmetic from
``numerics``, identical on every backend.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import table_for
from .numerics import fp8e4m3_bits, pow2_ceil, round_half_even


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def _quantize(x: tl.tensor, s: tl.tensor, INT8: tl.constexpr, QMAX: tl.constexpr) -> tl.tensor:
    """int8 values, or fp8 e4m3 bit patterns (stored through a uint8 view). A NaN quotient (a
    NaN's group, or inf / inf) gets int8 0 or fp8 NaN with its sign, as torch's casts give; the
    clamp alone would not say (a GPU's max drops a NaN, the interpreter's keeps it)."""
    y = tl.math.div_rn(x, s)
    nan = y != y
    # One return per branch: compiled Triton visits the statements after a constexpr `if` that
    # returns and then rejects the two return types (the interpreter never noticed).
    if INT8:
        # clamp and rounding commute here: the bounds are integers
        q = round_half_even(tl.minimum(tl.maximum(y, -128.0), 127.0))
        return tl.where(nan, 0.0, q).to(tl.int8)
    else:
        code = fp8e4m3_bits(tl.minimum(tl.maximum(y, -QMAX), QMAX))
        nan_code = ((y.to(tl.int32, bitcast=True) >> 24) & 0x80) | 0x7F
        return tl.where(nan, nan_code, code).to(tl.uint8)


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def _scale(
    a: tl.tensor, nans: tl.tensor, eps: tl.tensor, QMAX: tl.constexpr, UE8M0: tl.constexpr
) -> tl.tensor:
    """``s`` from the group's abs-max ``a`` (NaN-free) and its count of NaNs: a NaN makes ``a``
    NaN, as torch's amax does; ue8m0 turns a non-finite ``s`` into 1.0, as frexp/ldexp do."""
    a = tl.where(nans > 0, float("nan"), tl.maximum(a, eps))
    s = tl.math.div_rn(a, QMAX)
    if UE8M0:
        finite = (s.to(tl.int32, bitcast=True) & 0x7F800000) != 0x7F800000
        s = tl.where(finite, pow2_ceil(s), 1.0)
    return s


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def _group_quant_kernel(
    x_ptr: tl.tensor,
    q_ptr: tl.tensor,
    s_ptr: tl.tensor,
    K: tl.tensor,
    group_size: tl.tensor,
    stride_sm: tl.tensor,
    stride_sg: tl.tensor,
    eps: tl.tensor,
    QMAX: tl.constexpr,
    INT8: tl.constexpr,
    UE8M0: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE: tl.constexpr,
) -> None:
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    base = row * K + g * group_size
    offs = tl.arange(0, BLOCK)
    if SINGLE:  # the whole group in one tile: read x once
        mask = offs < group_size
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        ax = tl.where(x != x, 0.0, tl.abs(x))
        nans = tl.sum((x != x).to(tl.int32), axis=0)
        s = _scale(tl.max(ax, axis=0), nans, eps, QMAX, UE8M0)
        tl.store(q_ptr + base + offs, _quantize(x, s, INT8, QMAX), mask=mask)
    else:  # two passes over the group: max, then quantize
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        nans = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(0, group_size, BLOCK):
            mask = start + offs < group_size
            x = tl.load(x_ptr + base + start + offs, mask=mask, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.where(x != x, 0.0, tl.abs(x)))
            nans += (x != x).to(tl.int32)
        s = _scale(tl.max(amax, axis=0), tl.sum(nans, axis=0), eps, QMAX, UE8M0)
        for start in range(0, group_size, BLOCK):
            mask = start + offs < group_size
            x = tl.load(x_ptr + base + start + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(q_ptr + base + start + offs, _quantize(x, s, INT8, QMAX), mask=mask)
    tl.store(s_ptr + row * stride_sm + g * stride_sg, s)


def group_quant(
    x: torch.Tensor,
    group_size: int,
    eps: float,
    scale_ue8m0: bool,
    out_q: torch.Tensor,
    out_scales: torch.Tensor,
) -> None:
    """Quantize ``x`` ``[M, K]`` (bf16/fp16/fp32, contiguous) into ``out_q`` ``[M, K]``
    (int8 or ``float8_e4m3fn``, contiguous) and ``out_scales`` fp32 ``[M, K // group_size]``
    (any strides: row- or column-major). The caller has validated every argument."""
    m, k = x.shape
    cfg = table_for(x.device).quant
    block = max(16, min(triton.next_power_of_2(group_size), cfg.max_block))
    int8 = out_q.dtype == torch.int8
    grid = (m, k // group_size)
    _group_quant_kernel[grid](
        x,
        out_q if int8 else out_q.view(torch.uint8),
        out_scales,
        k,
        group_size,
        out_scales.stride(0),
        out_scales.stride(1),
        eps,
        QMAX=127.0 if int8 else 448.0,
        INT8=int8,
        UE8M0=scale_ue8m0,
        BLOCK=block,
        SINGLE=group_size <= block,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )

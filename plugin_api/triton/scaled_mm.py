"""Triton kernel: int8 W8A8 ``scaled_mm`` in one launch, bit-exact with the reference.

``out[m, n] = cast(((acc[m, n] as fp32) * x_scale[m]) * w_scale[n] (+ bias[n] as fp32))`` where
``acc = x_q @ w_q^T`` is summed in int32 (exact; the implementation bounds K so that it cannot
overflow). Each fp32 operation rounds on its own, in the reference's order, and the output
dtype is reached by one round-to-nearest-even cast. The launch asks the compiler for no fused
multiply-add (``enable_fp_fusion=False``): an FMA of ``t * w_scale + bias`` rounds once where
the reference rounds twice. bf16 output is rounded by integer arithmetic (``_to_bf16``), the
same on every backend: the 3.9 interpreter's fp32 -> bf16 cast truncates.

The kernel writes only the ``[M, N]`` block of ``out`` (masked edges: any N and K), allocates
nothing and reads nothing back to the host, so a CUDA graph can capture it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import table_for

# Compiler options of every launch: no fused multiply-add, so each fp32 step rounds on its own
COMPILE_OPTIONS = {"enable_fp_fusion": False}


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def _to_bf16(y: tl.tensor) -> tl.tensor:
    """fp32 ``y`` rounded to bf16, nearest even, by integer arithmetic on its bits (a carry
    moves into the exponent; overflow gives inf); NaN gives 0x7FC0, torch's quiet NaN."""
    bits = y.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return tl.where(y != y, 0x7FC0, rounded).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def _scaled_mm_kernel(
    x_ptr: tl.tensor,
    w_ptr: tl.tensor,
    xs_ptr: tl.tensor,
    ws_ptr: tl.tensor,
    bias_ptr: tl.tensor,
    out_ptr: tl.tensor,
    M: tl.tensor,
    N: tl.tensor,
    K: tl.tensor,
    stride_xm: tl.tensor,
    stride_wn: tl.tensor,
    stride_xs: tl.tensor,
    stride_om: tl.tensor,
    HAS_BIAS: tl.constexpr,
    OUT_BF16: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
) -> None:
    # axis 0 walks M: the programs that share one weight tile run side by side
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_tile = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]  # [BLOCK_M, BLOCK_K]
    w_tile = w_ptr + rn.to(tl.int64)[None, :] * stride_wn + rk[:, None]  # [BLOCK_K, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_tile, mask=m_ok[:, None], other=0)
            b = tl.load(w_tile, mask=n_ok[None, :], other=0)
        else:
            k_ok = k0 + rk < K
            a = tl.load(x_tile, mask=m_ok[:, None] & k_ok[None, :], other=0)
            b = tl.load(w_tile, mask=k_ok[:, None] & n_ok[None, :], other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        x_tile += BLOCK_K
        w_tile += BLOCK_K
    sx = tl.load(xs_ptr + rm * stride_xs, mask=m_ok, other=0.0)
    sw = tl.load(ws_ptr + rn, mask=n_ok, other=0.0)
    y = acc.to(tl.float32) * sx[:, None]
    y = y * sw[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
    out = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
    value = _to_bf16(y) if OUT_BF16 else y.to(out_ptr.dtype.element_ty)
    tl.store(out, value, mask=m_ok[:, None] & n_ok[None, :])


def scaled_mm(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """``out = (x_q @ weight^T) * x_scale[:, None] * weight_scale[None, :] (+ bias)``.

    - ``x_q`` int8 ``[M, K]``, last dim contiguous (any row stride);
    - ``x_scale`` fp32 ``[M]`` (any stride): per token;
    - ``weight`` int8 ``[N, K]``, last dim contiguous; ``weight_scale`` fp32 ``[N]`` contiguous;
    - ``bias`` ``[N]`` contiguous, fp32 or ``out``'s dtype, or None;
    - ``out`` bf16/fp16/fp32 ``[M, N]``, last dim contiguous (any row stride): written in place.

    All on one device; the caller has validated every argument (``plugin_api.ops.gemm``).
    """
    m, k = x_q.shape
    n = weight.shape[0]
    if m == 0:
        return
    tile = table_for(x_q.device).scaled_mm.tile_for(m)
    grid = (triton.cdiv(m, tile.block_m), triton.cdiv(n, tile.block_n))
    _scaled_mm_kernel[grid](
        x_q,
        weight,
        x_scale,
        weight_scale,
        weight_scale if bias is None else bias,  # unread without bias
        out,
        m,
        n,
        k,
        x_q.stride(0),
        weight.stride(0),
        x_scale.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        OUT_BF16=out.dtype == torch.bfloat16,
        EVEN_K=k % tile.block_k == 0,
        BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        **COMPILE_OPTIONS,
    )

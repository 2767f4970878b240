"""Baselines: what plain torch does for the same problem, timed in the same run.

Each is a callable over tensors prepared once; what it includes is in its ``description``,
which every report repeats. A backend's ratio to a baseline is ``t_baseline / t_backend``
(above 1: the backend is faster).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..gpu.torch_gemm import INT_MM_MIN_M


@dataclass(frozen=True, slots=True)
class Baseline:
    name: str
    description: str
    fn: Callable[[], object]


def linear_bf16(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> Baseline:
    """``F.linear`` on bf16 ``x[M, K]`` and ``w[N, K]``; ``.float()`` after it for fp32 output."""
    if out_dtype == torch.float32:
        return Baseline(
            "linear_bf16",
            "F.linear(x, w) in bf16, then .float()",
            lambda: F.linear(x, w).float(),
        )
    return Baseline("linear_bf16", "F.linear(x, w) in bf16", lambda: F.linear(x, w))


def upcast_fp32(x: torch.Tensor, w32: torch.Tensor, out: torch.Tensor) -> Baseline:
    """``x.float() @ w32.T`` with ``w32`` the weight upcast once (not timed), into ``out``."""
    if out.dtype == torch.float32:
        return Baseline(
            "upcast_fp32",
            "x.float() @ w.float().T, weight upcast once outside the timing",
            lambda: torch.mm(x.float(), w32.t(), out=out),
        )
    acc = torch.empty(out.shape, dtype=torch.float32, device=out.device)

    def run() -> None:
        torch.mm(x.float(), w32.t(), out=acc)
        out.copy_(acc)

    return Baseline(
        "upcast_fp32",
        f"x.float() @ w.float().T, weight upcast once outside the timing, cast to {out.dtype}",
        run,
    )


def upcast_per_call(x: torch.Tensor, w: torch.Tensor) -> Baseline:
    """fp32 logits with no fp32 kernel and no fp32 copy of the weight kept:
    ``F.linear(x.float(), w.float())``, the weight upcast in every call."""
    return Baseline(
        "upcast_per_call",
        "F.linear(x.float(), w.float()), the weight upcast in every call",
        lambda: F.linear(x.float(), w.float()),
    )


def scaled_upcast_fp32(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w32: torch.Tensor,
    w_scale: torch.Tensor,
    out: torch.Tensor,
) -> Baseline:
    """The scaled_mm formula in fp32 eager torch: ``(x_q.float() @ w32.T) * s_x * s_w``."""
    acc = torch.empty(out.shape, dtype=torch.float32, device=out.device)
    sx, sw = x_scale.view(-1, 1), w_scale.view(1, -1)

    def run() -> None:
        torch.mm(x_q.float(), w32.t(), out=acc)
        acc.mul_(sx).mul_(sw)
        out.copy_(acc)

    return Baseline(
        "upcast_fp32",
        "(x_q.float() @ w_q.float().T) * s_x * s_w in fp32, weight upcast once outside the timing",
        run,
    )


def int_mm_scaled(
    quant: Callable[[torch.Tensor, torch.Tensor], object],
    m: int,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    out: torch.Tensor,
) -> Baseline:
    """torch's int8 path for the whole W8A8 layer: ``quant(x_q, x_scale)`` (the backend's
    per-token quant, into the first ``m`` rows of a zero-padded buffer), ``torch._int_mm`` into
    a preallocated int32 buffer, then ``* s_x * s_w`` in fp32 and the cast into ``out``."""
    k, n, device = w_q.shape[1], w_q.shape[0], out.device
    rows = max(m, INT_MM_MIN_M)  # _int_mm's row minimum on CUDA; the padding rows stay zero
    x_pad = torch.zeros((rows, k), dtype=torch.int8, device=device)
    x_scale = torch.empty((m, 1), dtype=torch.float32, device=device)
    acc = torch.empty((rows, n), dtype=torch.int32, device=device)
    y = torch.empty((m, n), dtype=torch.float32, device=device)
    w_t, sw = w_q.t(), w_scale.view(1, -1)

    def run() -> None:
        quant(x_pad[:m], x_scale)
        torch._int_mm(x_pad, w_t, out=acc)
        torch.mul(acc[:m], x_scale, out=y)
        y.mul_(sw)
        out.copy_(y)

    return Baseline(
        "int_mm",
        f"the same per-token quant, then torch._int_mm (rows zero-padded to {INT_MM_MIN_M}, "
        "int32 into a preallocated buffer) and * s_x * s_w in fp32, cast to the output dtype: "
        "torch's int8 path with no allocation per call",
        run,
    )


def quant_eager(
    x: torch.Tensor,
    group: int,
    dtype: torch.dtype,
    eps: float,
    q_out: torch.Tensor,
    s_out: torch.Tensor,
) -> Baseline:
    """The per-token-group formula as a user would write it in eager torch."""
    qmax = 127.0 if dtype == torch.int8 else 448.0

    def run() -> None:
        # torch's Tensor.unflatten (torch/_tensor.py) carries no annotations
        g = x.float().unflatten(-1, (-1, group))  # type: ignore[no-untyped-call]
        s = g.abs().amax(dim=-1, keepdim=True).clamp_min(eps) / qmax
        y = g / s
        y = y.round().clamp(-128, 127) if dtype == torch.int8 else y.clamp(-qmax, qmax)
        q_out.copy_(y.flatten(-2))
        s_out.copy_(s.squeeze(-1))

    return Baseline(
        "eager",
        "eager torch formula: fp32 abs-max per group, divide, round/clamp, cast",
        run,
    )


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal_offset: int | None
) -> Baseline:
    """``F.scaled_dot_product_attention`` on contiguous ``q[B, H, n, d]``, ``k/v[B, KH, L, d]``
    (GQA). ``causal_offset``: None for a single query row; else ``L - n``, the position of the
    first query (a bottom-right causal mask; with 0 it is SDPA's own ``is_causal``)."""
    n, length = q.shape[2], k.shape[2]
    mask = None
    causal = causal_offset == 0
    if causal_offset:
        pos = torch.arange(causal_offset, causal_offset + n, device=q.device)
        mask = torch.arange(length, device=q.device).unsqueeze(0) <= pos.unsqueeze(1)
    return Baseline(
        "sdpa",
        "F.scaled_dot_product_attention on contiguous K/V of the same size (no paging, no cache "
        "write; allocates its output)",
        lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
        ),
    )

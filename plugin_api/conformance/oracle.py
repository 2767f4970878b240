"""Independent oracles for the kit: the op semantics computed a second, simpler way.

Nothing here shares code with the reference backend, so the kit is not circular when it tests
the reference itself: attention is dense masked softmax over contiguous K/V per head, GEMM is
fp64, quantization is per element in Python floats.
"""

from __future__ import annotations

import math
import struct
from typing import TypedDict

import torch

FP8 = torch.float8_e4m3fn


class Tolerance(TypedDict):
    """The bounds a kit test passes to ``torch.testing.assert_close``."""

    atol: float
    rtol: float


def fp8_roundtrip(x: torch.Tensor, scale: float) -> torch.Tensor:
    """What an fp8 cache holds for ``x``, read back as fp32."""
    return (x.float() / scale).clamp(-448.0, 448.0).to(FP8).float() * scale


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool = True,
    window: int | None = None,
    soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One sequence: ``q`` ``[n, H, D]`` (the last ``n`` positions), ``k``/``v`` ``[L, KH, D]``.

    Returns fp32 ``[n, H, D]``. Loops over heads and query rows; clarity over speed.
    """
    n, num_heads, d = q.shape
    length, kv_heads, _ = k.shape
    group = num_heads // kv_heads
    out = torch.zeros((n, num_heads, d), dtype=torch.float64)
    q64, k64, v64 = q.double(), k.double(), v.double()
    for h in range(num_heads):
        kh = h // group
        for i in range(n):
            pos = length - n + i
            keys = [
                j
                for j in range(length)
                if not causal or (j <= pos and (window is None or j > pos - window))
            ]
            logits = []
            for j in keys:
                z = float(q64[i, h] @ k64[j, kh]) * scale
                if soft_cap is not None:
                    z = soft_cap * math.tanh(z / soft_cap)
                logits.append(z)
            sink = float(sinks[h]) if sinks is not None else None
            m = max(logits + ([sink] if sink is not None else []), default=0.0)
            weights = [math.exp(z - m) for z in logits]
            denom = sum(weights) + (math.exp(sink - m) if sink is not None else 0.0)
            if denom == 0.0:
                continue
            for w, j in zip(weights, keys, strict=True):
                out[i, h] += (w / denom) * v64[j, kh]
    return out.float()


def gemm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w^T (+ bias)`` in fp64: exact for bf16/fp16 inputs at the sizes the kit uses."""
    y = x.double() @ w.double().t()
    if bias is not None:
        y = y + bias.double()
    return y


def scaled_gemm(
    xq: torch.Tensor,
    sx: torch.Tensor,
    wq: torch.Tensor,
    sw: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    acc = xq.long() @ wq.long().t()  # int64: exact
    y = acc.double() * sx.double().view(-1, 1) * sw.double().view(1, -1)
    if bias is not None:
        y = y + bias.double()
    return y


def _f32(v: float) -> float:
    """Round a Python float to the nearest fp32 value."""
    (rounded,) = struct.unpack("f", struct.pack("f", v))
    return float(rounded)


def _f32_div(a: float, b: float) -> float:
    # fp32 / fp32 correctly rounded: the exact double quotient of two fp32 values rounds to the
    # same fp32 as IEEE fp32 division (double has > 2*24+2 bits of precision).
    return _f32(a / b)


def _round_half_even(v: float) -> float:
    return float(round(v))  # Python's round() is half-to-even


def _pow2_ceil(s: float) -> float:
    m, e = math.frexp(s)
    return s if m == 0.5 else math.ldexp(1.0, e)


def group_quant_row(
    row: list[float], group_size: int, int8: bool, eps: float, ue8m0: bool
) -> tuple[list[float], list[float]]:
    """One row: quantized values (as floats) and scales, element by element."""
    qmax = 127.0 if int8 else 448.0
    values: list[float] = []
    scales: list[float] = []
    for g in range(0, len(row), group_size):
        group = row[g : g + group_size]
        mags = [abs(x) for x in group]
        # a NaN makes the group's amax NaN (Python's max would depend on where it sits)
        a = math.nan if any(map(math.isnan, mags)) else max(max(mags), _f32(eps))
        s = _f32_div(a, qmax)
        if ue8m0:
            s = _pow2_ceil(s)  # a NaN or inf s: frexp gives exponent 0, so 1.0
        scales.append(s)
        for x in group:
            y = _f32_div(x, s)
            if math.isnan(y):  # int8 0; fp8 NaN with y's sign, from the cast below
                values.append(0.0 if int8 else y)
            elif int8:  # clamp first (the bounds are integers, so it commutes): y may be inf
                values.append(_round_half_even(min(max(y, -128.0), 127.0)))
            else:
                values.append(min(max(y, -448.0), 448.0))
    return values, scales


def group_quant(
    x: torch.Tensor, group_size: int, dtype: torch.dtype, eps: float, ue8m0: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference values ``(q, scales)`` as ``(dtype [M, K], fp32 [M, G])``."""
    int8 = dtype == torch.int8
    qs, ss = [], []
    for row in x.float().tolist():
        q, s = group_quant_row(row, group_size, int8, eps, ue8m0)
        qs.append(q)
        ss.append(s)
    q_t = torch.tensor(qs, dtype=torch.float32)
    q_t = q_t.to(torch.int8) if int8 else q_t.to(FP8)  # fp8: the RNE cast is the definition
    return q_t, torch.tensor(ss, dtype=torch.float32)

"""Exact rounding helpers shared by the kernels (``@triton.jit`` device functions).

Each is integer or exact fp32 arithmetic, so the result is the same on every backend and in the
interpreter: no libdevice ``rint`` (its module differs per backend), and no reliance on a
backend's fp32 -> fp8 conversion (saturation and tie handling vary; the 3.9 interpreter's does
not carry a rounded-up mantissa into the exponent).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def round_half_even(y: tl.tensor) -> tl.tensor:
    """Nearest integer to fp32 ``y`` (|y| < 2^23), ties to even."""
    f = tl.floor(y)
    d = y - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def pow2_ceil(s: tl.tensor) -> tl.tensor:
    """Round positive fp32 ``s`` up to a power of two, exactly (subnormals included)."""
    bits = s.to(tl.int32, bitcast=True)
    normal = tl.where((bits & 0x7FFFFF) == 0, bits, ((bits >> 23) + 1) << 23)
    # A subnormal is mant * 2^-149: round mant (exact in fp32) up as a normal number; the
    # integer value of that power of two is then exactly the subnormal's bit pattern.
    mbits = (bits & 0x7FFFFF).to(tl.float32).to(tl.int32, bitcast=True)
    up = tl.where((mbits & 0x7FFFFF) == 0, mbits, ((mbits >> 23) + 1) << 23)
    sub = up.to(tl.float32, bitcast=True).to(tl.int32)
    return tl.where((bits >> 23) == 0, sub, normal).to(tl.float32, bitcast=True)


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def fp8e4m3_bits(y: tl.tensor) -> tl.tensor:
    """The ``float8_e4m3fn`` bit pattern (as int32) of fp32 ``y`` in [-448, 448], rounded to
    nearest even: what ``torch.Tensor.to(torch.float8_e4m3fn)`` stores."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    # normal range (|y| >= 2^-6): keep 3 of 23 mantissa bits, RNE; a carry bumps the exponent
    kept = (mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20
    normal = kept - (120 << 3)  # rebias the exponent: 127 -> 7
    # subnormal range: the value is m * 2^-9 with m = RNE(|y| * 2^9) in 0..8 (8 = 2^-6, normal)
    sub = round_half_even(tl.abs(y) * 512.0).to(tl.int32)
    return sign | tl.where(mag < (121 << 23), sub, normal)

"""GEMM: ``prepare`` a weight once, then ``mm`` (bf16/fp16/fp32) or ``scaled_mm`` (int8 W8A8).

``y = x @ W^T (+ bias)`` with fp32 accumulation. The LM head is bf16 x bf16 -> fp32: ask for it
with ``prepare(w, out_dtype=torch.float32, usage="lm_head")``; a backend must produce the fp32
accumulator itself, not an upcast of a rounded result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

from ..contract import OpFamily
from ..contract.decision import Decision, ImplPath
from ..contract.provenance import Provenance, note
from . import checks

if TYPE_CHECKING:
    from ..backend import Backend
    from ..device_info import DeviceInfo

Usage = Literal["linear", "lm_head"]
USAGES: tuple[Usage, ...] = ("linear", "lm_head")
FLOAT_DTYPES = frozenset({torch.bfloat16, torch.float16, torch.float32})
WEIGHT_DTYPES = FLOAT_DTYPES | {torch.int8}


@dataclass(frozen=True, slots=True)
class GemmSpec:
    """A weight's problem, fixed when it is prepared. ``weight_dtype`` int8 means scaled_mm."""

    n: int
    k: int
    weight_dtype: torch.dtype
    out_dtype: torch.dtype
    usage: Usage = "linear"

    @property
    def scaled(self) -> bool:
        return self.weight_dtype == torch.int8

    def describe(self) -> str:
        w, o = checks.short_dtype(self.weight_dtype), checks.short_dtype(self.out_dtype)
        return f"{self.usage} N={self.n} K={self.k} {w}->{o}"


@dataclass(frozen=True, slots=True)
class GemmProblem:
    """The full descriptor of one GEMM call: the key of every primitive cache.

    Implementations that build primitives key them by this whole object (every field), so a
    field cannot be forgotten in the key. ``m`` may be a band chosen by the implementation.
    """

    m: int
    n: int
    k: int
    a_dtype: torch.dtype
    b_dtype: torch.dtype
    c_dtype: torch.dtype
    bias_dtype: torch.dtype | None
    a_row_stride: int
    c_row_stride: int
    scaled: bool
    usage: Usage
    variant: str = "default"  # an implementation's kernel variant (e.g. "f32-dst")


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A prepared weight: the spec, the implementation's payload, and who prepared it."""

    spec: GemmSpec
    payload: Any
    impl: Any
    provenance: Provenance
    device: torch.device


class GemmImplementation(Protocol):
    name: str
    path: ImplPath

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision: ...

    def prepare(
        self, spec: GemmSpec, weight: torch.Tensor, weight_scale: torch.Tensor | None
    ) -> Any:
        """Pack ``weight`` ``[N, K]`` (and int8 per-channel ``weight_scale`` ``[N]``)."""
        ...

    def mm(
        self,
        spec: GemmSpec,
        x: torch.Tensor,
        payload: Any,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """``out[M, N] = x[M, K] @ W^T (+ bias)``."""
        ...

    def scaled_mm(
        self,
        spec: GemmSpec,
        x_q: torch.Tensor,
        x_scale: torch.Tensor,
        payload: Any,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """``out = (x_q @ W_q^T) * x_scale[:, None] * w_scale[None, :] (+ bias)``."""
        ...


def prepare(
    weight: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    usage: Usage = "linear",
    weight_scale: torch.Tensor | None = None,
    backend: Backend | None = None,
) -> PackedWeight:
    """Prepare ``weight`` ``[N, K]`` for repeated ``mm``/``scaled_mm`` calls.

    - float weights (bf16/fp16/fp32): ``out_dtype`` defaults to the weight's dtype; fp32 output
      of a bf16/fp16 weight is the fp32 accumulator.
    - int8 weights: ``weight_scale`` ``[N]`` fp32 per output channel is required; ``out_dtype``
      is bf16 (default), fp16 or fp32.
    """
    from ..backend import process_backend

    op = "gemm.prepare"
    be = backend or process_backend()
    device = be.device
    w = checks.tensor(op, "weight", weight, dtypes=WEIGHT_DTYPES, ndim=2, device=device)
    checks.one_of(op, "usage", usage, USAGES)
    n, k = int(w.shape[0]), int(w.shape[1])
    if n == 0 or k == 0:
        raise ValueError(f"{op}: weight has an empty dimension, shape {tuple(w.shape)}")
    if w.dtype == torch.int8:
        if weight_scale is None:
            raise ValueError(f"{op}: an int8 weight needs weight_scale [N={n}] fp32")
        checks.tensor(
            op, "weight_scale", weight_scale, dtypes={torch.float32}, shape=(n,), device=device
        )
        out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    elif weight_scale is not None:
        raise ValueError(f"{op}: weight_scale is only for int8 weights (weight is {w.dtype})")
    out_dtype = w.dtype if out_dtype is None else out_dtype
    if out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: out_dtype={out_dtype} must be bf16, fp16 or fp32")
    if w.dtype in FLOAT_DTYPES and out_dtype not in (w.dtype, torch.float32):
        raise TypeError(
            f"{op}: out_dtype={out_dtype} with a {w.dtype} weight; use {w.dtype} or float32"
        )
    spec = GemmSpec(n, k, w.dtype, out_dtype, usage)
    impl, prov = be.implementation_for(OpFamily.GEMM, spec)
    payload = impl.prepare(spec, w, weight_scale)
    return PackedWeight(spec, payload, impl, prov, device)


def _check_out(op: str, out: object, m: int, spec: GemmSpec, device: torch.device) -> None:
    o = checks.tensor(op, "out", out, dtypes={spec.out_dtype}, shape=(m, spec.n), device=device)
    if o.stride(-1) != 1:
        raise ValueError(f"{op}: out must have a contiguous last dim (strides {o.stride()})")


def _check_bias(op: str, bias: object, spec: GemmSpec, device: torch.device) -> None:
    allowed = {spec.out_dtype, torch.float32}
    if not spec.scaled:
        allowed.add(spec.weight_dtype)
    checks.tensor(op, "bias", bias, dtypes=allowed, shape=(spec.n,), device=device, contiguous=True)


def _check_packed(op: str, packed: object, *, scaled: bool) -> PackedWeight:
    if not isinstance(packed, PackedWeight):
        raise TypeError(f"{op}: packed must come from gemm.prepare, got {type(packed).__name__}")
    if packed.spec.scaled != scaled:
        other = "gemm.scaled_mm" if packed.spec.scaled else "gemm.mm"
        raise TypeError(f"{op}: packed holds a {packed.spec.weight_dtype} weight; call {other}")
    return packed


def _check_x(op: str, name: str, x: object, dtype: torch.dtype, packed: PackedWeight) -> int:
    t = checks.tensor(
        op, name, x, dtypes={dtype}, shape=(None, packed.spec.k), device=packed.device
    )
    if t.stride(-1) != 1:
        raise ValueError(f"{op}: {name} must have a contiguous last dim (strides {t.stride()})")
    return int(t.shape[0])


def mm(
    x: torch.Tensor,
    packed: PackedWeight,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x`` ``[M, K]`` (the weight's dtype) @ W^T (+ ``bias`` ``[N]``) -> ``[M, N]``."""
    op = "gemm.mm"
    packed = _check_packed(op, packed, scaled=False)
    m = _check_x(op, "x", x, packed.spec.weight_dtype, packed)
    spec = packed.spec
    if bias is not None:
        _check_bias(op, bias, spec, packed.device)
    if out is None:
        out = torch.empty((m, spec.n), dtype=spec.out_dtype, device=packed.device)
    else:
        _check_out(op, out, m, spec, packed.device)
        checks.no_overlap(op, (("out", out),), (("x", x), ("bias", bias)))
    written = checks.Outputs((("out", out),))
    packed.impl.mm(spec, x, packed.payload, bias, out)
    written.check(op, packed.impl)
    note(packed.provenance)
    return out


def scaled_mm(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    packed: PackedWeight,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """int8 ``x_q`` ``[M, K]`` with per-token ``x_scale`` ``[M]`` (or ``[M, 1]``) fp32, times an
    int8 prepared weight with per-channel scales -> ``[M, N]`` in the prepared ``out_dtype``."""
    op = "gemm.scaled_mm"
    packed = _check_packed(op, packed, scaled=True)
    m = _check_x(op, "x_q", x_q, torch.int8, packed)
    spec = packed.spec
    s = checks.tensor(op, "x_scale", x_scale, dtypes={torch.float32}, device=packed.device)
    if tuple(s.shape) not in ((m,), (m, 1)):
        raise ValueError(f"{op}: x_scale.shape={tuple(s.shape)}, expected ({m},) or ({m}, 1)")
    if bias is not None:
        _check_bias(op, bias, spec, packed.device)
    if out is None:
        out = torch.empty((m, spec.n), dtype=spec.out_dtype, device=packed.device)
    else:
        _check_out(op, out, m, spec, packed.device)
        checks.no_overlap(op, (("out", out),), (("x_q", x_q), ("x_scale", s), ("bias", bias)))
    written = checks.Outputs((("out", out),))
    packed.impl.scaled_mm(spec, x_q, s.reshape(m), packed.payload, bias, out)
    written.check(op, packed.impl)
    note(packed.provenance)
    return out


def problem_of(
    spec: GemmSpec,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    *,
    m: int | None = None,
    variant: str = "default",
) -> GemmProblem:
    """The full descriptor of a call, for primitive caches (``m`` may be a band)."""
    return GemmProblem(
        m=int(x.shape[0]) if m is None else m,
        n=spec.n,
        k=spec.k,
        a_dtype=x.dtype,
        b_dtype=spec.weight_dtype,
        c_dtype=out.dtype,
        bias_dtype=None if bias is None else bias.dtype,
        a_row_stride=int(x.stride(0)),
        c_row_stride=int(out.stride(0)),
        scaled=spec.scaled,
        usage=spec.usage,
        variant=variant,
    )

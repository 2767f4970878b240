"""GEMM: ``prepare`` a weight once, then ``mm`` (bf16/fp16/fp32) or ``scaled_mm`` (int8 W8A8).

``y = x @ W^T (+ bias)`` with fp32 accumulation. The LM head is bf16 x bf16 -> fp32: ask for it
with ``prepare(w, out_dtype=torch.float32, usage="lm_head")``; a backend must produce the fp32
accumulator itself, not an upcast of a rounded result.

Fused weights: ``prepare([w_q, w_k, w_v])`` concatenates the parts along N once, here on the
host, so every backend sees one ordinary ``[sum N_i, K]`` weight; ``packed.split(y)`` gives
each part's output as a view of the fused one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

from ..contract import OpFamily
from ..contract.decision import Decision, ImplPath
from ..contract.provenance import Provenance, note
from . import checks
from .huge_pages import advise_huge_pages

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
    """A prepared weight: the spec, the implementation's payload, and who prepared it.

    ``parts`` holds the N of each weight fused into it, in order (``(spec.n,)`` for one weight);
    the spec describes the fused problem, ``spec.n == sum(parts)``.
    """

    spec: GemmSpec
    payload: Any
    impl: Any
    provenance: Provenance
    device: torch.device
    parts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.parts:  # one weight: one part, the whole N
            object.__setattr__(self, "parts", (self.spec.n,))
        elif sum(self.parts) != self.spec.n or min(self.parts) < 1:
            raise ValueError(
                f"PackedWeight: parts={self.parts} must be >= 1 and sum to N={self.spec.n}"
            )

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each part's columns of ``y`` ``[..., N]`` (an ``mm``/``scaled_mm`` output), as views
        ``y[..., a:b]``: no copy; with ``y``'s last dim contiguous, so is each view's."""
        t = checks.tensor("PackedWeight.split", "y", y)
        if t.dim() < 1 or t.shape[-1] != self.spec.n:
            raise ValueError(
                f"PackedWeight.split: y.shape={tuple(t.shape)}, expected the last dim to be "
                f"N={self.spec.n} (parts {self.parts})"
            )
        views, start = [], 0
        for n in self.parts:
            views.append(t.narrow(-1, start, n))
            start += n
        return tuple(views)

    def fused_bias(self, bias: Sequence[torch.Tensor]) -> torch.Tensor:
        """One ``[N_i]`` bias per part, concatenated once into the fused ``[N]`` bias for
        ``mm``/``scaled_mm`` (same dtype throughout, on this weight's device)."""
        op = "PackedWeight.fused_bias"
        items = _sequence(op, "bias", bias)
        if len(items) != len(self.parts):
            raise ValueError(
                f"{op}: bias has {len(items)} tensors, the weight has {len(self.parts)} parts "
                f"{self.parts}"
            )
        bs: list[torch.Tensor] = []
        for i, (item, n) in enumerate(zip(items, self.parts, strict=True)):
            b = checks.tensor(op, f"bias[{i}]", item, shape=(n,), device=self.device)
            if bs and b.dtype != bs[0].dtype:
                raise TypeError(f"{op}: bias[{i}].dtype={b.dtype}, bias[0] is {bs[0].dtype}")
            bs.append(b)
        return torch.cat(bs)


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
    weight: torch.Tensor | Sequence[torch.Tensor],
    *,
    out_dtype: torch.dtype | None = None,
    usage: Usage = "linear",
    weight_scale: torch.Tensor | Sequence[torch.Tensor] | None = None,
    backend: Backend | None = None,
) -> PackedWeight:
    """Prepare ``weight`` ``[N, K]`` for repeated ``mm``/``scaled_mm`` calls.

    - float weights (bf16/fp16/fp32): ``out_dtype`` defaults to the weight's dtype; fp32 output
      of a bf16/fp16 weight is the fp32 accumulator.
    - int8 weights: ``weight_scale`` ``[N]`` fp32 per output channel is required; ``out_dtype``
      is bf16 (default), fp16 or fp32.
    - a sequence of weights ``[N_i, K]`` (same K, dtype and device; for int8 a sequence of
      ``weight_scale`` ``[N_i]``, one per weight) is fused: concatenated along N once, prepared
      as one ``[sum N_i, K]`` weight; ``usage`` applies to the whole. ``split`` its outputs.
    """
    from ..backend import process_backend

    op = "gemm.prepare"
    be = backend or process_backend()
    device = be.device
    ws, scales = _parts(op, weight, weight_scale, device)
    checks.one_of(op, "usage", usage, USAGES)
    parts = tuple(int(t.shape[0]) for t in ws)
    w_dtype, n, k = ws[0].dtype, sum(parts), int(ws[0].shape[1])
    if w_dtype == torch.int8:
        out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    out_dtype = w_dtype if out_dtype is None else out_dtype
    if out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: out_dtype={out_dtype} must be bf16, fp16 or fp32")
    if w_dtype in FLOAT_DTYPES and out_dtype not in (w_dtype, torch.float32):
        raise TypeError(
            f"{op}: out_dtype={out_dtype} with a {w_dtype} weight; use {w_dtype} or float32"
        )
    spec = GemmSpec(n, k, w_dtype, out_dtype, usage)
    impl, prov = be.implementation_for(OpFamily.GEMM, spec)
    # fusing's one copy, at load time and only once every check has passed
    w = _concat(ws)
    payload = impl.prepare(spec, w, None if scales is None else _concat(scales))
    return PackedWeight(spec, payload, impl, prov, device, parts)


def _sequence(op: str, name: str, value: object) -> tuple[object, ...]:
    """``value`` as a non-empty tuple, for the arguments that take one tensor per part."""
    if isinstance(value, torch.Tensor) or not isinstance(value, Sequence):
        raise TypeError(f"{op}: {name} must be a sequence of tensors, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{op}: {name} is an empty sequence")
    return tuple(value)


def _parts(
    op: str, weight: object, weight_scale: object, device: torch.device
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """The parts of ``weight`` (one tensor, or a sequence to fuse) and, for int8, of
    ``weight_scale``, each checked; an error names the part (``weight[2]``)."""
    one = isinstance(weight, torch.Tensor)
    ws: list[torch.Tensor] = []
    for i, item in enumerate((weight,) if one else _sequence(op, "weight", weight)):
        name = "weight" if one else f"weight[{i}]"
        t = checks.tensor(op, name, item, dtypes=WEIGHT_DTYPES, ndim=2, device=device)
        if ws and t.dtype != ws[0].dtype:
            raise TypeError(f"{op}: {name}.dtype={t.dtype}, weight[0] is {ws[0].dtype}")
        if ws and t.shape[1] != ws[0].shape[1]:
            raise ValueError(f"{op}: {name} has K={t.shape[1]}, weight[0] has K={ws[0].shape[1]}")
        if t.shape[0] == 0 or t.shape[1] == 0:
            raise ValueError(f"{op}: {name} has an empty dimension, shape {tuple(t.shape)}")
        ws.append(t)
    if ws[0].dtype != torch.int8:
        if weight_scale is not None:
            raise ValueError(
                f"{op}: weight_scale is only for int8 weights (weight is {ws[0].dtype})"
            )
        return ws, None
    parts = [int(t.shape[0]) for t in ws]
    if weight_scale is None:
        if one:
            raise ValueError(f"{op}: an int8 weight needs weight_scale [N={parts[0]}] fp32")
        raise ValueError(
            f"{op}: int8 weights need weight_scale, one [N_i] fp32 tensor per weight "
            f"(N_i {tuple(parts)})"
        )
    if one and not isinstance(weight_scale, torch.Tensor):
        raise TypeError(
            f"{op}: weight_scale is a {type(weight_scale).__name__} but weight is one tensor; "
            "pass one weight_scale tensor [N]"
        )
    items = (weight_scale,) if one else _sequence(op, "weight_scale", weight_scale)
    if len(items) != len(ws):
        raise ValueError(
            f"{op}: weight_scale has {len(items)} tensors, weight has {len(ws)} (one "
            "weight_scale [N_i] per weight)"
        )
    scales = [
        checks.tensor(
            op,
            "weight_scale" if one else f"weight_scale[{i}]",
            item,
            dtypes={torch.float32},
            shape=(n,),
            device=device,
        )
        for i, (item, n) in enumerate(zip(items, parts, strict=True))
    ]
    return ws, scales


def _concat(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts joined along dim 0; a single part as it is (no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _check_out(op: str, out: object, m: int, spec: GemmSpec, device: torch.device) -> None:
    o = checks.tensor(op, "out", out, dtypes={spec.out_dtype}, shape=(m, spec.n), device=device)
    if o.stride(-1) != 1:
        raise ValueError(f"{op}: out must have a contiguous last dim (strides {o.stride()})")


def _check_bias(op: str, bias: object, spec: GemmSpec, device: torch.device) -> None:
    if isinstance(bias, list | tuple):  # per-part biases: joined once at load, not per call
        raise TypeError(
            f"{op}: bias is a {type(bias).__name__}; join a fused weight's biases once with "
            "packed.fused_bias([...]) and pass the [N] tensor"
        )
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


# A fresh CPU output this large is mapped by the allocator on each call, and every 4 KB page then
# faults on its first write: +27% on a 46 MB bf16 output at M = 2048 (one thread), +2.5% as 2 MB
# pages (docs/measurements/cpu-arm-acl/2026-12-06-xeon-amx.md).
HUGE_OUT_BYTES = 4 << 20


def _new_out(m: int, spec: GemmSpec, device: torch.device) -> torch.Tensor:
    out = torch.empty((m, spec.n), dtype=spec.out_dtype, device=device)
    if out.nbytes >= HUGE_OUT_BYTES:
        advise_huge_pages(out)  # before the kernel's first write; a hint, CPU tensors only
    return out


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
        out = _new_out(m, spec, packed.device)
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
        out = _new_out(m, spec, packed.device)
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

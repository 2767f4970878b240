"""Per-token-group quantization: ``per_token_group_quant(x, group_size, ...) -> (q, scales)``.

The rounding rule and scale layout (docs/ops.md), which every backend meets bit-exactly:
for each row and group of ``group_size`` elements, ``a = max(max|x|, eps)`` in fp32;
int8: ``s = a / 127``, ``q = clamp(round_half_even(x / s), -128, 127)``;
fp8 e4m3: ``s = a / 448``, ``q = cast_rne(clamp(x / s, -448, 448))``;
``scale_ue8m0`` rounds ``s`` up to a power of two first. Scales are fp32 ``[M, K // group_size]``,
row-major, or column-major (strides ``(1, M)``) when asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from ..contract import OpFamily
from ..contract.decision import Decision, ImplPath
from ..contract.provenance import note
from . import checks

if TYPE_CHECKING:
    from ..backend import Backend
    from ..device_info import DeviceInfo

OP = "per_token_group_quant"
IN_DTYPES = frozenset({torch.bfloat16, torch.float16, torch.float32})
OUT_DTYPES = frozenset({torch.int8, torch.float8_e4m3fn})
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


@dataclass(frozen=True, slots=True)
class QuantSpec:
    k: int
    group_size: int
    in_dtype: torch.dtype
    dtype: torch.dtype
    column_major_scales: bool = False
    scale_ue8m0: bool = False

    def describe(self) -> str:
        i, o = checks.short_dtype(self.in_dtype), checks.short_dtype(self.dtype)
        s = f"K={self.k} group={self.group_size} {i}->{o}"
        if self.column_major_scales:
            s += " col-major"
        if self.scale_ue8m0:
            s += " ue8m0"
        return s


class QuantImplementation(Protocol):
    name: str
    path: ImplPath

    def supports(self, spec: QuantSpec, info: DeviceInfo) -> Decision: ...

    def quantize(
        self,
        spec: QuantSpec,
        x: torch.Tensor,
        eps: float,
        out_q: torch.Tensor,
        out_scales: torch.Tensor,
    ) -> None:
        """Fill ``out_q`` ``[M, K]`` and ``out_scales`` (logical ``[M, K // group_size]``)."""
        ...


def scales_like(m: int, groups: int, column_major: bool, device: torch.device) -> torch.Tensor:
    """An empty fp32 scale tensor in the documented layout."""
    if column_major:
        return torch.empty((groups, m), dtype=torch.float32, device=device).t()
    return torch.empty((m, groups), dtype=torch.float32, device=device)


def per_token_group_quant(
    x: torch.Tensor,
    group_size: int,
    dtype: torch.dtype = torch.int8,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_ue8m0: bool = False,
    *,
    out: torch.Tensor | None = None,
    out_scales: torch.Tensor | None = None,
    backend: Backend | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` ``[M, K]`` (bf16/fp16/fp32, contiguous) per row and group of
    ``group_size`` elements to ``dtype`` (int8 or ``torch.float8_e4m3fn``).

    Returns ``(q [M, K], scales [M, K // group_size] fp32)``; see the module docstring for the
    exact rule. ``out``/``out_scales`` may be preallocated (scales in the requested layout).
    """
    from ..backend import process_backend

    be = backend or process_backend()
    device = be.device
    t = checks.tensor(OP, "x", x, dtypes=IN_DTYPES, ndim=2, device=device, contiguous=True)
    checks.positive_int(OP, "group_size", group_size)
    if dtype not in OUT_DTYPES:
        raise TypeError(f"{OP}: dtype={dtype} must be torch.int8 or torch.float8_e4m3fn")
    if not isinstance(eps, float | int) or not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"{OP}: eps={eps!r} must be a positive finite number")
    m, k = int(t.shape[0]), int(t.shape[1])
    if k % group_size:
        raise ValueError(f"{OP}: x.shape[-1]={k} is not divisible by group_size={group_size}")
    groups = k // group_size
    if out is None:
        out = torch.empty((m, k), dtype=dtype, device=device)
    else:
        checks.tensor(OP, "out", out, dtypes={dtype}, shape=(m, k), device=device, contiguous=True)
    if out_scales is None:
        out_scales = scales_like(m, groups, column_major_scales, device)
    else:
        checks.tensor(
            OP, "out_scales", out_scales, dtypes={torch.float32}, shape=(m, groups), device=device
        )
        want = (1, m) if column_major_scales else (groups, 1)
        if m > 1 and groups > 1 and tuple(out_scales.stride()) != want:
            layout = "column" if column_major_scales else "row"
            raise ValueError(
                f"{OP}: out_scales strides {tuple(out_scales.stride())} are not {layout}-major "
                f"{want}"
            )
    checks.no_overlap(OP, (("out", out), ("out_scales", out_scales)), (("x", t),))
    spec = QuantSpec(k, group_size, t.dtype, dtype, column_major_scales, scale_ue8m0)
    impl, prov = be.implementation_for(OpFamily.QUANT, spec)
    if m:
        written = checks.Outputs((("out", out), ("out_scales", out_scales)))
        impl.quantize(spec, t, float(eps), out, out_scales)
        written.check(OP, impl)
    note(prov)
    return out, out_scales

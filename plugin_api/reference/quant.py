"""Reference per-token-group quantization: the documented rule, written out literally."""

from __future__ import annotations

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.quant import QMAX, QuantSpec


def pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """Round positive fp32 ``s`` up to a power of two, exactly (no log2 rounding error)."""
    mantissa, exponent = torch.frexp(s)  # s = mantissa * 2**exponent, mantissa in [0.5, 1)
    up = torch.ldexp(torch.ones_like(s), exponent)
    return torch.where(mantissa == 0.5, s, up)


def group_scales(xg: torch.Tensor, spec: QuantSpec, eps: float) -> torch.Tensor:
    """Scales ``[M, groups]`` for fp32 groups ``xg`` ``[M, groups, group_size]``."""
    a = xg.abs().amax(dim=-1).clamp_min(eps)
    s = a / QMAX[spec.dtype]
    return pow2_ceil(s) if spec.scale_ue8m0 else s


class ReferenceQuant:
    name = "reference"
    path = ImplPath.REFERENCE

    def supports(self, spec: QuantSpec, info: DeviceInfo) -> Decision:
        return Decision.accept("eager torch, the documented rounding rule")

    def quantize(
        self,
        spec: QuantSpec,
        x: torch.Tensor,
        eps: float,
        out_q: torch.Tensor,
        out_scales: torch.Tensor,
    ) -> None:
        m = x.shape[0]
        xg = x.float().view(m, spec.k // spec.group_size, spec.group_size)
        s = group_scales(xg, spec, eps)
        y = xg / s.unsqueeze(-1)  # IEEE fp32 division
        if spec.dtype == torch.int8:
            q = torch.round(y).clamp(-128, 127).to(torch.int8)  # round half to even
        else:
            q = y.clamp(-QMAX[spec.dtype], QMAX[spec.dtype]).to(spec.dtype)
        out_q.copy_(q.view(m, spec.k))
        out_scales.copy_(s)


def implementations() -> tuple[ReferenceQuant]:
    return (ReferenceQuant(),)

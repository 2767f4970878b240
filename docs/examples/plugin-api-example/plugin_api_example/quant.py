"""Per-token-group int8 quantization in eager torch, a bounded number of rows at a time.

The rule is the host's (docs/ops.md): per row and group of ``group_size`` elements,
``s = max(max|x|, eps) / 127`` in fp32 and ``q = clamp(round_half_even(x / s), -128, 127)``.
Only what is implemented is accepted: int8 output, row-major scales, plain fp32 scales.
"""

from __future__ import annotations

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.checks import short_dtype
from plugin_api.ops.quant import QuantSpec

ROWS = 256  # rows per step: fp32 temporaries stay at ROWS * K * 4 bytes, whatever M is


class ChunkedGroupQuant:
    name = "example:chunked-int8"
    path = ImplPath.TORCH

    def supports(self, spec: QuantSpec, info: DeviceInfo) -> Decision:
        """Accept exactly what ``quantize`` implements; every other feature with its reason."""
        reasons = []
        if spec.dtype != torch.int8:
            reasons.append(f"dtype={short_dtype(spec.dtype)}: this example writes int8 only")
        if spec.column_major_scales:
            reasons.append("column_major_scales: this example writes row-major scales only")
        if spec.scale_ue8m0:
            reasons.append("scale_ue8m0: power-of-two scales are not implemented here")
        if reasons:
            return Decision.reject(*reasons)
        return Decision.accept(f"eager torch on the CPU, {ROWS} rows at a time")

    def quantize(
        self,
        spec: QuantSpec,
        x: torch.Tensor,
        eps: float,
        out_q: torch.Tensor,
        out_scales: torch.Tensor,
    ) -> None:
        """``x`` ``[M, K]`` bf16/fp16/fp32 contiguous (checked by the host); fills ``out_q``
        ``[M, K]`` int8 and ``out_scales`` ``[M, K // group_size]`` fp32, row-major."""
        m, groups = x.shape[0], spec.k // spec.group_size
        for start in range(0, m, ROWS):
            rows = slice(start, min(start + ROWS, m))
            xg = x[rows].float().view(-1, groups, spec.group_size)
            s = xg.abs().amax(dim=-1).clamp_min(eps) / 127.0
            q = torch.round(xg / s.unsqueeze(-1)).clamp_(-128, 127)  # round half to even
            out_q[rows].copy_(q.view(-1, spec.k))
            out_scales[rows].copy_(s)


def implementations() -> tuple[ChunkedGroupQuant]:
    return (ChunkedGroupQuant(),)

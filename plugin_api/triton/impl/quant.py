"""``per_token_group_quant`` through the Triton kernel in ``plugin_api.triton.quant``."""

from __future__ import annotations

import torch

from ...contract.decision import Decision, ImplPath
from ...device_info import DeviceInfo
from ...gpu.triton_target import TritonTarget
from ...ops.quant import QuantSpec


class TritonQuant:
    """Every spec of the op contract: int8 and fp8 e4m3, any group size (groups larger than the
    launch table's tile loop over it), row- or column-major scales, ue8m0; bit-exact."""

    name = "triton"
    path = ImplPath.TRITON

    def __init__(self, target: TritonTarget) -> None:
        self.target = target

    def supports(self, spec: QuantSpec, info: DeviceInfo) -> Decision:
        return Decision.all_of(
            self.target.triton(info),
            Decision.accept("bit-exact rounding by exact integer/fp32 arithmetic"),
        )

    def quantize(
        self,
        spec: QuantSpec,
        x: torch.Tensor,
        eps: float,
        out_q: torch.Tensor,
        out_scales: torch.Tensor,
    ) -> None:
        from .. import quant

        quant.group_quant(x, spec.group_size, eps, spec.scale_ue8m0, out_q, out_scales)

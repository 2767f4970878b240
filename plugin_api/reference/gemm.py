"""Reference GEMM: torch matmuls whose fp32 accumulation is exact by construction."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.gemm import GemmSpec


@dataclass(frozen=True, slots=True)
class ReferenceWeight:
    weight: torch.Tensor  # [N, K] as given
    weight_t32: torch.Tensor | None  # [K, N] fp32 copy, for fp32 output without out_dtype mm
    weight_scale: torch.Tensor | None


def has_out_dtype_mm(device: torch.device) -> bool:
    """Whether this torch computes ``torch.mm(bf16, bf16, out_dtype=float32)`` on ``device``."""
    a = torch.zeros((1, 8), dtype=torch.bfloat16, device=device)
    try:
        torch.mm(a, a.t(), out_dtype=torch.float32)
    except (NotImplementedError, RuntimeError, TypeError):
        return False
    return True


class ReferenceGemm:
    name = "reference"
    path = ImplPath.REFERENCE

    def __init__(self) -> None:
        self._out_dtype_mm: dict[str, bool] = {}

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision:
        return Decision.accept("eager torch, exact fp32 accumulation")

    def _fp32_native(self, device: torch.device) -> bool:
        if device.type not in self._out_dtype_mm:
            self._out_dtype_mm[device.type] = has_out_dtype_mm(device)
        return self._out_dtype_mm[device.type]

    def prepare(
        self, spec: GemmSpec, weight: torch.Tensor, weight_scale: torch.Tensor | None
    ) -> ReferenceWeight:
        upcast = None
        wants_acc = spec.out_dtype == torch.float32 and spec.weight_dtype != torch.float32
        if wants_acc and not spec.scaled and not self._fp32_native(weight.device):
            # bf16/fp16 products are exact in fp32, so an fp32 matmul of the upcast weight
            # gives the fp32 accumulator the contract asks for.
            upcast = weight.float().t().contiguous()
        return ReferenceWeight(weight, upcast, weight_scale)

    def mm(
        self,
        spec: GemmSpec,
        x: torch.Tensor,
        payload: ReferenceWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        w = payload.weight
        if spec.out_dtype == torch.float32 and w.dtype != torch.float32:
            if payload.weight_t32 is not None:
                torch.mm(x.float(), payload.weight_t32, out=out)
            else:
                out.copy_(torch.mm(x, w.t(), out_dtype=torch.float32))
            if bias is not None:
                out.add_(bias.float())
            return
        if bias is None:
            torch.mm(x, w.t(), out=out)
        else:
            torch.addmm(bias.to(out.dtype), x, w.t(), out=out)

    def scaled_mm(
        self,
        spec: GemmSpec,
        x_q: torch.Tensor,
        x_scale: torch.Tensor,
        payload: ReferenceWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        w = payload.weight
        assert payload.weight_scale is not None
        if x_q.device.type == "cpu":
            acc = torch._int_mm(x_q.contiguous(), w.t().contiguous()).float()
        else:  # int8 products summed in fp64 are exact for any K below 2^37
            acc = (x_q.double() @ w.double().t()).float()
        y = acc * x_scale.view(-1, 1) * payload.weight_scale.view(1, -1)
        if bias is not None:
            y = y + bias.float()
        out.copy_(y)


def implementations() -> tuple[ReferenceGemm]:
    return (ReferenceGemm(),)

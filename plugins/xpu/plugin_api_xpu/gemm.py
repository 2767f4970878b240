"""GEMM on Intel GPUs through torch (oneDNN underneath): float weights, fp32 accumulation.

The LM-head case (bf16 x bf16 -> fp32) needs ``torch.mm(..., out_dtype=torch.float32)`` on XPU;
whether the installed torch has it is a machine fact (``probe.mm_out_dtype``). Without it the
spec is rejected with that reason: an fp32 result built from an upcast weight, or from a rounded
bf16 result, is not the accumulator the contract asks for.
"""

from __future__ import annotations

import torch

from plugin_api.device_info import DeviceInfo
from plugin_api.ops.checks import short_dtype
from plugin_api.ops.decision import Decision, ImplPath
from plugin_api.ops.gemm import GemmSpec

from .probe import mm_out_dtype


class XpuGemm:
    name = "torch-xpu"
    path = ImplPath.TORCH

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision:
        w, o = short_dtype(spec.weight_dtype), short_dtype(spec.out_dtype)
        if spec.scaled:
            return Decision.reject("int8 scaled_mm: this plugin has no int8 GEMM kernel")
        if spec.out_dtype == spec.weight_dtype:
            return Decision.accept(f"torch.mm on xpu, {w} in and out, fp32 accumulation")
        if spec.weight_dtype != torch.bfloat16:
            return Decision.reject(f"{w} -> {o}: only bf16 -> fp32 is feature-detected")
        native = mm_out_dtype(info)
        if not native.ok:
            return Decision.reject(f"{w} -> {o} needs the fp32 accumulator: {native.because()}")
        return Decision.accept(f"{w} -> {o}: {native.because()}")

    def prepare(
        self, spec: GemmSpec, weight: torch.Tensor, weight_scale: torch.Tensor | None
    ) -> torch.Tensor:
        return weight  # torch.mm reads [N, K] through a transposed view; nothing to pack

    def mm(
        self,
        spec: GemmSpec,
        x: torch.Tensor,
        payload: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        w_t = payload.t()
        if spec.out_dtype != spec.weight_dtype:  # fp32 accumulator of a bf16/fp16 product
            out.copy_(torch.mm(x, w_t, out_dtype=torch.float32))
            if bias is not None:
                out.add_(bias.float())
        elif bias is None:
            torch.mm(x, w_t, out=out)
        else:
            torch.addmm(bias.to(out.dtype), x, w_t, out=out)

    def scaled_mm(
        self,
        spec: GemmSpec,
        x_q: torch.Tensor,
        x_scale: torch.Tensor,
        payload: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        # supports() rejects every int8 spec, so the host resolves scaled_mm elsewhere
        raise TypeError("xpu: int8 scaled_mm is not implemented (supports() rejects it)")


def implementations() -> tuple[XpuGemm]:
    return (XpuGemm(),)

"""GEMM on CUDA through torch: cuBLAS with an fp32 output straight from the fp32 accumulator
(``torch.mm(..., out_dtype=torch.float32)``) for the LM head, and int8 W8A8 through
``torch._int_mm``. Both are feature-detected on the device at ``prepare``; a missing feature is
an error, never emulated (an upcast-then-matmul would not be the same kernel nor the same cost).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from packaging.version import InvalidVersion, Version

from plugin_api.device_info import DeviceInfo
from plugin_api.errors import UnsupportedSpec
from plugin_api.ops.decision import Decision, ImplPath
from plugin_api.ops.gemm import GemmSpec
from plugin_api.reference.gemm import has_out_dtype_mm

from .rules import arch_of

OUT_DTYPE_MM_SINCE = Version("2.8")  # aten::mm.dtype on CUDA (pytorch#150812)
INT_MM_ALIGN = 8  # torch._int_mm on CUDA: K and N multiples of 8
INT_MM_MIN_M = 17  # ... and more than 16 rows; shorter inputs are zero-padded


@dataclass(frozen=True, slots=True)
class CudaWeight:
    weight_t: torch.Tensor  # [K, N] view of the [N, K] weight (cuBLAS reads it transposed)
    weight_scale: torch.Tensor | None  # [N] fp32 for int8
    out_dtype_into_out: bool  # torch.mm(..., out_dtype=, out=) works on this torch


def _torch_version(info: DeviceInfo) -> Version | None:
    if info.torch is None:
        return None
    try:
        return Version(info.torch.version.split("+")[0])
    except InvalidVersion:
        return None


def _wants_accumulator(spec: GemmSpec) -> bool:
    return (
        not spec.scaled and spec.out_dtype == torch.float32 and spec.weight_dtype != torch.float32
    )


def out_dtype_mm(device: torch.device) -> tuple[bool, bool]:
    """(mm with out_dtype=float32 works, it also writes into ``out=``) on ``device``."""
    if not has_out_dtype_mm(device):
        return False, False
    a = torch.zeros((2, 8), dtype=torch.bfloat16, device=device)
    o = torch.empty((2, 2), dtype=torch.float32, device=device)
    try:
        torch.mm(a, a.t(), out_dtype=torch.float32, out=o)
    except (NotImplementedError, RuntimeError, TypeError):
        return True, False
    return True, True


class TorchCudaGemm:
    name = "torch-cublas"
    path = ImplPath.TORCH

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision:
        if arch_of(info) is None:
            return Decision.reject("no SM90/SM100/SM12x NVIDIA GPU in this DeviceInfo")
        tv = _torch_version(info)
        if spec.scaled:
            bad = [f"{n}={v}" for n, v in (("N", spec.n), ("K", spec.k)) if v % INT_MM_ALIGN]
            if bad:
                return Decision.reject(
                    f"int8 scaled_mm: torch._int_mm needs N and K multiples of "
                    f"{INT_MM_ALIGN}, got {', '.join(bad)}"
                )
            return Decision.accept("torch._int_mm int32 accumulation, fp32 per-token/channel scale")
        if _wants_accumulator(spec):
            if tv is None or tv < OUT_DTYPE_MM_SINCE:
                return Decision.reject(
                    f"fp32 output of a {spec.weight_dtype} GEMM needs torch.mm(out_dtype="
                    f"float32) (torch >= {OUT_DTYPE_MM_SINCE}); torch here: "
                    f"{info.torch.version if info.torch else 'none'}"
                )
            return Decision.accept("torch.mm(out_dtype=float32): cuBLAS fp32 accumulator as output")
        return Decision.accept("torch.mm/addmm (cuBLAS)")

    def prepare(
        self, spec: GemmSpec, weight: torch.Tensor, weight_scale: torch.Tensor | None
    ) -> CudaWeight:
        into_out = False
        if _wants_accumulator(spec):
            works, into_out = out_dtype_mm(weight.device)
            if not works:
                raise UnsupportedSpec(
                    f"gemm {spec.describe()}: torch {torch.__version__} has no "
                    f"torch.mm(out_dtype=float32) on {weight.device}; refusing to emulate it",
                    backend="cuda-sm90",
                )
        if spec.scaled and not hasattr(torch, "_int_mm"):
            raise UnsupportedSpec(
                f"gemm {spec.describe()}: torch {torch.__version__} has no torch._int_mm",
                backend="cuda-sm90",
            )
        return CudaWeight(weight.t(), weight_scale, into_out)

    def mm(
        self,
        spec: GemmSpec,
        x: torch.Tensor,
        payload: CudaWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        w_t = payload.weight_t
        if _wants_accumulator(spec):
            if payload.out_dtype_into_out:
                torch.mm(x, w_t, out_dtype=torch.float32, out=out)
            else:
                out.copy_(torch.mm(x, w_t, out_dtype=torch.float32))
            if bias is not None:
                out.add_(bias.float())
            return
        if bias is None:
            torch.mm(x, w_t, out=out)
        else:
            torch.addmm(bias.to(out.dtype), x, w_t, out=out)

    def scaled_mm(
        self,
        spec: GemmSpec,
        x_q: torch.Tensor,
        x_scale: torch.Tensor,
        payload: CudaWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        m = x_q.shape[0]
        a = x_q.contiguous()
        if m < INT_MM_MIN_M:  # zero rows add nothing to the rows we keep
            a = torch.cat([a, a.new_zeros((INT_MM_MIN_M - m, a.shape[1]))])
        acc = torch._int_mm(a, payload.weight_t)[:m]
        assert payload.weight_scale is not None
        y = acc.float() * x_scale.view(-1, 1) * payload.weight_scale.view(1, -1)
        if bias is not None:
            y += bias.float()
        out.copy_(y)

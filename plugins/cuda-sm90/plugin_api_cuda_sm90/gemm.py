"""GEMM on CUDA through torch: cuBLAS with an fp32 output straight from the fp32 accumulator
(``torch.mm(..., out_dtype=torch.float32)``) for the LM head, and int8 W8A8 through
``torch._int_mm``. The run methods are the host's (``plugin_api.gpu.torch_gemm``): both features are
checked on the device at ``prepare``; a missing one is an error, never emulated. Acceptance here
is by architecture and torch version, so a what-if ``DeviceInfo`` gets the real answer.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from plugin_api.contract.decision import Decision
from plugin_api.device_info import DeviceInfo
from plugin_api.gpu.torch_gemm import TorchGemmRuns, int_mm_shape, wants_accumulator
from plugin_api.ops.gemm import GemmSpec

from .rules import arch_of

OUT_DTYPE_MM_SINCE = Version("2.8")  # aten::mm.dtype on CUDA (pytorch#150812)


def _torch_version(info: DeviceInfo) -> Version | None:
    if info.torch is None:
        return None
    try:
        return Version(info.torch.version.split("+")[0])
    except InvalidVersion:
        return None


class TorchCudaGemm(TorchGemmRuns):
    name = "torch-cublas"
    backend = "cuda-sm90"

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision:
        if arch_of(info) is None:
            return Decision.reject("no SM90/SM100/SM12x NVIDIA GPU in this DeviceInfo")
        tv = _torch_version(info)
        if spec.scaled:
            shape = int_mm_shape(spec)
            if not shape.ok:
                return shape
            return Decision.accept("torch._int_mm int32 accumulation, fp32 per-token/channel scale")
        if wants_accumulator(spec):
            if tv is None or tv < OUT_DTYPE_MM_SINCE:
                return Decision.reject(
                    f"fp32 output of a {spec.weight_dtype} GEMM needs torch.mm(out_dtype="
                    f"float32) (torch >= {OUT_DTYPE_MM_SINCE}); torch here: "
                    f"{info.torch.version if info.torch else 'none'}"
                )
            return Decision.accept("torch.mm(out_dtype=float32): cuBLAS fp32 accumulator as output")
        return Decision.accept("torch.mm/addmm (cuBLAS)")


def implementations() -> tuple[TorchCudaGemm]:
    return (TorchCudaGemm(),)

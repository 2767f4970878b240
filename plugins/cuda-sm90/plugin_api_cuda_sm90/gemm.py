"""GEMM on CUDA through torch: the host's ``TorchGemm`` (cuBLAS underneath), with an fp32 output
straight from the fp32 accumulator (``torch.mm(..., out_dtype=torch.float32)``) for the LM head,
and int8 W8A8 through ``torch._int_mm``.

This plugin's evidence is rules on ``DeviceInfo``: the GPU architecture (``rules.arch_of``) and
the torch version, so a what-if ``DeviceInfo`` gets the real answer. ``prepare`` still checks
both features on the device; a missing one is an error, never emulated.
"""

from __future__ import annotations

import torch
from packaging.version import InvalidVersion, Version

from plugin_api.contract.decision import Decision
from plugin_api.device_info import DeviceInfo
from plugin_api.gpu.platforms import CUDA
from plugin_api.gpu.torch_gemm import TorchGemm

from .rules import arch_of

OUT_DTYPE_MM_SINCE = Version("2.8")  # aten::mm.dtype on CUDA (pytorch#150812)


def _torch_version(info: DeviceInfo) -> Version | None:
    if info.torch is None:
        return None
    try:
        return Version(info.torch.version.split("+")[0])
    except InvalidVersion:
        return None


def on_supported_gpu(info: DeviceInfo) -> Decision:
    """An SM90/SM100/SM12x NVIDIA GPU: the architectures this plugin has rules for."""
    if arch_of(info) is None:
        return Decision.reject("no SM90/SM100/SM12x NVIDIA GPU in this DeviceInfo")
    return Decision.accept()


def mm_out_dtype(info: DeviceInfo) -> Decision:
    """``torch.mm(out_dtype=float32)`` (bf16 and fp16 inputs) is in torch's CUDA build since 2.8."""
    tv = _torch_version(info)
    here = info.torch.version if info.torch else "none"
    if tv is None or tv < OUT_DTYPE_MM_SINCE:
        return Decision.reject(
            f"torch.mm(out_dtype=float32) on CUDA needs torch >= {OUT_DTYPE_MM_SINCE}; "
            f"torch here: {here}"
        )
    return Decision.accept(
        f"torch.mm(out_dtype=float32) on CUDA (torch {here}): the cuBLAS fp32 accumulator as output"
    )


def int_mm(info: DeviceInfo) -> Decision:
    """``torch._int_mm`` is cuBLASLt's exact int8 GEMM on every architecture ``arch_of`` names."""
    return Decision.accept(f"torch._int_mm on {arch_of(info)} (cuBLASLt int8)")


def implementations() -> tuple[TorchGemm]:
    return (
        TorchGemm(
            "torch-cublas",
            "cuda-sm90",
            CUDA,
            device=on_supported_gpu,
            mm_out_dtype=mm_out_dtype,
            int_mm=int_mm,
            accumulator_weights=(torch.bfloat16, torch.float16),
        ),
    )

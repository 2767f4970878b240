"""GEMM on CUDA: two implementations, asked in this order (the host takes the first that
accepts a spec, ``plugin_api.backend.resolve_op``):

1. ``triton``: the host's Triton int8 ``scaled_mm`` (``plugin_api.triton.scaled_mm``), for
   int8 W8A8 specs only: one launch, no allocation, no host sync, any N and K. It rejects
   float specs, and every spec where no Triton >= 3.0 is installed.
2. ``torch-cublas``: the host's ``TorchGemm`` (cuBLAS underneath) for every float spec, with an
   fp32 output straight from the fp32 accumulator (``torch.mm(..., out_dtype=torch.float32)``)
   for the LM head; and int8 through ``torch._int_mm`` (N and K multiples of 8) where the
   Triton kernel is not available, named in the op's trace and provenance.

This plugin's evidence is rules on ``DeviceInfo``: the GPU architecture (``rules.arch_of``), the
torch version and the Triton found, so a what-if ``DeviceInfo`` gets the real answer.
``prepare`` still checks torch's features on the device; a missing one is an error, never
emulated.
"""

from __future__ import annotations

import torch
from packaging.version import InvalidVersion, Version

from plugin_api.contract.decision import Decision
from plugin_api.device_info import DeviceInfo
from plugin_api.gpu.platforms import CUDA
from plugin_api.gpu.torch_gemm import TorchGemm
from plugin_api.triton.impl import TritonScaledMm

from .probe import TRITON
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


def implementations() -> tuple[TritonScaledMm, TorchGemm]:
    """In the order the host asks them: the Triton int8 kernel first, then torch."""
    return (
        TritonScaledMm(TRITON),
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

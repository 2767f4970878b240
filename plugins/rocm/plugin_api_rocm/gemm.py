"""GEMM on AMD GPUs: int8 W8A8 ``scaled_mm`` on the host's Triton kernel, the rest through torch
(hipBLASLt underneath), the host's ``TorchGemm``.

The host asks the implementations in order: ``triton`` takes int8 specs (one launch, bit-exact,
any N and K up to its bound; compiled for gfx942 in CI) where a Triton is installed, and rejects
float specs with the reason; ``torch-rocm`` serves float weights with fp32 accumulation, and int8
where Triton cannot. Its evidence is this plugin's machine facts: the LM head (bf16 x bf16 ->
fp32) only where ``rocm.mm_out_dtype`` shows ``torch.mm(..., out_dtype=torch.float32)`` running
on the GPU, and int8 only where ``rocm.int_mm`` shows an exact ``torch._int_mm``; otherwise each
is rejected with that reason (never emulated by upcasting). The device itself is the probe's to
judge (gfx architecture, HIP build).
"""

from __future__ import annotations

from plugin_api.gpu.torch_gemm import TorchGemm
from plugin_api.triton.impl import TritonScaledMm

from .facts import FACTS
from .probe import TRITON


def implementations() -> tuple[TritonScaledMm, TorchGemm]:
    """In the order the host asks them: the Triton int8 kernel first, then torch."""
    return (
        TritonScaledMm(TRITON),
        TorchGemm(
            "torch-rocm",
            FACTS.backend,
            FACTS.platform,
            device=None,
            mm_out_dtype=FACTS.mm_out_dtype,
            int_mm=FACTS.int_mm,
        ),
    )

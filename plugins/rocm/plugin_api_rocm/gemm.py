"""GEMM on AMD GPUs through torch (hipBLASLt underneath): the host's ``TorchGemm``.

Float weights with fp32 accumulation. The LM head (bf16 x bf16 -> fp32) only where the
``rocm.mm_out_dtype`` fact shows ``torch.mm(..., out_dtype=torch.float32)`` running on the GPU,
and int8 ``scaled_mm`` only where ``rocm.int_mm`` shows an exact ``torch._int_mm``; otherwise
each is rejected with that reason (never emulated by upcasting).
"""

from __future__ import annotations

from plugin_api.gpu.torch_gemm import TorchGemm

from .facts import FACTS


def implementations() -> tuple[TorchGemm]:
    return (TorchGemm("torch-rocm", FACTS),)

"""GEMM on AMD GPUs through torch (hipBLASLt underneath): the host's ``TorchGemm``.

Float weights with fp32 accumulation. This plugin's evidence is its machine facts: the LM head
(bf16 x bf16 -> fp32) only where ``rocm.mm_out_dtype`` shows ``torch.mm(...,
out_dtype=torch.float32)`` running on the GPU, and int8 ``scaled_mm`` only where ``rocm.int_mm``
shows an exact ``torch._int_mm``; otherwise each is rejected with that reason (never emulated by
upcasting). The device itself is the probe's to judge (gfx architecture, HIP build).
"""

from __future__ import annotations

from plugin_api.gpu.torch_gemm import TorchGemm

from .facts import FACTS


def implementations() -> tuple[TorchGemm]:
    return (
        TorchGemm(
            "torch-rocm",
            FACTS.backend,
            FACTS.platform,
            device=None,
            mm_out_dtype=FACTS.mm_out_dtype,
            int_mm=FACTS.int_mm,
        ),
    )

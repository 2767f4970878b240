"""GEMM on Intel GPUs through torch (oneDNN underneath): the host's ``TorchGemm``.

Float weights with fp32 accumulation. This plugin's evidence is its machine facts: the LM head
(bf16 x bf16 -> fp32) only where ``xpu.mm_out_dtype`` says ``torch.mm(...,
out_dtype=torch.float32)`` runs on the XPU, else rejected with that reason (an fp32 result built
from an upcast weight, or from a rounded bf16 result, is not the accumulator the contract asks
for). No int8 GEMM is offered. The device itself is the probe's to judge.
"""

from __future__ import annotations

from plugin_api.gpu.torch_gemm import TorchGemm

from .facts import FACTS


def implementations() -> tuple[TorchGemm]:
    return (
        TorchGemm(
            "torch-xpu",
            FACTS.backend,
            FACTS.platform,
            device=None,
            mm_out_dtype=FACTS.mm_out_dtype,
            int_mm=None,
        ),
    )

"""The xpu GEMM's decisions per spec. Its torch calls are the host's ``TorchGemm`` (run against
the oracles in ``tests/test_torch_gemm.py``); on an Intel GPU the conformance kit runs them there.
"""

from __future__ import annotations

import pytest
import torch

from plugin_api.gpu.torch_facts import MM_OUT_DTYPE
from plugin_api.machines import MACHINES
from plugin_api.ops.gemm import GemmSpec
from plugin_api_xpu.facts import FACTS
from plugin_api_xpu.gemm import implementations

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
YES = {FACTS.key(MM_OUT_DTYPE): "yes: torch 2.13.0+xpu computes it"}


@pytest.mark.parametrize(
    "w,o,ok,reason",
    [
        (BF16, BF16, True, "torch.mm on XPU, bf16 in and out, fp32 accumulation"),
        (FP16, FP16, True, "torch.mm on XPU, fp16 in and out, fp32 accumulation"),
        (FP32, FP32, True, "torch.mm on XPU, fp32 in and out, fp32 accumulation"),
        (BF16, FP32, True, "bf16 -> fp32: torch.mm(out_dtype=float32) on XPU: torch 2.13.0+xpu"),
        (FP16, FP32, False, "fp16 -> fp32: only bf16 -> fp32 is feature-detected"),
        (torch.int8, BF16, False, "int8 scaled_mm: this plugin has no int8 GEMM kernel"),
    ],
)
def test_decisions(w, o, ok, reason):
    (gemm,) = implementations()
    d = gemm.supports(GemmSpec(4096, 4096, w, o), MACHINES["max-1550"].with_facts(YES))
    assert d.ok is ok and d.because().startswith(reason), d.reasons

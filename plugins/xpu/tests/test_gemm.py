"""The xpu GEMM: its decisions per spec, and its torch calls on CPU tensors against fp64.

The torch calls are the same on any device; on an Intel GPU the conformance kit runs them there.
"""

from __future__ import annotations

import pytest
import torch

from plugin_api.conformance import oracle
from plugin_api.conformance.test_gemm import TOLERANCE
from plugin_api.machines import MACHINES
from plugin_api.ops.gemm import GemmSpec
from plugin_api.reference.gemm import has_out_dtype_mm
from plugin_api_xpu import facts
from plugin_api_xpu.gemm import XpuGemm

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
YES = {facts.MM_OUT_DTYPE: "yes: torch 2.13.0+xpu computes it"}


@pytest.mark.parametrize(
    "w,o,ok,reason",
    [
        (BF16, BF16, True, "torch.mm on xpu, bf16 in and out, fp32 accumulation"),
        (FP16, FP16, True, "torch.mm on xpu, fp16 in and out, fp32 accumulation"),
        (FP32, FP32, True, "torch.mm on xpu, fp32 in and out, fp32 accumulation"),
        (BF16, FP32, True, "bf16 -> fp32: torch.mm(out_dtype=float32) on xpu: torch 2.13.0+xpu"),
        (FP16, FP32, False, "fp16 -> fp32: only bf16 -> fp32 is feature-detected"),
        (torch.int8, BF16, False, "int8 scaled_mm: this plugin has no int8 GEMM kernel"),
    ],
)
def test_decisions(w, o, ok, reason):
    d = XpuGemm().supports(GemmSpec(4096, 4096, w, o), MACHINES["max-1550"].with_facts(YES))
    assert d.ok is ok and d.because().startswith(reason), d.reasons


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_same_dtype_mm(dtype, with_bias):
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 130, generator=g).to(dtype), torch.randn(7, 130, generator=g).to(dtype)
    bias = torch.randn(96, generator=g).to(dtype) if with_bias else None
    spec, impl = GemmSpec(96, 130, dtype, dtype), XpuGemm()
    out = torch.full((7, 96), float("nan"), dtype=dtype)
    impl.mm(spec, x, impl.prepare(spec, w, None), bias, out)
    torch.testing.assert_close(out.double(), oracle.gemm(x, w, bias), **TOLERANCE[dtype])


@pytest.mark.skipif(
    not has_out_dtype_mm(torch.device("cpu")),
    reason=f"torch {torch.__version__} has no torch.mm(out_dtype=float32) on the CPU to run it",
)
def test_fp32_accumulator_mm():
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(64, 256, generator=g).to(BF16), torch.randn(5, 256, generator=g).to(BF16)
    spec, impl = GemmSpec(64, 256, BF16, FP32, "lm_head"), XpuGemm()
    out = torch.full((5, 64), float("nan"))
    impl.mm(spec, x, impl.prepare(spec, w, None), None, out)
    torch.testing.assert_close(out.double(), oracle.gemm(x, w), **TOLERANCE[FP32])

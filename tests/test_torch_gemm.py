"""The host's torch GEMM (``plugin_api.gpu.torch_gemm``, used by xpu, rocm and cuda-sm90): its
decisions from machine facts (the evidence rocm and xpu pass), and its torch calls on CPU tensors
against the fp64/int64 oracles. The calls are the same on any device; on a GPU the conformance
kit runs them there."""

from __future__ import annotations

import pytest
import torch

from plugin_api.conformance import oracle
from plugin_api.conformance.test_gemm import TOLERANCE
from plugin_api.contract.decision import Decision
from plugin_api.device_info import DeviceInfo
from plugin_api.errors import UnsupportedSpec
from plugin_api.gpu.platforms import ROCM
from plugin_api.gpu.torch_facts import INT_MM, MM_OUT_DTYPE, TorchFacts
from plugin_api.gpu.torch_gemm import TorchGemm, int_mm_shape, out_dtype_mm
from plugin_api.machines import MACHINES
from plugin_api.ops.gemm import GemmSpec

BF16, FP16, FP32, INT8 = torch.bfloat16, torch.float16, torch.float32, torch.int8
FACTS = TorchFacts("test", ROCM)
IMPL = TorchGemm(
    "torch-test", "test", ROCM, device=None, mm_out_dtype=FACTS.mm_out_dtype, int_mm=FACTS.int_mm
)


def _info(mm: str | None, int_mm: str | None):
    found = {FACTS.key(MM_OUT_DTYPE): mm, FACTS.key(INT_MM): int_mm}
    return MACHINES["mi300x"].with_facts({k: v for k, v in found.items() if v is not None})


@pytest.mark.parametrize(
    "spec,mm,int_mm,ok,reason",
    [
        (GemmSpec(64, 64, FP16, FP16), None, None, True, "torch.mm on ROCm, fp16 in and out"),
        (GemmSpec(64, 64, BF16, FP32), "yes: it runs", None, True, "bf16 -> fp32: torch.mm(out"),
        (
            GemmSpec(64, 64, BF16, FP32),
            "no: torch 2.9 raises for it on ROCm",
            None,
            False,
            "bf16 -> fp32 needs the fp32 accumulator: torch.mm(out_dtype=float32) on ROCm: "
            "torch 2.9 raises for it on ROCm",
        ),
        (
            GemmSpec(64, 64, BF16, FP32),
            None,
            None,
            False,
            "bf16 -> fp32 needs the fp32 accumulator: torch.mm(out_dtype=float32) on ROCm: not "
            "established for this machine description (fact 'test.mm_out_dtype' is read",
        ),
        (GemmSpec(64, 64, FP16, FP32), "yes: it runs", None, False, "fp16 -> fp32: only bf16"),
        (
            GemmSpec(64, 64, INT8, BF16),
            None,
            "yes: it runs",
            True,
            "int8 scaled_mm, int32 accumulation, fp32 scales: torch._int_mm on ROCm: it runs",
        ),
        (
            GemmSpec(64, 60, INT8, BF16),
            None,
            "yes: it runs",
            False,
            "int8 scaled_mm: torch._int_mm needs N and K multiples of 8, got K=60",
        ),
        (
            GemmSpec(64, 64, INT8, BF16),
            None,
            "no: torch._int_mm raised on ROCm (RuntimeError: not compiled)",
            False,
            "int8 scaled_mm needs torch._int_mm: torch._int_mm on ROCm: torch._int_mm raised",
        ),
    ],
)
def test_decisions_follow_the_facts(spec, mm, int_mm, ok, reason):
    d = IMPL.supports(spec, _info(mm, int_mm))
    assert d.ok is ok and d.because().startswith(reason), d.reasons


def test_int8_can_be_left_out():
    no_int8 = TorchGemm(
        "torch-test", "test", ROCM, device=None, mm_out_dtype=FACTS.mm_out_dtype, int_mm=None
    )
    d = no_int8.supports(GemmSpec(64, 64, INT8, BF16), _info(None, "yes: it runs"))
    assert not d.ok and d.reasons == ("int8 scaled_mm: this plugin has no int8 GEMM kernel",)


def test_a_rejected_device_is_the_answer_for_every_spec():
    def amd_gpu(info: DeviceInfo) -> Decision:
        if info.accelerators_of("amd"):
            return Decision.accept()
        return Decision.reject("no AMD GPU in this DeviceInfo")

    impl = TorchGemm(
        "torch-test", "test", ROCM, device=amd_gpu, mm_out_dtype=FACTS.mm_out_dtype, int_mm=None
    )
    for spec in (GemmSpec(64, 64, BF16, BF16), GemmSpec(64, 64, INT8, BF16)):
        assert impl.supports(spec, MACHINES["h200"]).reasons == ("no AMD GPU in this DeviceInfo",)
    assert impl.supports(GemmSpec(64, 64, BF16, BF16), MACHINES["mi300x"]).ok


def test_int_mm_shape_names_every_misaligned_dimension():
    d = int_mm_shape(GemmSpec(130, 100, INT8, BF16))
    assert not d.ok and d.because().endswith("got N=130, K=100")


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_same_dtype_mm(dtype, with_bias):
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 130, generator=g).to(dtype), torch.randn(7, 130, generator=g).to(dtype)
    bias = torch.randn(96, generator=g).to(dtype) if with_bias else None
    spec = GemmSpec(96, 130, dtype, dtype)
    out = torch.full((7, 96), float("nan"), dtype=dtype)
    IMPL.mm(spec, x, IMPL.prepare(spec, w, None), bias, out)
    torch.testing.assert_close(out.double(), oracle.gemm(x, w, bias), **TOLERANCE[dtype])


def test_fp32_accumulator_mm_or_its_refusal():
    """Where torch lacks mm(out_dtype=float32) on the device (the CPU in torch 2.13), prepare
    refuses: nothing is emulated. Where it has it, the result is the fp32 accumulator."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(64, 256, generator=g).to(BF16), torch.randn(5, 256, generator=g).to(BF16)
    spec = GemmSpec(64, 256, BF16, FP32, "lm_head")
    if not out_dtype_mm(torch.device("cpu"))[0]:
        with pytest.raises(UnsupportedSpec, match=r"no torch.mm\(out_dtype=float32\) on cpu"):
            IMPL.prepare(spec, w, None)
        return
    out = torch.full((5, 64), float("nan"))
    IMPL.mm(spec, x, IMPL.prepare(spec, w, None), None, out)
    torch.testing.assert_close(out.double(), oracle.gemm(x, w), **TOLERANCE[FP32])


@pytest.mark.parametrize("m", [1, 16, 17, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_scaled_mm_matches_oracle(m: int, bias: bool) -> None:
    """Fewer than 17 rows are zero-padded for torch._int_mm; the padding never shows."""
    g = torch.Generator().manual_seed(m)
    n, k = 64, 256
    wq = torch.randint(-127, 128, (n, k), generator=g, dtype=INT8)
    xq = torch.randint(-128, 128, (m, k), generator=g, dtype=INT8)
    sw, sx = torch.rand(n, generator=g) * 0.01, torch.rand(m, generator=g) * 0.02
    b = torch.randn(n, generator=g) if bias else None
    spec = GemmSpec(n, k, INT8, FP32)
    out = torch.full((m, n), float("nan"))
    IMPL.scaled_mm(spec, xq, sx, IMPL.prepare(spec, wq, sw), b, out)
    expect = oracle.scaled_gemm(xq, sx, wq, sw, b)
    torch.testing.assert_close(out.double(), expect, atol=1e-3, rtol=1e-5)

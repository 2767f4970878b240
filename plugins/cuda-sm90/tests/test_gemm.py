"""The GEMM implementation (the host's ``TorchGemm`` with this plugin's architecture and
torch-version rules): what it accepts (pure) and its run-time feature detection. Its torch
paths are the host's (``plugin_api.gpu.torch_gemm``), run against the oracles in
``tests/test_torch_gemm.py``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plugin_api.device_info import TorchBuild
from plugin_api.errors import UnsupportedSpec
from plugin_api.gpu.torch_gemm import out_dtype_mm
from plugin_api.machines import MACHINES
from plugin_api.ops.gemm import GemmSpec
from plugin_api_cuda_sm90.gemm import implementations

H200 = MACHINES["h200"]
LM_HEAD = GemmSpec(248320, 4096, torch.bfloat16, torch.float32, "lm_head")
(GEMM,) = implementations()


def test_lm_head_accepted_on_h200() -> None:
    d = GEMM.supports(LM_HEAD, H200)
    assert d.ok and "out_dtype=float32" in d.reasons[0]


def test_lm_head_refused_on_old_torch() -> None:
    old = dataclasses.replace(H200, torch=TorchBuild("2.7.1+cu126", cuda="12.6"))
    d = GEMM.supports(LM_HEAD, old)
    assert not d.ok and "torch >= 2.8" in d.reasons[0] and "2.7.1+cu126" in d.reasons[0]


@pytest.mark.parametrize(
    "n,k,ok", [(4096, 14336, True), (130, 512, False), (96, 100, False)], ids=str
)
def test_int8_alignment(n: int, k: int, ok: bool) -> None:
    d = GEMM.supports(GemmSpec(n, k, torch.int8, torch.bfloat16), H200)
    assert d.ok == ok, d.reasons
    if not ok:
        assert "multiples of 8" in d.reasons[0]


def test_no_gpu_no_gemm() -> None:
    d = GEMM.supports(LM_HEAD, MACHINES["xeon-cpu"])
    assert not d.ok and "no SM90/SM100/SM12x" in d.reasons[0]


def test_missing_out_dtype_mm_is_refused_not_emulated() -> None:
    """torch 2.13 on CPU lacks aten::mm.dtype: prepare must refuse, never upcast."""
    works, _ = out_dtype_mm(torch.device("cpu"))
    if works:
        pytest.skip("this torch computes mm(out_dtype=float32) on CPU; nothing to refuse")
    w = torch.randn(64, 32).to(torch.bfloat16)
    with pytest.raises(UnsupportedSpec, match=r"no torch.mm\(out_dtype=float32\)"):
        GEMM.prepare(GemmSpec(64, 32, torch.bfloat16, torch.float32), w, None)

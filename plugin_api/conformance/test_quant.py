"""Conformance: per-token-group quantization, bit-exact against the element-wise oracle."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from plugin_api.contract import OpFamily
from plugin_api.contract.provenance import record_ops
from plugin_api.ops.quant import QuantSpec, per_token_group_quant

from . import oracle
from .inputs import unchanged
from .plugin import own_or_skip

if TYPE_CHECKING:
    from plugin_api.backend import Backend

FP8 = torch.float8_e4m3fn


def _inputs(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 8
    if m > 2:
        x[1] = 0.0  # an all-zero row: eps decides the scale
        x[2, :8] = torch.tensor([127.0, -63.5, 0.5, 1.5, -2.5, 3.5, 1e-3, -1e4])  # ties, extremes
    return x.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == FP8 else t


@pytest.mark.parametrize("m,k", [(1, 128), (5, 384), (16, 512), (33, 256)])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("ue8m0", [False, True], ids=["", "ue8m0"])
def test_group_quant_bit_exact(
    plugin_api_backend: Backend,
    kit_device: torch.device,
    m: int,
    k: int,
    group: int,
    dtype: torch.dtype,
    layout: str,
    ue8m0: bool,
) -> None:
    col = layout == "col"
    x = _inputs(m, k, torch.bfloat16, seed=m * k + group)
    own_or_skip(plugin_api_backend, OpFamily.QUANT, QuantSpec(k, group, x.dtype, dtype, col, ue8m0))
    eps = 1e-10
    x_dev = x.to(kit_device)
    with record_ops() as calls, unchanged(plugin_api_backend.id, x=x_dev):
        q, s = per_token_group_quant(
            x_dev, group, dtype, eps, col, ue8m0, backend=plugin_api_backend
        )
    assert len(calls) == 1 and not calls[0].fallback
    want_q, want_s = oracle.group_quant(x, group, dtype, eps, ue8m0)
    assert s.shape == (m, k // group) and s.dtype == torch.float32
    if col and m > 1 and k // group > 1:
        assert s.stride() == (1, m), "column-major scales must have strides (1, M)"
    assert torch.equal(s.cpu(), want_s), "scales differ from the documented rule"
    assert torch.equal(_bits(q.cpu()), _bits(want_q)), "quantized values differ"


@pytest.mark.parametrize("in_dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
def test_input_dtypes(
    plugin_api_backend: Backend, kit_device: torch.device, in_dtype: torch.dtype, dtype: torch.dtype
) -> None:
    x = _inputs(8, 256, in_dtype, seed=3)
    own_or_skip(plugin_api_backend, OpFamily.QUANT, QuantSpec(256, 128, in_dtype, dtype))
    q, s = per_token_group_quant(x.to(kit_device), 128, dtype, backend=plugin_api_backend)
    want_q, want_s = oracle.group_quant(x, 128, dtype, 1e-10, False)
    assert torch.equal(s.cpu(), want_s) and torch.equal(_bits(q.cpu()), _bits(want_q))


@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("ue8m0", [False, True], ids=["", "ue8m0"])
def test_non_finite_input(
    plugin_api_backend: Backend,
    kit_device: torch.device,
    in_dtype: torch.dtype,
    dtype: torch.dtype,
    ue8m0: bool,
) -> None:
    """docs/ops.md's rule for NaN and inf: a NaN makes its group's scale NaN (ue8m0: 1.0), NaN
    quotients (its group, inf / inf) get int8 0 and fp8 NaN. fp8 NaN codes are compared
    without their sign: inf / inf's default NaN is negative on x86 (where the oracle runs) and
    positive on GPUs. 32 groups of 128: kernels that plan groups in batches see all of them."""
    x = _inputs(4, 1024, torch.float32, seed=9)
    x[0, 3] = float("nan")
    x[2, 5 * 128 + 7] = float("inf")
    x[3, 1] = -float("inf")
    x = x.to(in_dtype)
    own_or_skip(
        plugin_api_backend, OpFamily.QUANT, QuantSpec(1024, 128, in_dtype, dtype, False, ue8m0)
    )
    q, s = per_token_group_quant(
        x.to(kit_device), 128, dtype, 1e-10, False, ue8m0, backend=plugin_api_backend
    )
    want_q, want_s = oracle.group_quant(x, 128, dtype, 1e-10, ue8m0)
    s = s.cpu()
    assert torch.equal(s.isnan(), want_s.isnan()) and bool(s.isnan().any()) != ue8m0
    assert torch.equal(s.nan_to_num(), want_s.nan_to_num()), "scales differ from the rule"
    got, want = _bits(q.cpu()), _bits(want_q)
    if dtype == FP8:
        nan = want_q.float().isnan()
        got, want = torch.where(nan, got | 0x80, got), torch.where(nan, want | 0x80, want)
    assert torch.equal(got, want), "quantized values of non-finite input differ from the rule"


def test_preallocated_outputs_fully_written(
    plugin_api_backend: Backend, kit_device: torch.device
) -> None:
    x = _inputs(6, 256, torch.bfloat16, seed=4)
    own_or_skip(plugin_api_backend, OpFamily.QUANT, QuantSpec(256, 64, x.dtype, torch.int8))
    out = torch.full((6, 256), 77, dtype=torch.int8, device=kit_device)
    scales = torch.full((6, 4), float("nan"), device=kit_device)
    per_token_group_quant(
        x.to(kit_device), 64, out=out, out_scales=scales, backend=plugin_api_backend
    )
    want_q, want_s = oracle.group_quant(x, 64, torch.int8, 1e-10, False)
    assert torch.equal(out.cpu(), want_q) and torch.equal(scales.cpu(), want_s)

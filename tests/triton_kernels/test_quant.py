"""The Triton group-quant kernel against the independent element-wise oracle, bit for bit.

Every call goes through the host op on the fixture backend; provenance proves that the Triton
kernel produced the result (the backend is strict, so no reference fallback could hide).
"""

from __future__ import annotations

import pytest
import torch

from plugin_api.conformance import oracle
from plugin_api.contract.decision import ImplPath
from plugin_api.contract.provenance import record_ops
from plugin_api.ops.quant import per_token_group_quant

FP8 = torch.float8_e4m3fn


def _inputs(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 8
    x[1] = 0.0  # all zeros: eps decides the scale
    x[2, :8] = torch.tensor([127.0, -63.5, 0.5, 1.5, -2.5, 3.5, 1e-3, -1e4])  # ties, extremes
    x[3, ::3] *= 1e-30  # tiny values: fp8 subnormals and underflow to signed zero
    return x.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == FP8 else t


def _check(backend, device, x, group, dtype, col, ue8m0, eps=1e-10):
    with record_ops() as calls:
        q, s = per_token_group_quant(x.to(device), group, dtype, eps, col, ue8m0, backend=backend)
    assert len(calls) == 1, calls
    p = calls[0]
    assert (p.path, p.impl, p.backend, p.fallback) == (ImplPath.TRITON, "triton", backend.id, False)
    want_q, want_s = oracle.group_quant(x, group, dtype, eps, ue8m0)
    m, groups = x.shape[0], x.shape[1] // group
    assert s.shape == (m, groups) and s.dtype == torch.float32
    if col:
        assert s.stride() == (1, m)
    assert torch.equal(s.cpu(), want_s), "scales differ from the documented rule"
    assert torch.equal(_bits(q.cpu()), _bits(want_q)), "quantized values differ"


@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("ue8m0", [False, True], ids=["", "ue8m0"])
def test_bit_exact(triton_backend, triton_device, group, dtype, layout, ue8m0):
    x = _inputs(6, 3 * group, torch.bfloat16, seed=group)
    _check(triton_backend, triton_device, x, group, dtype, layout == "col", ue8m0)


@pytest.mark.parametrize("in_dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
def test_input_dtypes(triton_backend, triton_device, in_dtype, dtype):
    _check(triton_backend, triton_device, _inputs(5, 256, in_dtype, 3), 128, dtype, False, False)


@pytest.mark.parametrize("group", [96, 1024], ids=["not-pow2", "looped"])
def test_groups_outside_one_tile(triton_backend, triton_device, group):
    """A group that is not a power of two (masked tile), and one larger than the launch
    table's tile on every device (two passes over the group)."""
    x = _inputs(4, 2 * group, torch.bfloat16, seed=group)
    _check(triton_backend, triton_device, x, group, FP8, True, True)
    _check(triton_backend, triton_device, x, group, torch.int8, False, False)


@pytest.mark.parametrize("eps", [1e-40, 3e-39], ids=["deep-subnormal", "subnormal"])
def test_subnormal_scales(triton_backend, triton_device, eps):
    """All-zero rows with a tiny eps: the scale is subnormal, and ue8m0 must round it up to a
    power of two exactly (the bit trick has a separate subnormal path)."""
    x = torch.zeros(4, 64, dtype=torch.float32)
    x[0, 0] = 1e-39
    for ue8m0 in (False, True):
        _check(triton_backend, triton_device, x, 32, torch.int8, False, ue8m0, eps=eps)


def test_preallocated_outputs_fully_written(triton_backend, triton_device):
    x = _inputs(6, 256, torch.bfloat16, seed=4).to(triton_device)
    out = torch.full((6, 256), 77, dtype=torch.int8, device=triton_device)
    scales = torch.full((6, 4), float("nan"), device=triton_device)
    per_token_group_quant(x, 64, out=out, out_scales=scales, backend=triton_backend)
    want_q, want_s = oracle.group_quant(x.cpu(), 64, torch.int8, 1e-10, False)
    assert torch.equal(out.cpu(), want_q) and torch.equal(scales.cpu(), want_s)


@pytest.mark.parametrize("group", [64, 1024], ids=["one-tile", "looped"])
@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("ue8m0", [False, True], ids=["", "ue8m0"])
def test_non_finite_input(triton_backend, triton_device, group, dtype, ue8m0):
    """A NaN makes its group's scale NaN (ue8m0: 1.0), NaN quotients (its group, inf / inf)
    get int8 0 and fp8 NaN, as the reference computes them; a GPU's max would drop the NaN
    unless the kernel counts it. fp8 NaN codes are compared without their sign: the default
    NaN of inf / inf is negative on x86 (where the oracle runs) and positive on GPUs."""
    x = _inputs(4, 2 * group, torch.float32, seed=7)
    x[0, 3] = float("nan")
    x[2, group + 5] = float("inf")
    x[3, 1] = -float("inf")
    q, s = per_token_group_quant(
        x.to(triton_device), group, dtype, 1e-10, False, ue8m0, backend=triton_backend
    )
    want_q, want_s = oracle.group_quant(x, group, dtype, 1e-10, ue8m0)
    s = s.cpu()
    assert torch.equal(s.isnan(), want_s.isnan()) and s.isnan().any() != ue8m0
    assert torch.equal(s.nan_to_num(), want_s.nan_to_num())
    got, want = _bits(q.cpu()), _bits(want_q)
    if dtype == FP8:
        nan = want_q.float().isnan()
        assert nan.any()
        got, want = torch.where(nan, got | 0x80, got), torch.where(nan, want | 0x80, want)
    assert torch.equal(got, want)

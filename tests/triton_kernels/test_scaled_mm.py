"""The Triton int8 ``scaled_mm`` through the host ops, bit for bit against the reference.

A W8A8 layer as a model runs it: the bf16 activation quantized per token by the host's quant op
(one group of K), then ``scaled_mm`` into a preallocated output. The backend is the
directory's fixture distribution (conftest), serving gemm and quant with the host's Triton
implementations, strict (no fallback could hide); provenance proves the Triton kernels ran.
N and K are not multiples of 8 or 16, so every tile edge is masked; M covers both launch-table
tiers (decode, prefill).
"""

from __future__ import annotations

import pytest
import torch

from plugin_api.backend import Backend, backend_for
from plugin_api.contract.decision import ImplPath
from plugin_api.contract.provenance import record_ops
from plugin_api.ops import gemm
from plugin_api.ops.quant import per_token_group_quant

from .conftest import BACKEND

TRITON = ("triton", ImplPath.TRITON, BACKEND, False)  # the conftest's fixture backend
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bits, so that equal NaNs compare equal and -0.0 differs from 0.0."""
    return t.cpu().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w_q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    return w_q, torch.rand(n, generator=g) * 1e-2 + 1e-4


def _reference(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    ref = backend_for("reference")  # on the device it selected: the CPU, or the GPU's
    d = ref.device
    w, w_s = w_q.to(d), w_scale.to(d)
    packed = gemm.prepare(w, out_dtype=out_dtype, weight_scale=w_s, backend=ref)
    b = None if bias is None else bias.to(d)
    return gemm.scaled_mm(x_q.to(d), x_scale.to(d), packed, b).cpu()


def _scaled_mm(
    be: Backend,
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """``scaled_mm`` into ``out``, which must stay the caller's tensor (same memory)."""
    dev = out.device
    packed = gemm.prepare(
        w_q.to(dev), out_dtype=out.dtype, weight_scale=w_scale.to(dev), backend=be
    )
    ptr = out.data_ptr()
    with record_ops() as calls:
        got = gemm.scaled_mm(x_q, x_scale, packed, bias, out=out)
    assert got is out and out.data_ptr() == ptr
    assert [(c.impl, c.path, c.backend, c.fallback) for c in calls] == [TRITON]


@pytest.mark.parametrize("m", [1, 5, 16, 37, 128])
@pytest.mark.parametrize("out_dtype", list(OUT_DTYPES), ids=list(OUT_DTYPES))
@pytest.mark.parametrize("bias", ["nobias", "fp32-bias", "out-dtype-bias"])
def test_w8a8_layer_bit_exact(
    triton_backend: Backend, triton_device: torch.device, m: int, out_dtype: str, bias: str
) -> None:
    """Per-token int8 quant of a bf16 activation, then ``scaled_mm``: the output's bits equal
    the reference's on the same quantized activation."""
    dtype = OUT_DTYPES[out_dtype]
    n, k = (67, 200) if m % 2 else (200, 67)  # neither a multiple of 8; K=200: two K tiles
    g = torch.Generator().manual_seed(m)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16).to(triton_device)
    with record_ops() as calls:
        x_q, x_scale = per_token_group_quant(x, k, torch.int8, backend=triton_backend)
    assert [(c.impl, c.path, c.backend, c.fallback) for c in calls] == [TRITON]
    assert x_scale.shape == (m, 1)
    w_q, w_scale = _weight(n, k, seed=m)
    b = None
    if bias != "nobias":
        b_dtype = torch.float32 if bias == "fp32-bias" else dtype
        b = torch.randn(n, generator=g).to(b_dtype).to(triton_device)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=triton_device)
    _scaled_mm(triton_backend, x_q, x_scale, w_q, w_scale, b, out)
    want = _reference(x_q, x_scale, w_q, w_scale, b, dtype)
    assert torch.equal(_bits(out), _bits(want))


@pytest.mark.parametrize("m", [3, 37])
def test_into_a_view_of_a_larger_buffer(
    triton_backend: Backend, triton_device: torch.device, m: int
) -> None:
    """``out`` a block of a larger buffer (row stride wider than N): the block gets the result,
    every other element of the buffer keeps its bits. ``x_scale`` a strided column."""
    n, k = 67, 256  # K=256: whole K tiles (the unmasked loop)
    g = torch.Generator().manual_seed(7)
    x_q = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8).to(triton_device)
    scales = (torch.rand(m, 2, generator=g) * 1e-2).to(triton_device)
    x_scale = scales[:, :1]  # [M, 1] with row stride 2
    w_q, w_scale = _weight(n, k, seed=3)
    buf = torch.full((m + 4, n + 9), -7.0, dtype=torch.bfloat16, device=triton_device)
    before = _bits(buf).clone()
    out = buf[2 : 2 + m, 5 : 5 + n]
    _scaled_mm(triton_backend, x_q, x_scale, w_q, w_scale, None, out)
    want = _reference(x_q, x_scale, w_q, w_scale, None, torch.bfloat16)
    after = _bits(buf)
    assert torch.equal(after[2 : 2 + m, 5 : 5 + n], _bits(want))
    after[2 : 2 + m, 5 : 5 + n] = before[2 : 2 + m, 5 : 5 + n]
    assert torch.equal(after, before), "elements outside out's block changed"


def test_bf16_rounding_of_special_values(
    triton_backend: Backend, triton_device: torch.device
) -> None:
    """A zero activation makes each output its fp32 bias rounded to bf16: ties to even either
    way, a carry into the exponent, overflow to inf, subnormals, infinities and NaN, as the
    reference rounds them (torch's fp32 -> bf16 cast)."""
    one, tie_even, tie_odd = 1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8
    specials = [
        one,
        tie_even,  # halfway, even below: stays 1.0
        tie_odd,  # halfway, odd below: rounds up
        -tie_odd,
        1.0 + 2**-8 + 2**-20,  # just above halfway
        2.0 - 2**-9,  # rounds up into the next binade
        3.3895313892515355e38,  # the largest bf16, exactly
        3.4028234663852886e38,  # the largest fp32: rounds to inf
        1e-39,  # fp32 subnormal
        -3e-41,
        -0.0,
        float("inf"),
        float("-inf"),
        float("nan"),
    ]
    n, k, m = len(specials), 48, 2
    bias = torch.tensor(specials, dtype=torch.float32)
    x_q = torch.zeros((m, k), dtype=torch.int8)
    x_scale = torch.full((m,), 0.5)
    w_q, w_scale = _weight(n, k, seed=1)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=triton_device)
    dev = triton_device
    _scaled_mm(triton_backend, x_q.to(dev), x_scale.to(dev), w_q, w_scale, bias.to(dev), out)
    want = _reference(x_q, x_scale, w_q, w_scale, bias, torch.bfloat16)
    got = out.cpu()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(_bits(got)[~nan], _bits(want)[~nan])
    assert got[0, 1].item() == 1.0 and got[0, 2].item() == 1.0 + 2**-6  # ties to even
    assert got[0, 5].item() == 2.0 and got[0, 7].item() == float("inf")


def test_int32_sums_beyond_fp32_precision(
    triton_backend: Backend, triton_device: torch.device
) -> None:
    """Long K with extreme operands: int32 sums past 2^24, where the cast to fp32 rounds (to
    nearest even, as the reference's ``.float()``); the most negative products included."""
    m, n, k = 2, 24, 4096
    g = torch.Generator().manual_seed(5)
    x_q = torch.full((m, k), -128, dtype=torch.int8)
    x_q[1, ::3] = 127
    w_q = torch.where(torch.rand(n, k, generator=g) < 0.9, -128, 127).to(torch.int8)
    w_q[0] = -128  # 4096 * 16384 = 2^26 exactly
    w_scale = torch.rand(n, generator=g) + 0.5
    x_scale = torch.tensor([1.0, 0.75])
    out = torch.empty((m, n), dtype=torch.float32, device=triton_device)
    dev = triton_device
    _scaled_mm(triton_backend, x_q.to(dev), x_scale.to(dev), w_q, w_scale, None, out)
    want = _reference(x_q, x_scale, w_q, w_scale, None, torch.float32)
    assert torch.equal(_bits(out), _bits(want))
    exact = x_q.long() @ w_q.long().t()
    assert exact.abs().max() > 2**24 and exact[0, 0] == 2**26


def test_no_rows(triton_backend: Backend, triton_device: torch.device) -> None:
    """M = 0 (an empty batch): an empty result from the Triton implementation."""
    w_q, w_scale = _weight(24, 40, seed=2)
    x_q = torch.empty((0, 40), dtype=torch.int8, device=triton_device)
    x_scale = torch.empty((0,), dtype=torch.float32, device=triton_device)
    out = torch.empty((0, 24), dtype=torch.bfloat16, device=triton_device)
    _scaled_mm(triton_backend, x_q, x_scale, w_q, w_scale, None, out)

"""The exact rounding helpers, over every value where rounding can go wrong.

fp8 against torch's own cast (the definition the reference uses), half-to-even against
``torch.round``, the power-of-two ceiling against ``math.frexp``.
"""

from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton", reason="the triton extra is not installed")
tl = pytest.importorskip("triton.language")

from plugin_api.triton import numerics  # noqa: E402

FP8 = torch.float8_e4m3fn


@triton.jit
def _apply(x_ptr, o_ptr, n, WHICH: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    if WHICH == 0:
        y = numerics.fp8e4m3_bits(x)
    elif WHICH == 1:
        y = numerics.round_half_even(x).to(tl.int32)
    else:
        y = numerics.pow2_ceil(x).to(tl.int32, bitcast=True)
    tl.store(o_ptr + offs, y, mask=mask)


def _run(x: torch.Tensor, which: int, device: torch.device) -> torch.Tensor:
    x = x.to(device)
    out = torch.empty(x.shape, dtype=torch.int32, device=device)
    _apply[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), WHICH=which, BLOCK=1024)
    return out.cpu()


def _neighbours(v: torch.Tensor) -> torch.Tensor:
    """``v`` and the fp32 values one ulp either side."""
    up = torch.nextafter(v, torch.full_like(v, math.inf))
    down = torch.nextafter(v, torch.full_like(v, -math.inf))
    return torch.cat([v, up, down])


def test_fp8_bits_match_torch_cast(triton_device):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = codes.view(FP8).float()
    finite = finite[finite.isfinite() & (finite.abs() <= 448)].unique()  # every e4m3 value
    mids = (finite[1:] + finite[:-1]) / 2  # every tie, positive and negative
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-12, 9, (4096,)).float())
    x = _neighbours(torch.cat([finite, mids, spread.clamp(-448, 448), torch.tensor([-0.0])]))
    x = x.clamp(-448, 448)
    want = x.to(FP8).view(torch.uint8).to(torch.int32)
    got = _run(x, 0, triton_device)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, [(x[i].item(), got[i].item(), want[i].item()) for i in bad[:5]]


def test_round_half_even_matches_torch_round(triton_device):
    halves = torch.arange(-260, 260, dtype=torch.float32) + 0.5
    g = torch.Generator().manual_seed(1)
    x = _neighbours(torch.cat([halves, torch.randn(2048, generator=g) * 100, torch.zeros(1)]))
    assert torch.equal(_run(x, 1, triton_device), torch.round(x).to(torch.int32))


def test_pow2_ceil_matches_frexp(triton_device):
    g = torch.Generator().manual_seed(2)
    exps = torch.randint(-149, 127, (4096,)).float()
    x = (torch.rand(4096, generator=g) + 0.5) * torch.exp2(exps)
    x = torch.cat([x, torch.exp2(torch.arange(-149, 127).float())])  # exact powers, subnormals
    x = x[(x > 0) & x.isfinite()]
    x = _neighbours(x)
    x = x[(x > 0) & (x < 2.0**127)]

    def ceil(s: float) -> float:
        m, e = math.frexp(s)
        return s if m == 0.5 else math.ldexp(1.0, e)

    want = torch.tensor([ceil(v) for v in x.tolist()], dtype=torch.float32)
    assert torch.equal(_run(x, 2, triton_device), want.view(torch.int32))

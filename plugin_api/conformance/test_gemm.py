"""Conformance: mm and scaled_mm against fp64/int64 oracles, outputs pre-filled with NaN."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import torch

from plugin_api.contract import OpFamily
from plugin_api.contract.provenance import record_ops
from plugin_api.ops import gemm

from . import oracle
from .plugin import own_or_skip

if TYPE_CHECKING:
    from plugin_api.backend import Backend

# fp32 output is the fp32 accumulator: tight. bf16/fp16 output is it rounded once.
TOLERANCE: dict[torch.dtype, oracle.Tolerance] = {
    torch.float32: oracle.Tolerance(atol=1e-3, rtol=1e-4),
    torch.bfloat16: oracle.Tolerance(atol=2e-2, rtol=1.6e-2),
    torch.float16: oracle.Tolerance(atol=2e-3, rtol=2e-3),
}
SHAPES = [(1, 96, 100), (3, 64, 256), (17, 130, 512), (64, 256, 96)]  # (M, N, K); K=100: odd


def _prepare_or_skip(backend: Backend, w: torch.Tensor, **kw: Any) -> gemm.PackedWeight:
    spec = gemm.GemmSpec(
        w.shape[0],
        w.shape[1],
        w.dtype,
        kw.get("out_dtype") or (torch.bfloat16 if w.dtype == torch.int8 else w.dtype),
        kw.get("usage", "linear"),
    )
    own_or_skip(backend, OpFamily.GEMM, spec)
    return gemm.prepare(w, backend=backend, **kw)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize(
    "wdtype,odtype,usage",
    [
        (torch.bfloat16, torch.float32, "lm_head"),
        (torch.bfloat16, torch.bfloat16, "linear"),
        (torch.bfloat16, torch.float32, "linear"),
        (torch.float16, torch.float16, "linear"),
        (torch.float32, torch.float32, "linear"),
    ],
    ids=["bf16-f32-lmhead", "bf16-bf16", "bf16-f32", "fp16-fp16", "fp32-fp32"],
)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_mm(
    plugin_api_backend: Backend,
    kit_device: torch.device,
    m: int,
    n: int,
    k: int,
    wdtype: torch.dtype,
    odtype: torch.dtype,
    usage: gemm.Usage,
    with_bias: bool,
) -> None:
    g = torch.Generator().manual_seed(m * 7 + n + k)
    w = torch.randn(n, k, generator=g).to(wdtype).to(kit_device)
    x = torch.randn(m, k, generator=g).to(wdtype).to(kit_device)
    bias = torch.randn(n, generator=g).to(wdtype).to(kit_device) if with_bias else None
    packed = _prepare_or_skip(plugin_api_backend, w, out_dtype=odtype, usage=usage)
    out = torch.full((m, n), float("nan"), dtype=odtype, device=kit_device)
    with record_ops() as calls:
        y = gemm.mm(x, packed, bias, out=out)
    assert y is out and calls == [packed.provenance] and not packed.provenance.fallback
    expect = oracle.gemm(x.cpu(), w.cpu(), None if bias is None else bias.cpu())
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.cpu().double(), expect, **TOLERANCE[odtype])


def test_mm_strided_input(plugin_api_backend: Backend, kit_device: torch.device) -> None:
    """x may be a row slice of a wider buffer (row stride > K)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 96, generator=g).to(torch.bfloat16).to(kit_device)
    wide = torch.randn(5, 160, generator=g).to(torch.bfloat16).to(kit_device)
    x = wide[:, :96]
    packed = _prepare_or_skip(plugin_api_backend, w, out_dtype=torch.float32, usage="lm_head")
    y = gemm.mm(x, packed)
    torch.testing.assert_close(
        y.cpu().double(), oracle.gemm(x.cpu(), w.cpu()), **TOLERANCE[torch.float32]
    )


def test_lm_head_argmax_matches_fp32(plugin_api_backend: Backend, kit_device: torch.device) -> None:
    """Greedy decoding over fp32 logits agrees with the exact fp32 accumulator."""
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(4000, 256, generator=g) * 0.05).to(torch.bfloat16).to(kit_device)
    x = torch.randn(64, 256, generator=g).to(torch.bfloat16).to(kit_device)
    packed = _prepare_or_skip(plugin_api_backend, w, out_dtype=torch.float32, usage="lm_head")
    logits = gemm.mm(x, packed).cpu()
    exact = oracle.gemm(x.cpu(), w.cpu())
    agree = (logits.argmax(-1) == exact.argmax(-1)).float().mean().item()
    assert agree >= 0.98, f"argmax agrees on only {agree:.1%} of rows"


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("odtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_scaled_mm(
    plugin_api_backend: Backend,
    kit_device: torch.device,
    m: int,
    n: int,
    k: int,
    odtype: torch.dtype,
    with_bias: bool,
) -> None:
    g = torch.Generator().manual_seed(m + n * 3 + k)
    wq = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    xq = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    sw = torch.rand(n, generator=g) * 0.01 + 1e-4
    sx = torch.rand(m, generator=g) * 0.02 + 1e-4
    bias = torch.randn(n, generator=g) if with_bias else None
    dev = kit_device
    packed = _prepare_or_skip(
        plugin_api_backend, wq.to(dev), weight_scale=sw.to(dev), out_dtype=odtype
    )
    out = torch.full((m, n), float("nan"), dtype=odtype, device=dev)
    with record_ops() as calls:
        gemm.scaled_mm(
            xq.to(dev), sx.to(dev), packed, None if bias is None else bias.to(dev), out=out
        )
    assert calls == [packed.provenance]
    expect = oracle.scaled_gemm(xq, sx, wq, sw, bias)
    tol = TOLERANCE[odtype] if odtype != torch.float32 else oracle.Tolerance(atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(out.cpu().double(), expect, **tol)

"""Conformance: mm and scaled_mm against fp64/int64 oracles, outputs pre-filled with NaN.

Fixed shapes first, then the M bands: backends switch kernels by row count (GEMV for a few
rows, padded rows for the LM head, tile-sized blocks beyond), so every M in ``M_BANDS`` runs in
every session, each with N, K, dtypes and bias drawn from a seeded sample (``--plugin-api-seed``
repeats one; ``--plugin-api-gemm-draws`` widens it).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
import torch

from plugin_api.contract import OpFamily
from plugin_api.contract.provenance import record_ops
from plugin_api.ops import gemm

from . import oracle
from .inputs import unchanged
from .plugin import DRAWS_OPTION, kit_seed, mark_sampled, own_or_skip, reproducible

if TYPE_CHECKING:
    from plugin_api.backend import Backend

# fp32 output is the fp32 accumulator: tight. bf16/fp16 output is it rounded once.
TOLERANCE: dict[torch.dtype, oracle.Tolerance] = {
    torch.float32: oracle.Tolerance(atol=1e-3, rtol=1e-4),
    torch.bfloat16: oracle.Tolerance(atol=2e-2, rtol=1.6e-2),
    torch.float16: oracle.Tolerance(atol=2e-3, rtol=2e-3),
}
SHAPES = [(1, 96, 100), (3, 64, 256), (17, 130, 512), (64, 256, 96)]  # (M, N, K); K=100: odd
MM_DTYPES: dict[str, tuple[torch.dtype, torch.dtype, gemm.Usage]] = {
    "bf16-f32-lmhead": (torch.bfloat16, torch.float32, "lm_head"),
    "bf16-bf16": (torch.bfloat16, torch.bfloat16, "linear"),
    "bf16-f32": (torch.bfloat16, torch.float32, "linear"),
    "fp16-fp16": (torch.float16, torch.float16, "linear"),
    "fp32-fp32": (torch.float32, torch.float32, "linear"),
}
SCALED_OUT: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _straddle(*edges: int) -> list[int]:
    return [m for e in edges for m in (e - 1, e, e + 1)]


# Every M up to 16 (GEMV and padded-row kernels), then each side of the powers of two and of
# the tile edges that are multiples of 6, 12, 24 and 48 rows, up to 512, and two Ms beyond.
M_BANDS: tuple[int, ...] = tuple(
    sorted(
        {
            *range(1, 17),
            *_straddle(32, 64, 128, 256, 512),
            *_straddle(24, 48, 96, 192, 384),
            777,
            1000,
        }
    )
)
BAND_N = (64, 130, 257, 1024, 2048, 4096)
BAND_K = (96, 100, 257, 1024, 2048, 4096)  # 100 and 257: not a multiple of any vector width
MAX_MACS = 300_000_000  # M*N*K of one sampled case: the fp64 oracle stays under ~0.1 s


class BandCase(NamedTuple):
    m: int
    n: int
    k: int
    dtypes: str  # a key of MM_DTYPES (mm) or SCALED_OUT (scaled_mm)
    bias: bool

    @property
    def id(self) -> str:
        return f"{self.m}x{self.n}x{self.k}-{self.dtypes}-{'bias' if self.bias else 'nobias'}"


def band_cases(seed: int, draws: int, dtypes: list[str], salt: str) -> list[BandCase]:
    """``draws`` cases per M in ``M_BANDS``: N, K (within ``MAX_MACS``), dtypes and bias drawn
    from ``random.Random`` seeded by ``seed`` and ``salt`` (one stream per op). Deterministic:
    the same seed gives the same cases, in every pytest-xdist worker too."""
    rng = random.Random(f"{salt}:{seed}")
    out: dict[str, BandCase] = {}
    for m in M_BANDS:
        sizes = [(n, k) for n in BAND_N for k in BAND_K if m * n * k <= MAX_MACS]
        for _ in range(draws):
            n, k = rng.choice(sizes)
            case = BandCase(m, n, k, rng.choice(dtypes), rng.random() < 0.5)
            out.setdefault(case.id, case)
    return list(out.values())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The sampled band cases of ``test_mm_bands`` and ``test_scaled_mm_bands``."""
    names = {"test_mm_bands": list(MM_DTYPES), "test_scaled_mm_bands": list(SCALED_OUT)}
    if metafunc.function.__name__ not in names:
        return
    draws = max(1, int(metafunc.config.getoption(DRAWS_OPTION, 1) or 1))
    name = metafunc.function.__name__
    cases = band_cases(kit_seed(metafunc.config), draws, names[name], salt=name)
    metafunc.parametrize("case", cases, ids=[c.id for c in cases])


def _prepare_or_skip(backend: Backend, w: torch.Tensor, **kw: Any) -> gemm.PackedWeight:
    spec = gemm.GemmSpec(
        w.shape[0],
        w.shape[1],
        w.dtype,
        kw.get("out_dtype") or (torch.bfloat16 if w.dtype == torch.int8 else w.dtype),
        kw.get("usage", "linear"),
    )
    own_or_skip(backend, OpFamily.GEMM, spec)
    with unchanged(backend.id, weight=w, weight_scale=kw.get("weight_scale")):
        return gemm.prepare(w, backend=backend, **kw)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("wdtype,odtype,usage", list(MM_DTYPES.values()), ids=list(MM_DTYPES))
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
    check_mm(plugin_api_backend, kit_device, m, n, k, wdtype, odtype, usage, with_bias)


def test_mm_bands(
    plugin_api_backend: Backend,
    kit_device: torch.device,
    request: pytest.FixtureRequest,
    case: BandCase,
) -> None:
    """One sampled (N, K, dtypes, bias) for an M of ``M_BANDS``; see ``band_cases``."""
    wdtype, odtype, usage = MM_DTYPES[case.dtypes]
    mark_sampled(request, str(OpFamily.GEMM))
    with reproducible(request.config):
        check_mm(
            plugin_api_backend, kit_device, case.m, case.n, case.k, wdtype, odtype, usage, case.bias
        )


def check_mm(
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
    with record_ops() as calls, unchanged(plugin_api_backend.id, x=x, bias=bias):
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
    with unchanged(plugin_api_backend.id, x=x):
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
    with unchanged(plugin_api_backend.id, x=x):
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
    check_scaled_mm(plugin_api_backend, kit_device, m, n, k, odtype, with_bias)


def test_scaled_mm_bands(
    plugin_api_backend: Backend,
    kit_device: torch.device,
    request: pytest.FixtureRequest,
    case: BandCase,
) -> None:
    """int8 ``scaled_mm`` for an M of ``M_BANDS``, with a sampled N, K, out dtype and bias."""
    mark_sampled(request, str(OpFamily.GEMM))
    with reproducible(request.config):
        check_scaled_mm(
            plugin_api_backend,
            kit_device,
            case.m,
            case.n,
            case.k,
            SCALED_OUT[case.dtypes],
            case.bias,
        )


def check_scaled_mm(
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
    x_q, x_scale, b = xq.to(dev), sx.to(dev), None if bias is None else bias.to(dev)
    with record_ops() as calls, unchanged(plugin_api_backend.id, x_q=x_q, x_scale=x_scale, bias=b):
        gemm.scaled_mm(x_q, x_scale, packed, b, out=out)
    assert calls == [packed.provenance]
    expect = oracle.scaled_gemm(xq, sx, wq, sw, bias)
    tol = TOLERANCE[odtype] if odtype != torch.float32 else oracle.Tolerance(atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(out.cpu().double(), expect, **tol)

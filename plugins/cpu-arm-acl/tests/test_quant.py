"""The C++ group quant against the reference backend, bit for bit, on awkward inputs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from plugin_api.contract.provenance import record_ops
from plugin_api.machines import MACHINES
from plugin_api.ops.quant import QuantSpec, per_token_group_quant, scales_like
from plugin_api.reference.quant import ReferenceQuant
from plugin_api_cpu_arm_acl.quant import NativeGroupQuant

FP8 = torch.float8_e4m3fn


def _awkward(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows at many magnitudes, plus ties, zeros, -0.0 and fp8-subnormal ratios."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-6, 4, m).unsqueeze(1)
    x[0] = 0.0
    x[1, ::2] = -0.0
    x[2, :16] = torch.tensor([127.0, -63.5, 0.5, 1.5, -2.5, 3.5, 2.0**-9, -(2.0**-10)] * 2)
    x[3, : k // 2] = 1e-3 * torch.randn(k // 2, generator=g)  # tiny values next to a large one
    x[3, 0] = 448.0
    return x.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == FP8 else t


@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("group,k", [(128, 1024), (12, 96), (100, 300), (7168, 7168)])
@pytest.mark.parametrize("col,ue8m0", [(False, False), (True, False), (False, True), (True, True)])
def test_bit_exact_with_the_reference(onednn_backend, in_dtype, dtype, group, k, col, ue8m0):
    x = _awkward(37, k, in_dtype, seed=group + k)
    with record_ops() as calls:
        q, s = per_token_group_quant(x, group, dtype, 1e-10, col, ue8m0, backend=onednn_backend)
    assert [c.impl for c in calls] == ["cpp-group-quant"] and not calls[0].fallback
    spec = QuantSpec(k, group, in_dtype, dtype, col, ue8m0)
    want_q = torch.empty_like(q)
    want_s = scales_like(37, k // group, col, torch.device("cpu"))
    ReferenceQuant().quantize(spec, x, 1e-10, want_q, want_s)
    assert s.stride() == want_s.stride()
    assert torch.equal(s, want_s)
    assert torch.equal(_bits(q), _bits(want_q))


@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("group,k", [(128, 7168), (64, 320), (100, 300)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("col", [False, True], ids=["row-scales", "col-scales"])
def test_streamed_codes_are_the_same(in_dtype, dtype, group, k, threads, col):
    """Codes streamed past the caches (forced here for small outputs) equal the reference's,
    one and two threads, and rows whose groups are not 64-byte aligned (group 100: those keep
    normal stores); column-major scales then stream their whole 16-row lines (m = 64: aligned
    columns; bands split between threads)."""
    m = 64 if col else 45
    x = _awkward(m, k, in_dtype, seed=k)
    spec = QuantSpec(k, group, in_dtype, dtype, col)
    q, s = torch.empty(m, k, dtype=dtype), scales_like(m, k // group, col, torch.device("cpu"))
    s.fill_(float("nan"))
    NativeGroupQuant(threads=threads, stream_min_bytes=0).quantize(spec, x, 1e-10, q, s)
    want_q, want_s = torch.empty_like(q), torch.empty_like(s)
    ReferenceQuant().quantize(spec, x, 1e-10, want_q, want_s)
    assert torch.equal(s, want_s)
    assert torch.equal(_bits(q), _bits(want_q))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(
    "m,k,group", [(37, 384, 128), (50, 7 * 64, 64), (16, 256, 128), (4, 96, 32)]
)
def test_column_major_scales_in_bands_split_between_threads(threads, m, k, group):
    """Column-major scales are gathered per band of 16 rows and written as runs; threads split
    the groups mid-row and mid-band (37 x 3 groups over 2 or 3 threads), and every scale must
    land exactly once: the output starts as NaN, and its other columns' bands are compared."""
    x = _awkward(m, k, torch.bfloat16, seed=m * k)
    spec = QuantSpec(k, group, torch.bfloat16, torch.int8, True)
    q = torch.empty(m, k, dtype=torch.int8)
    s = scales_like(m, k // group, True, torch.device("cpu")).fill_(float("nan"))
    NativeGroupQuant(threads=threads).quantize(spec, x, 1e-10, q, s)
    want_q, want_s = torch.empty_like(q), torch.empty_like(s)
    ReferenceQuant().quantize(spec, x, 1e-10, want_q, want_s)
    assert s.stride() == (1, m)
    assert torch.equal(s, want_s)
    assert torch.equal(q, want_q)


@pytest.mark.parametrize("smallest", [0, 8], ids=["with-fixed-point", "normal-only"])
def test_every_fp8_code_round_trips(onednn_backend, smallest):
    """All 253 finite e4m3 magnitudes (and midpoints between them) convert like torch does;
    normal-only: codes from 2^-6 up, a group the kernel converts without the per-vector test
    for the fixed-point range."""
    codes = torch.arange(smallest, 127, dtype=torch.uint8).view(FP8).float()  # .. 448
    mids = (codes[:-1] + codes[1:]) / 2  # exact ties: round half to even
    row = torch.cat([codes, -codes, mids, -mids, torch.tensor([448.0])])
    k = (row.numel() + 7) // 8 * 8
    x = torch.full((1, k), 448.0)
    x[0, : row.numel()] = row
    # group = K and a = 448 make s = 1, so x / s = x and only the fp8 conversion is tested
    q, s = per_token_group_quant(x, k, FP8, backend=onednn_backend)
    assert s.item() == 1.0
    assert torch.equal(q.view(torch.uint8), x.to(FP8).view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
def test_groups_with_a_subnormal_scale_are_clamped(onednn_backend, dtype):
    """A group of subnormal values gets a subnormal scale, whose rounding error can push x / s
    past qmax: the kernel's fast path (no clamp) must not take such groups."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 256, generator=g) * torch.logspace(-42, -36, 8).unsqueeze(1)
    x[:, 0] = torch.logspace(-42, -36, 8)  # each row's largest magnitude, positive
    spec = QuantSpec(256, 64, torch.float32, dtype, False, False)
    q, s = per_token_group_quant(x, 64, dtype, 1e-45, backend=onednn_backend)
    want_q, want_s = torch.empty_like(q), scales_like(8, 4, False, torch.device("cpu"))
    ReferenceQuant().quantize(spec, x, 1e-45, want_q, want_s)
    assert torch.equal(s, want_s) and (s < torch.finfo(torch.float32).tiny).any()
    assert torch.equal(_bits(q), _bits(want_q))
    assert (x / s.repeat_interleave(64, dim=1)).abs().max() > (127 if dtype == torch.int8 else 448)


@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("ue8m0", [False, True], ids=["fp32-scale", "ue8m0"])
@pytest.mark.parametrize("group", [128, 48])
def test_bf16_groups_planned_together_keep_their_odd_cases(dtype, ue8m0, group):
    """bf16 groups are planned several at a time: 16 of a multiple of 32 elements with AVX-512
    VBMI, else 8 of a multiple of 16 (group 48: only the latter). A NaN, an inf, an all-zero
    group, subnormal values (a subnormal scale), a group with one large value among tiny ones
    (fp8's fixed-point range) and -0.0, at different places in a batch. NaN quotients (the NaN's
    group, inf / inf) get the reference's codes: int8 0, fp8 NaN."""
    g = torch.Generator().manual_seed(11)
    k = 8 * group
    x = torch.randn(6, k, generator=g)  # 48 groups: three batches of 16
    x[0, 3 * group + 5] = float("nan")
    x[1, 1 * group + 40] = float("inf")
    x[1, 5 * group + 2] = -float("inf")
    x[2, 2 * group : 3 * group] = 0.0
    x[2, 7 * group : 8 * group] = -0.0
    x[3, 0:group] = torch.randn(group, generator=g) * 1e-39
    x[4, 4 * group : 5 * group] = torch.randn(group, generator=g) * 1e-4
    x[4, 4 * group + 9] = 300.0
    x = x.to(torch.bfloat16)
    spec = QuantSpec(k, group, torch.bfloat16, dtype, False, ue8m0)
    q, s = torch.empty(6, k, dtype=dtype), scales_like(6, 8, False, torch.device("cpu"))
    NativeGroupQuant(threads=2).quantize(spec, x, 1e-10, q, s)
    want_q, want_s = torch.empty_like(q), torch.empty_like(s)
    ReferenceQuant().quantize(spec, x, 1e-10, want_q, want_s)
    assert torch.equal(s.isnan(), want_s.isnan())  # the NaN group's (ue8m0: a power of two)
    assert torch.equal(s.nan_to_num(), want_s.nan_to_num())
    assert torch.equal(_bits(q), _bits(want_q))


@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.int8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("group", [120, 12], ids=["vector", "scalar-tail"])
def test_a_nan_makes_its_group_scale_nan_like_the_reference(onednn_backend, in_dtype, dtype, group):
    """A NaN (or inf / inf) quotient gets the reference's code: int8 0, fp8 NaN with its sign;
    group 12 sends the last 4 elements of each group through the scalar code."""
    x = torch.randn(2, 240)
    x[0, 5] = float("nan")  # early in the group, followed by numbers
    x[1, 200] = -float("nan")
    x[1, 11] = float("inf")  # the last element of a group of 12: the scalar tail
    x = x.to(in_dtype)
    q, s = per_token_group_quant(x, group, dtype, backend=onednn_backend)
    nan_groups = s.isnan()
    assert nan_groups[0, 0] and nan_groups[1, 200 // group]
    spec = QuantSpec(240, group, in_dtype, dtype)
    want_q, want_s = torch.empty_like(q), torch.empty_like(s)
    ReferenceQuant().quantize(spec, x, 1e-10, want_q, want_s)
    assert torch.equal(nan_groups, want_s.isnan())
    assert torch.equal(_bits(q), _bits(want_q))


@pytest.mark.parametrize(
    "drop,want",
    [((), "AVX-512"), (("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"), "AVX2")],
    ids=["avx512", "avx2-only"],
)
def test_the_decision_names_the_vector_path(drop, want):
    """The reason shown by doctor names the kernel's widest path for that CPU (an x86 host
    without AVX-512 runs the 8-lane path only); Arm runs the NEON path."""
    spec = QuantSpec(k=1024, in_dtype=torch.bfloat16, group_size=128, dtype=torch.int8)
    x86 = MACHINES["xeon-cpu"]
    info = replace(x86, cpu_flags=x86.cpu_flags - set(drop))
    reason = " ".join(NativeGroupQuant().supports(spec, info).reasons)
    assert reason.startswith(want + " ")
    arm = " ".join(NativeGroupQuant().supports(spec, MACHINES["graviton4"]).reasons)
    assert arm.startswith("NEON ")

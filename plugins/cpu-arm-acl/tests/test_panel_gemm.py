"""The panel GEMMs on this machine: bf16 and fp32 against fp64 oracles, int8 exact against int64
oracles, every ISA variant and block edge, awkward shapes and strides, and the C++ guards."""

from __future__ import annotations

import platform
import shutil
import subprocess

import pytest
import torch
from torch.utils.cpp_extension import include_paths

from plugin_api.device_info import DeviceInfo, TorchBuild, read_device_info
from plugin_api.ops.gemm import GemmSpec
from plugin_api.reference.gemm import ReferenceGemm
from plugin_api_cpu_arm_acl.build import CSRC, extension
from plugin_api_cpu_arm_acl.isa import panel_isa
from plugin_api_cpu_arm_acl.panel_gemm import PanelGemm
from plugin_api_cpu_arm_acl.settings import PanelPolicy

BF16, F32, F16, S8 = torch.bfloat16, torch.float32, torch.float16, torch.int8
BLOCKS = dict(kc=40, mc=7)  # small blocks, so that tiny shapes cross k-block and row-block edges
# every call block-major, 16-bit weights widened per k block
BLOCK_MAJOR = dict(BLOCKS, block_major_m=1)
EVERY_BLOCKING = pytest.mark.parametrize(
    "blocks", [BLOCKS, BLOCK_MAJOR, {}], ids=["small-blocks", "block-major", "default-blocks"]
)


def _isas() -> list[str]:
    return ["generic", "avx2"] if panel_isa(read_device_info()) == "avx2" else ["generic"]


@pytest.fixture(scope="module")
def panel_here(onednn_backend):
    """Skips unless the panel GEMM serves bf16 on this machine (the backend's info carries the
    kernel facts: the panel also serves bf16 where oneDNN's bf16 matmul is reference code)."""
    info = onednn_backend.info
    d = PanelGemm().supports(GemmSpec(64, 64, BF16, F32), info)
    if not d:
        pytest.skip(f"the panel GEMM does not serve bf16 here: {d.because()}")
    return info


def _impl(isa: str, threads: int = 2, **blocks: int) -> PanelGemm:
    return PanelGemm(policy=PanelPolicy(isa=isa, **blocks), threads=threads)


def _rand(*shape: int, seed: int, dtype: torch.dtype = BF16, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    if dtype == S8:
        return torch.randint(-128, 128, shape, generator=g, dtype=S8)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


@pytest.mark.parametrize("wdt", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("isa", _isas())
@EVERY_BLOCKING
@pytest.mark.parametrize("m,n,k", [(1, 37, 100), (6, 16, 1), (13, 130, 257), (20, 48, 80)])
def test_fp32_out_is_the_accumulator(panel_here, wdt, isa, blocks, m, n, k):
    """fp32 out against the fp64 oracle (products are exact, only the summation rounds); 16-bit
    out is that value rounded once; bias added in fp32 before the rounding."""
    impl = _impl(isa, **blocks)
    w, x = _rand(n, k, seed=1, dtype=wdt), _rand(m, k + 3, seed=2, dtype=wdt)[:, :k]
    b = _rand(n, seed=3, dtype=wdt)
    for bias in (None, b):
        outs = {}
        for odt in (F32, wdt):
            spec = GemmSpec(n, k, wdt, odt)
            payload = impl.prepare(spec, w, None)
            out = torch.full((m, n + 5), float("nan"), dtype=odt)[:, :n]
            impl.mm(spec, x, payload, bias, out)
            outs[odt] = out
        exact = x.double() @ w.double().t() + (0 if bias is None else bias.double())
        torch.testing.assert_close(outs[F32].double(), exact, atol=1e-5 * k**0.5, rtol=1e-5)
        assert torch.equal(outs[wdt], outs[F32].to(wdt))


@pytest.mark.parametrize("isa", _isas())
@EVERY_BLOCKING
@pytest.mark.parametrize("m,n,k", [(1, 37, 100), (6, 16, 1), (13, 130, 257), (8, 48, 2050)])
def test_fp32_weights_against_fp64(isa, blocks, m, n, k):
    """fp32 panels (what AVX2-only x86 runs fp32 on): against the fp64 oracle with the bias
    added in fp32; every call writes only its [M, N] view. The kernels, not whether the backend
    picks them here."""
    impl = _impl(isa, **blocks)
    w, x = _rand(n, k, seed=21, dtype=F32), _rand(m, k + 3, seed=22, dtype=F32)[:, :k]
    spec = GemmSpec(n, k, F32, F32)
    payload = impl.prepare(spec, w, None)
    assert tuple(payload.panels.shape) == (-(-n // 16), k, 16)
    for bias in (None, _rand(n, seed=23, dtype=F32)):
        out = torch.full((m, n + 5), float("nan"))
        impl.mm(spec, x, payload, bias, out[:, :n])
        exact = x.double() @ w.double().t() + (0 if bias is None else bias.double())
        torch.testing.assert_close(out[:, :n].double(), exact, atol=1e-5 * k**0.5, rtol=1e-5)
        assert torch.isnan(out[:, n:]).all()
        out16 = torch.empty(m, n, dtype=BF16)  # bf16 out: the fp32 result rounded once
        impl.mm(GemmSpec(n, k, F32, BF16), x, payload, bias, out16)
        assert torch.equal(out16, out[:, :n].to(BF16))


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("rows", ["expanded", "overlapping"])
def test_x_with_a_row_stride_below_k_is_served(m, rows):
    """An ``x`` whose rows overlap (one row expanded to M: stride 0; or a stride below K), which
    the host accepts, gives what its dense copy gives (issue 30, item 11). The kernels, not
    whether the backend picks them here."""
    n, k = 40, 64
    impl = PanelGemm(policy=PanelPolicy(isa=_isas()[-1], **BLOCKS), threads=2)
    base = _rand(m + k, seed=7)
    x = base.as_strided((m, k), (0 if rows == "expanded" else 1, 1))  # expand: stride 0
    assert x.stride(0) < k
    w = _rand(n, k, seed=8)
    spec = GemmSpec(n, k, BF16, F32)
    payload = impl.prepare(spec, w, None)
    out, want = torch.empty(m, n), torch.empty(m, n)
    impl.mm(spec, x, payload, None, out)
    impl.mm(spec, x.contiguous().clone(), payload, None, want)
    assert torch.equal(out, want)
    w8, s_w = _rand(n, k, seed=9, dtype=S8), torch.rand(n) + 0.5
    spec8 = GemmSpec(n, k, S8, F32)
    p8 = impl.prepare(spec8, w8, s_w)
    xq = _rand(m + k, seed=10, dtype=S8).as_strided((m, k), (x.stride(0), 1))
    s_x = torch.rand(m) + 0.5
    out8, want8 = torch.empty(m, n), torch.empty(m, n)
    impl.scaled_mm(spec8, xq, s_x, p8, None, out8)
    impl.scaled_mm(spec8, xq.clone(memory_format=torch.contiguous_format), s_x, p8, None, want8)
    assert torch.equal(out8, want8)


@pytest.mark.parametrize("isa", _isas())
def test_k4096_logits_against_fp64(panel_here, isa):
    """LM-head depth (K=4096), logits of std ~3: the fp32 summation error stays near 1e-6."""
    impl = PanelGemm(policy=PanelPolicy(isa=isa))
    w, x = _rand(512, 4096, seed=4, scale=0.05), _rand(16, 4096, seed=5)
    spec = GemmSpec(512, 4096, BF16, F32, "lm_head")
    out = torch.full((16, 512), float("nan"))
    impl.mm(spec, x, impl.prepare(spec, w, None), None, out)
    torch.testing.assert_close(out.double(), x.double() @ w.double().t(), atol=2e-5, rtol=1e-5)


@EVERY_BLOCKING
@pytest.mark.parametrize("m,n,k", [(1, 40, 99), (7, 16, 2), (13, 33, 301), (3, 8, 8191)])
def test_int8_is_exact(panel_here, blocks, m, n, k):
    """Unit scales and fp32 out: the output is the int64 oracle converted to fp32 (both round
    the same exact integer once). Extreme rows (all -128 against -128 and 127) are where a
    16-bit intermediate would saturate."""
    if "avx2" not in _isas():
        pytest.skip("no exact int8 panel kernel on this CPU")
    impl = _impl("avx2", **blocks)
    w, x = _rand(n, k, seed=6, dtype=S8), _rand(m, k + 1, seed=7, dtype=S8)[:, :k]
    w[0], x[0] = -128, -128
    w[-1] = 127
    spec = GemmSpec(n, k, S8, F32)
    payload = impl.prepare(spec, w, torch.ones(n))
    out = torch.full((m, n), float("nan"))
    impl.scaled_mm(spec, x, torch.ones(m), payload, None, out)
    acc = x.long() @ w.long().t()
    assert acc.abs().max() >= 2**15  # the extremes do not fit int16
    assert torch.equal(out, acc.to(F32))


@pytest.mark.parametrize("odt", [F32, BF16, F16])
def test_int8_scaled_output_is_bit_exact_with_the_reference(panel_here, odt):
    """(acc * s_x) * s_w (+ bias) in fp32, in the reference's order, then one cast."""
    if "avx2" not in _isas():
        pytest.skip("no exact int8 panel kernel on this CPU")
    m, n, k = 9, 70, 1000
    w, x = _rand(n, k, seed=8, dtype=S8), _rand(m, k, seed=9, dtype=S8)
    sw, sx = torch.rand(n) * 1e-3 + 1e-5, torch.rand(m) * 1e-2 + 1e-5
    for bias in (None, _rand(n, seed=10, dtype=odt)):
        spec = GemmSpec(n, k, S8, odt)
        impl, ref = PanelGemm(), ReferenceGemm()
        out, want = torch.empty(m, n, dtype=odt), torch.empty(m, n, dtype=odt)
        impl.scaled_mm(spec, x, sx, impl.prepare(spec, w, sw), bias, out)
        ref.scaled_mm(spec, x, sx, ref.prepare(spec, w, sw), bias, want)
        assert torch.equal(out, want)


def test_thread_counts_and_large_m_give_the_same_bits(panel_here):
    """Threads split panels only (never a dot product), and row blocks (mc) split rows: the
    result does not depend on either."""
    w, x = _rand(200, 300, seed=11), _rand(530, 300, seed=12)
    spec = GemmSpec(200, 300, BF16, F32)
    outs = []
    for threads, mc in ((1, 256), (2, 256), (2, 1000), (3, 64)):
        impl = PanelGemm(policy=PanelPolicy(mc=mc), threads=threads)
        out = torch.empty(530, 200)
        impl.mm(spec, x, impl.prepare(spec, w, None), None, out)
        outs.append(out)
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


def test_the_variant_names_isa_widening_order_and_blocks():
    impl = PanelGemm(policy=PanelPolicy(kc=128, mc=64, block_major_m=100))
    assert impl.variant("avx2", 99, 2) == ("avx2/reg/panels/kc128/mc64/t2", (1, 0, 128, 64, 2, 0))
    assert impl.variant("avx2", 100, 2) == ("avx2/tile/blocks/kc128/mc64/t2", (1, 1, 128, 64, 2, 1))
    # the at::vec kernels always widen per k block
    assert impl.variant("generic", 1, 1) == (
        "generic/tile/panels/kc128/mc64/t1",
        (0, 1, 128, 64, 1, 0),
    )


@pytest.mark.parametrize("wdt", [BF16, F16, F32, S8], ids=["bf16", "fp16", "fp32", "int8"])
@pytest.mark.parametrize("isa", _isas())
def test_block_major_gives_the_same_bits_as_panel_major(wdt, isa):
    """Block-major (each k block over a chunk of panels, 16-bit weights widened per k block)
    runs every sum over k in the same order as panel-major (widened in registers): the same
    bits. 38 panels: more than one chunk of 16, a partial last panel; 40 rows in 7 groups."""
    if wdt == S8 and isa != "avx2":
        pytest.skip(f"no exact int8 panel kernel in the {isa} kernels")
    m, n, k = 40, 600, 300
    w, x = _rand(n, k, seed=31, dtype=wdt), _rand(m, k, seed=32, dtype=wdt)
    spec = GemmSpec(n, k, wdt, F32)
    s_w, s_x = _rand(n, seed=33, dtype=F32).abs() + 0.5, _rand(m, seed=34, dtype=F32).abs() + 0.5
    outs = []
    for block_major_m in (0, 1):
        impl = _impl(isa, threads=2, kc=40, block_major_m=block_major_m)
        assert impl.variant(isa, m, 2)[1][-1] == block_major_m
        payload = impl.prepare(spec, w, s_w if wdt == S8 else None)
        out = torch.full((m, n), float("nan"))
        if wdt == S8:
            impl.scaled_mm(spec, x, s_x, payload, None, out)
        else:
            impl.mm(spec, x, payload, None, out)
        outs.append(out)
    assert not outs[0].isnan().any()
    assert torch.equal(outs[0], outs[1])


def test_block_major_by_default_on_x86_only():
    """The measured defaults: block-major from 128 rows on x86 (Intel and AMD alike), never on
    Arm (and the reason line names where the policy came from)."""
    assert PanelPolicy.default_for("x86_64") == PanelPolicy(block_major_m=128)
    assert PanelPolicy.default_for("aarch64") == PanelPolicy()
    p = PanelPolicy(block_major_m=128)
    assert [p.block_major(m) for m in (1, 127, 128, 4096)] == [False, False, True, True]
    assert not any(PanelPolicy().block_major(m) for m in (1, 128, 1 << 20))
    with pytest.raises(ValueError, match="block_major_m=-1 must be an int >= 0"):
        PanelPolicy(block_major_m=-1)
    flags = frozenset({"avx2", "fma", "f16c"})
    for machine, expect in (("x86_64", 128), ("aarch64", 0)):
        info = DeviceInfo(machine, cpu_model="any", cpu_flags=flags, torch=TorchBuild("2.13.0"))
        reasons = PanelGemm(policy=None).supports(GemmSpec(64, 64, BF16, F32), info).reasons
        assert f"mc=256, block_major_m={expect} (default)" in reasons[-1]


def test_kernel_guards_reject_mismatched_tensors(panel_here):
    """The C++ ops check what they are given, so a direct call cannot hand a kernel a bad
    pointer."""
    ops = extension().ops
    w = _rand(40, 64, seed=13)
    panels = ops.panel_pack(w, 1)
    assert tuple(panels.shape) == (3, 64, 16)
    conf = [1 if "avx2" in _isas() else 0, 1, 256, 256, 1, 0]
    x, out = _rand(2, 64, seed=14), torch.full((2, 40), float("nan"))
    with pytest.raises(RuntimeError, match="panels do not match N=49"):
        ops.panel_mm(x, panels, 49, None, torch.empty(2, 49), conf)
    with pytest.raises(RuntimeError, match="panels do not match N=40 K=64 Float"):
        ops.panel_mm(x.float(), panels, 40, None, out, conf)
    with pytest.raises(RuntimeError, match="bias must be fp32 \\[40\\]"):
        ops.panel_mm(x, panels, 40, torch.zeros(39), out, conf)
    with pytest.raises(RuntimeError, match="panel conf has 6 fields"):
        ops.panel_mm(x, panels, 40, None, out, conf[:5])
    with pytest.raises(RuntimeError, match="bad panel conf"):
        ops.panel_mm(x, panels, 40, None, out, [*conf[:5], 2])  # no order 2
    with pytest.raises(RuntimeError, match="only widen per k block"):
        ops.panel_mm(x, panels, 40, None, out, [0, 0, 256, 256, 1, 0])
    assert torch.isnan(out).all()  # nothing above wrote to out


# ---- what this machine cannot run still compiles ----------------------------------------------

PANEL_SOURCES = ("panel_gemm.cpp", "panel_avx2.cpp", "panel_generic.cpp")


@pytest.mark.parametrize(
    "cxx,flags",
    [
        ("g++", ["-march=x86-64"]),  # no AVX2 in the flags: the target attributes must suffice
        ("aarch64-linux-gnu-g++", ["-march=armv8-a"]),  # generic kernels on NEON, no AVX2 table
    ],
    ids=["x86-64-baseline", "aarch64"],
)
def test_panel_sources_compile_for_other_targets(cxx, flags, tmp_path):
    """Code generation for a target this CPU is not (a target-attribute mismatch only shows when
    code is generated). The aarch64 build needs g++-aarch64-linux-gnu (make test installs it)."""
    machine = "aarch64" if cxx.startswith("aarch64") else "x86_64"
    if machine == platform.machine():
        cxx = "g++"
    elif machine == "x86_64" or shutil.which(cxx) is None:
        pytest.skip(f"no {cxx} for {machine} here")
    includes = [f"-isystem{p}" for p in include_paths()]
    for source in PANEL_SOURCES:
        cmd = [cxx, "-std=c++17", "-O1", "-fopenmp", "-ffp-contract=off", *flags, *includes]
        obj = tmp_path / f"{source}.o"
        done = subprocess.run(
            [*cmd, "-c", str(CSRC / source), "-o", str(obj)], capture_output=True, text=True
        )
        assert done.returncode == 0, f"{source}: {done.stderr[-3000:]}"

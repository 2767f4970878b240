"""GEMM (oneDNN and panel): primitive-cache keys, LM-head numerics, variant policy, choices by
ISA, visible fallbacks."""

from __future__ import annotations

import dataclasses
import io
import platform
import sys
import warnings
from pathlib import Path

import pytest
import torch

from plugin_api.backend import backend_for
from plugin_api.contract import OpFamily
from plugin_api.device_info import DeviceInfo
from plugin_api.errors import FallbackRefused, SettingError
from plugin_api.machines import MACHINES
from plugin_api.ops import gemm
from plugin_api.ops.attention import AttentionSpec
from plugin_api.ops.gemm import GemmProblem, GemmSpec
from plugin_api.ops.huge_pages import thp_mode
from plugin_api.reference.gemm import ReferenceGemm
from plugin_api.selection import PluginApiWarning
from plugin_api.settings import Settings
from plugin_api_cpu_arm_acl.build import extension
from plugin_api_cpu_arm_acl.gemm import (
    CODES,
    GEMV_KERNELS,
    OneDnnGemm,
    gemv_kernel,
    gemv_max_rows,
    torch_matmul_kernel,
)
from plugin_api_cpu_arm_acl.isa import f32_panel, int8_matmul_exact, int8_panel_exact, isa_name
from plugin_api_cpu_arm_acl.kernel_probe import onednn_bf16, onednn_serves
from plugin_api_cpu_arm_acl.matmul_form import ACL, FULL, MatmulForm, reference_kernel
from plugin_api_cpu_arm_acl.panel_gemm import ISA_CODES, PanelGemm
from plugin_api_cpu_arm_acl.settings import (
    GEMV_MAX_M,
    GemvPolicy,
    LargeMPolicy,
    LmHeadPolicy,
    PanelPolicy,
)

BF16, F16, F32, S8 = torch.bfloat16, torch.float16, torch.float32, torch.int8
AVX2 = dataclasses.replace(MACHINES["xeon-cpu"], cpu_flags=frozenset({"avx2", "fma", "f16c"}))
# the named example lists the flags that pick oneDNN kernels; a Sapphire Rapids also has these
AMX = dataclasses.replace(
    MACHINES["xeon-cpu"], cpu_flags=MACHINES["xeon-cpu"].cpu_flags | {"fma", "f16c"}
)
ZEN4 = dataclasses.replace(  # AVX-512 BF16, no AMX
    MACHINES["xeon-cpu"], cpu_flags=MACHINES["xeon-cpu"].cpu_flags - {"amx_bf16", "amx_tile"}
)
NEOVERSE_N1 = dataclasses.replace(MACHINES["graviton4"], cpu_flags=frozenset({"fp", "asimd"}))


def _rand(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = BF16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == S8:
        return torch.randint(-128, 128, shape, generator=g, dtype=S8)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


# Per implementation: the base call's weight dtype, and a call per GemmProblem field that
# changes that field (kwargs of `call` below). A field whose change needs a kernel this CPU
# lacks is left out; on any CPU the two implementations together cover every field (the panel
# serves what oneDNN does not: every weight dtype on AVX2-only x86, only fp16 where oneDNN has
# bf16). No base dtype: the implementation serves none here.
def _variations(impl_name: str, host: DeviceInfo) -> tuple[torch.dtype | None, dict[str, dict]]:
    common = {
        "m": dict(m=4),
        "n": dict(n=80),
        "k": dict(k=128),
        "a_row_stride": dict(x_pad=32),
        "c_row_stride": dict(o_pad=16),
        "usage": dict(usage="lm_head"),
        "variant": dict(threads=1),
    }
    int8 = {"a_dtype": dict(wdt=S8), "b_dtype": dict(wdt=S8), "scaled": dict(wdt=S8)}
    if impl_name == "panel":
        if onednn_bf16(host):
            return F16, common | {"c_dtype": dict(odt=F16), "bias_dtype": dict(bias=F16)}
        exact_int8 = int8 if int8_panel_exact(host) and not int8_matmul_exact(host) else {}
        fp32 = {"b_dtype": dict(wdt=F32)} if f32_panel(host) else {}
        return BF16, common | fp32 | exact_int8 | {
            "c_dtype": dict(odt=BF16),
            "bias_dtype": dict(bias=BF16),
        }
    int8_here = int8_matmul_exact(host) and onednn_serves(host, "s8->f32")
    if f32_panel(host) and not int8_here and not onednn_bf16(host):
        return None, {}
    extra = {"bias_dtype": dict(bias=F32)} | (int8 if int8_here else {})
    if onednn_bf16(host):
        extra |= {"b_dtype": dict(wdt=BF16), "c_dtype": dict(wdt=BF16, odt=BF16)}
    return F32, common | extra


@pytest.mark.parametrize("impl_name", ["onednn", "onednn-acl-form", "panel"])
def test_every_problem_field_keys_its_own_primitive(onednn_backend, impl_name):
    """Real calls that differ in one descriptor field each get their own cached primitive, and
    match the fp64 oracle. oneDNN runs strict: a primitive on its reference kernel (strided
    rows, say) fails the test. ``onednn-acl-form``: the form Arm uses (bias and weight scales in
    the torch epilogue), run here."""
    host = onednn_backend.info  # with the kernel facts: what oneDNN really serves here
    # no LM-head row padding: each call's own M keys its primitive (padding has its own test)
    policy = dataclasses.replace(LmHeadPolicy.default_for(platform.machine()), pad_m=1)
    if impl_name == "panel":
        impl = PanelGemm(threads=2)
    else:
        form = ACL if impl_name == "onednn-acl-form" else None  # None: this machine's
        # oneDNN's primitives are what these calls key: none goes to the GEMV
        impl = OneDnnGemm(threads=2, policy=policy, form=form, strict=True, gemv=GemvPolicy())
    base_wdt, variations = _variations(impl_name.split("-")[0], host)
    if base_wdt is None:
        pytest.skip(f"{impl_name} serves no weight dtype on {isa_name(host)}: the panel GEMM does")
    prim_of: dict[GemmProblem, object] = {}
    packed: dict[tuple, object] = {}

    def call(n=64, k=96, wdt=base_wdt, odt=F32, usage="linear", m=3, bias=None, x_pad=0,
             o_pad=0, threads=2):  # fmt: skip
        spec = GemmSpec(n, k, wdt, odt, usage)
        assert impl.supports(spec, host), impl.supports(spec, host).because()
        w = _rand(n, k, seed=n + k, dtype=wdt)
        scale = _rand(n, seed=n, dtype=F32).abs() * 0.01 if wdt == S8 else None
        key = (n, k, wdt, odt, usage)
        if key not in packed:
            packed[key] = impl.prepare(spec, w, scale)
        x = _rand(m, k + x_pad, seed=m, dtype=wdt)[:, :k]
        out = torch.full((m, n + o_pad), float("nan"), dtype=odt)[:, :n]
        b = None if bias is None else _rand(n, seed=5, dtype=bias)
        impl.threads = threads
        before = len(impl.cache)
        if wdt == S8:
            sx = _rand(m, seed=m, dtype=F32).abs() * 0.02
            plan = impl.plan(spec, packed[key], x, b, out)
            impl.scaled_mm(spec, x, sx, packed[key], b, out)
            acc = x.long() @ w.long().t()
            expect = acc.double() * sx.double()[:, None] * scale.double()[None, :]
        else:
            plan = impl.plan(spec, packed[key], x, b, out)
            impl.mm(spec, x, packed[key], b, out)
            expect = x.double() @ w.double().t()
        expect = expect + (0 if b is None else b.double())
        tol = dict(atol=1e-3, rtol=1e-4) if odt == F32 else dict(atol=2e-2, rtol=1.6e-2)
        torch.testing.assert_close(out.double(), expect, **tol)
        prim = impl.cache.get_or_build(plan.problem, lambda _: pytest.fail("not cached"))
        prim_of[plan.problem] = prim
        return plan.problem, len(impl.cache) - before

    base, added = call()
    assert added == 1
    for name, change in variations.items():
        problem, _ = call(**change)
        diff = {f.name for f in dataclasses.fields(GemmProblem)
                if getattr(problem, f.name) != getattr(base, f.name)}  # fmt: skip
        assert name in diff, (name, diff)
        assert prim_of[problem] is not prim_of[base], f"changing {name} reused a primitive"
    # every distinct problem has its own primitive object, and calling again reuses it
    prims = list(prim_of.values())
    assert len({id(p) for p in prims}) == len(prims) == len(impl.cache)
    again, added = call()
    assert again == base and added == 0


@pytest.mark.parametrize("host", [AVX2, AMX, NEOVERSE_N1], ids=["avx2", "amx", "neoverse-n1"])
def test_the_two_implementations_cover_every_problem_field(host):
    fields = {f.name for f in dataclasses.fields(GemmProblem)}
    covered = set(_variations("panel", host)[1]) | set(_variations("onednn", host)[1])
    assert covered == fields, fields - covered


def test_bf16_out_is_one_downcast_of_the_fp32_accumulator(onednn_backend):
    w = _rand(300, 512, seed=1, scale=0.05)
    x = _rand(5, 512, seed=2)
    b = _rand(300, seed=3)
    for bias in (None, b):
        f32 = gemm.mm(
            x, gemm.prepare(w, out_dtype=F32, usage="lm_head", backend=onednn_backend), bias
        )
        b16 = gemm.mm(
            x, gemm.prepare(w, out_dtype=BF16, usage="lm_head", backend=onednn_backend), bias
        )
        impl = gemm.prepare(w, out_dtype=BF16, backend=onednn_backend).impl
        if isinstance(impl, PanelGemm) or impl.policy_for(onednn_backend.info).f32_dst(5, 300):
            assert torch.equal(b16, f32.to(BF16))


def test_lm_head_fp32_logits_match_the_exact_accumulator(onednn_backend):
    """K=4096 fp32 logits vs the fp64 oracle: within atol 1e-4 + rtol 1e-5 (measured here:
    about 2e-6 max abs error on logits of std ~3)."""
    w = _rand(2048, 4096, seed=3, scale=0.05)
    x = _rand(8, 4096, seed=4)
    packed = gemm.prepare(w, out_dtype=F32, usage="lm_head", backend=onednn_backend)
    out = torch.full((8, 2048), float("nan"))
    gemm.mm(x, packed, out=out)
    exact = x.double() @ w.double().t()
    torch.testing.assert_close(out.double(), exact, atol=1e-4, rtol=1e-5)


def test_greedy_argmax_agrees_with_the_fp32_reference(onednn_backend):
    """4096 random rows over a 32000-wide vocab: argmax agrees on >= 99.9% of rows."""
    n, k, rows = 32000, 256, 4096
    w = _rand(n, k, seed=5, scale=0.05)
    packed = gemm.prepare(w, out_dtype=F32, usage="lm_head", backend=onednn_backend)
    spec = GemmSpec(n, k, BF16, F32, "lm_head")
    ref = ReferenceGemm()
    ref_payload = ref.prepare(spec, w, None)
    agree = 0
    for chunk in range(0, rows, 1024):
        x = _rand(1024, k, seed=100 + chunk)
        ours = gemm.mm(x, packed)
        theirs = torch.empty_like(ours)
        ref.mm(spec, x, ref_payload, None, theirs)
        agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
    assert agree / rows >= 0.999, f"argmax agrees on {agree} of {rows} rows"


@pytest.mark.parametrize("m,n,expect", [(1, 128256, BF16), (9, 128256, F32), (64, 4096, BF16)])
def test_lm_head_policy_picks_the_kernel_dst(m, n, expect):
    impl = OneDnnGemm(policy=LmHeadPolicy(min_n=64000, min_m=9))
    spec = GemmSpec(n, 4096, BF16, BF16, "lm_head")
    assert impl.kernel_dst(spec, m) == expect
    assert impl.kernel_dst(dataclasses.replace(spec, out_dtype=F32), m) == F32
    assert impl.kernel_dst(dataclasses.replace(spec, weight_dtype=F32, out_dtype=F32), m) == F32


def test_lm_head_runs_few_rows_on_the_padded_kernel(onednn_backend):
    """M < pad_m LM-head rows run the pad_m-row primitive; results as the fp64 oracle."""
    if not onednn_bf16(onednn_backend.info):
        pytest.skip("no optimised oneDNN bf16 kernel here")
    impl = OneDnnGemm(threads=2, policy=LmHeadPolicy(enabled=False, pad_m=4), gemv=GemvPolicy())
    w = _rand(300, 512, seed=7, scale=0.05)
    for odt in (F32, BF16):
        for usage in ("lm_head", "linear"):
            spec = GemmSpec(300, 512, BF16, odt, usage)
            packed = impl.prepare(spec, w, None)
            for m in (1, 2, 3, 4, 5):
                impl.cache.clear()
                x = _rand(m, 512, seed=m)
                out = torch.full((m, 300), float("nan"), dtype=odt)
                impl.mm(spec, x, packed, None, out)
                tol = dict(atol=1e-4, rtol=1e-5) if odt == F32 else dict(atol=2e-2, rtol=1.6e-2)
                torch.testing.assert_close(out.double(), x.double() @ w.double().t(), **tol)
                ran = {p.m for p in impl.cache.problems()}
                assert ran == ({4} if usage == "lm_head" and m < 4 else {m}), (usage, m, ran)


@pytest.mark.parametrize("odt", [F32, BF16])
def test_lm_head_few_rows_run_the_gemv_on_the_packed_weights(onednn_backend, odt):
    """M <= gemv_m LM-head rows run the bf16 GEMV on oneDNN's packed weights (strided rows too,
    N not a multiple of 64), as the fp64 oracle; more rows, a bias or another usage run oneDNN;
    the kernel each call ran is what the bench reports."""
    from plugin_api.contract.provenance import record_kernels

    impl = OneDnnGemm(
        threads=2, policy=LmHeadPolicy(enabled=False, gemv_m=GEMV_MAX_M), gemv=GemvPolicy()
    )
    w = _rand(300, 512, seed=8, scale=0.05)
    spec = GemmSpec(300, 512, BF16, odt, "lm_head")
    served = impl.supports(spec, onednn_backend.info)  # before prepare: AVX2-only has no bf16
    if not served:
        pytest.skip(f"cpu-arm-acl does not serve a bf16 LM head here: {served.because()}")
    packed = impl.prepare(spec, w, None)
    if not packed.gemv:
        pytest.skip(f"oneDNN packed {packed.layout!r} here, or this build lacks AVX-512 BF16")
    tol = dict(atol=1e-4, rtol=1e-5) if odt == F32 else dict(atol=2e-2, rtol=1.6e-2)
    wide = _rand(GEMV_MAX_M + 1, 700, seed=9)
    rows = gemv_max_rows()  # 64 with AMX tiles, 8 with vdpbf16ps
    calls = [(m, None, "lm_head") for m in range(1, rows + 2)]  # every row count it has, one more
    calls += [(2, True, "lm_head"), (2, None, "linear")]
    for m, bias, usage in calls:
        x = wide[:m, 100:612]  # row stride 700
        b = _rand(1, 300, seed=m)[0].float() if bias else None
        out = torch.full((m, 300), float("nan"), dtype=odt)
        with record_kernels() as kernels:
            impl.mm(dataclasses.replace(spec, usage=usage), x, packed, b, out)
        exact = x.double() @ w.double().t() + (0 if b is None else b.double())
        torch.testing.assert_close(out.double(), exact, **tol)
        gemv = m <= rows and bias is None and usage == "lm_head"
        assert (kernels == [gemv_kernel()]) is gemv, (m, bias, usage, kernels)


@pytest.mark.parametrize("prefetch", [0, 1])
def test_linear_few_rows_run_the_gemv_per_gemv_policy(onednn_backend, prefetch):
    """GemvPolicy.linear_m routes linear calls of that many rows (bf16, no bias) to the GEMV,
    with or without its prefetch, as the fp64 oracle; more rows or a bias run oneDNN."""
    from plugin_api.contract.provenance import record_kernels

    impl = OneDnnGemm(threads=2, gemv=GemvPolicy(linear_m=3, prefetch=prefetch))
    w = _rand(200, 256, seed=3, scale=0.05)
    spec = GemmSpec(200, 256, BF16, BF16, "linear")
    served = impl.supports(spec, onednn_backend.info)  # before prepare: AVX2-only has no bf16
    if not served:
        pytest.skip(f"cpu-arm-acl does not serve a bf16 linear layer here: {served.because()}")
    packed = impl.prepare(spec, w, None)
    if not packed.gemv:
        pytest.skip(f"oneDNN packed {packed.layout!r} here, or this build lacks AVX-512 BF16")
    for m, bias in [(1, None), (3, None), (4, None), (2, True)]:
        x = _rand(m, 256, seed=10 + m)
        b = _rand(1, 200, seed=m)[0].float() if bias else None
        out = torch.full((m, 200), float("nan"), dtype=BF16)
        with record_kernels() as kernels:
            impl.mm(spec, x, packed, b, out)
        exact = x.double() @ w.double().t() + (0 if b is None else b.double())
        torch.testing.assert_close(out.double(), exact, atol=2e-2, rtol=1.6e-2)
        assert (kernels == [gemv_kernel()]) is (m <= 3 and bias is None), (m, bias, kernels)


@pytest.mark.parametrize("n", [200, 320])
def test_unpack_gives_back_the_weights_bit_for_bit(onednn_backend, n):
    """unpack is pack's inverse on the GEMV's layout (N a multiple of 64 and not, K of several
    32-k blocks), on 1 and 3 threads; a wrong out is refused before any kernel runs."""
    impl = OneDnnGemm(threads=2)
    spec = GemmSpec(n, 1024, BF16, BF16, "linear")
    served = impl.supports(spec, onednn_backend.info)
    if not served:
        pytest.skip(f"cpu-arm-acl does not serve a bf16 linear layer here: {served.because()}")
    w = _rand(n, 1024, seed=5, scale=0.05)
    packed = impl.prepare(spec, w, None)
    if not packed.gemv:
        pytest.skip(f"oneDNN packed {packed.layout!r} here, or this build lacks AVX-512 BF16")
    for threads in (1, 3):
        out = torch.full_like(w, float("nan"))
        extension().ops.unpack(packed.packed, out, threads)
        assert torch.equal(out, w), threads
    with pytest.raises(RuntimeError, match="unpack out must be bf16"):
        extension().ops.unpack(packed.packed, torch.empty(n, 1024), 1)


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(a, 16) for a in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("impl_name", ["onednn", "panel"])
def test_packed_weights_of_4_mib_or_more_ask_for_huge_pages(onednn_backend, impl_name):
    """The GEMV streams every weight once per decode step, so packed weights of 4 MiB or more
    sit in memory that asked for transparent huge pages before it was written (a 2 KiB weight
    does not ask); the products are the oracle's either way."""
    if sys.platform != "linux" or thp_mode() is None:
        pytest.skip("transparent huge pages are a Linux feature with a readable THP mode")
    impl = OneDnnGemm(threads=2) if impl_name == "onednn" else PanelGemm(threads=2)
    if impl_name == "onednn":
        served = impl.supports(GemmSpec(32, 32, BF16, BF16, "linear"), onednn_backend.info)
        if not served:
            pytest.skip(
                f"cpu-arm-acl's oneDNN serves no bf16 linear layer here: {served.because()}"
            )
    else:
        isa = impl.isa(onednn_backend.info)
        if not extension().ops.panel_available(ISA_CODES[isa], False):
            pytest.skip(f"the {isa} panel kernels are not in this build")
    for n, k, huge in ((2048, 1024, True), (32, 32, False)):
        spec = GemmSpec(n, k, BF16, BF16, "linear")
        w = _rand(n, k, seed=7, scale=0.05)
        packed = impl.prepare(spec, w, None)
        if impl_name == "onednn":
            assert packed.packed.huge_pages() is huge, (n, k)
        elif huge:  # a small tensor can sit in a heap mapping that another buffer advised
            assert "hg" in _vm_flags(packed.panels.data_ptr()), (n, k)
        x = _rand(3, k, seed=8)
        out = torch.full((3, n), float("nan"), dtype=BF16)
        impl.mm(spec, x, packed, None, out)
        exact = x.double() @ w.double().t()
        torch.testing.assert_close(out.double(), exact, atol=2e-2, rtol=1.6e-2)


def test_linear_many_rows_run_torch_matmul_per_large_m_policy(onednn_backend):
    """LargeMPolicy.min_m routes bf16 linear calls of that many rows (no bias or a bf16 one,
    strided x and out too) to torch's matmul on the unpacked weights, as the fp64 oracle rounded
    once; fewer rows, an fp32 bias or fp32 out run oneDNN."""
    from plugin_api.contract.provenance import record_kernels

    impl = OneDnnGemm(threads=2, large_m=LargeMPolicy(min_m=24), gemv=GemvPolicy())  # no GEMV
    w = _rand(200, 256, seed=3, scale=0.05)
    spec = GemmSpec(200, 256, BF16, BF16, "linear")
    served = impl.supports(spec, onednn_backend.info)
    if not served:
        pytest.skip(f"cpu-arm-acl does not serve a bf16 linear layer here: {served.because()}")
    packed = impl.prepare(spec, w, None)
    if not packed.gemv:
        pytest.skip(f"oneDNN packed {packed.layout!r} here, or this build lacks AVX-512 BF16")
    cases = [(23, None, False), (24, None, False), (40, BF16, False), (40, F32, False)]
    cases += [(30, None, True)]
    for m, bias_dt, strided in cases:
        x = _rand(m, 256 + 64, seed=10 + m)[:, :256] if strided else _rand(m, 256, seed=10 + m)
        b = None if bias_dt is None else _rand(1, 200, seed=m)[0].to(bias_dt)
        wide = torch.full((m, 232), float("nan"), dtype=BF16)
        out = wide[:, :200] if strided else torch.full((m, 200), float("nan"), dtype=BF16)
        with record_kernels() as kernels:
            impl.mm(spec, x, packed, b, out)
        exact = x.double() @ w.double().t() + (0 if b is None else b.double())
        torch.testing.assert_close(out.double(), exact, atol=2e-2, rtol=1.6e-2)
        torch_mm = m >= 24 and bias_dt in (None, BF16)
        assert (kernels == [torch_matmul_kernel()]) is torch_mm, (m, bias_dt, kernels)
        if strided:
            assert wide[:, 200:].isnan().all()  # nothing written past the view


def test_large_m_policy_defaults_parse_and_decision():
    assert LargeMPolicy.default_for("x86_64", amx=True) == LargeMPolicy(min_m=2048)
    assert LargeMPolicy.default_for("x86_64", amx=False) == LargeMPolicy()
    assert LargeMPolicy.default_for("aarch64", amx=True) == LargeMPolicy()
    assert LargeMPolicy.parse("min_m=512") == LargeMPolicy(512)
    assert LargeMPolicy.parse("off") == LargeMPolicy(0)
    assert "never" in LargeMPolicy().describe()
    for bad in ("min_m=-1", "rows=4", "on"):
        with pytest.raises(SettingError, match="PLUGIN_API_ONEDNN_LARGE_M"):
            LargeMPolicy.parse(bad)
    # the report states the policy of the machine it describes, for linear layers only
    impl = OneDnnGemm(threads=2)
    why = impl.supports(GemmSpec(4096, 4096, BF16, BF16, "linear"), AMX).because()
    assert "M >= 2048 run torch's matmul" in why and "(default)" in why, why
    why = impl.supports(GemmSpec(4096, 4096, BF16, BF16, "linear"), ZEN4).because()
    assert "never run torch's matmul" in why, why
    why = impl.supports(GemmSpec(4096, 4096, BF16, BF16, "lm_head"), AMX).because()
    assert "torch's matmul" not in why, why
    given = OneDnnGemm(threads=2, large_m=LargeMPolicy(64))
    why = given.supports(GemmSpec(4096, 4096, BF16, BF16, "linear"), ZEN4).because()
    assert "M >= 64 run torch's matmul" in why and "PLUGIN_API_ONEDNN_LARGE_M" in why, why


def test_gemv_policy_defaults_and_parse():
    zen4, zen5 = ("AuthenticAMD", 25), ("AuthenticAMD", 26)
    assert GemvPolicy.default_for("x86_64", zen4) == GemvPolicy(linear_m=8, prefetch=0)
    assert GemvPolicy.default_for("x86_64", zen5) == GemvPolicy(linear_m=8, prefetch=1)
    assert GemvPolicy.default_for("x86_64", None) == GemvPolicy(linear_m=8, prefetch=0)
    assert GemvPolicy.default_for("aarch64", zen5) == GemvPolicy()
    # AMX: the AMX GEMV, 64 rows, prefetching (2026-12-06-xeon-amx)
    spr = ("GenuineIntel", 6)
    assert GemvPolicy.default_for("x86_64", spr, amx=True) == GemvPolicy(linear_m=64, prefetch=1)
    assert GemvPolicy.default_for("x86_64", spr) == GemvPolicy(linear_m=8, prefetch=0)
    assert GemvPolicy.parse("linear_m=2,prefetch=1") == GemvPolicy(2, 1)
    assert "M <= 2 run the bf16 GEMV (AMX tiles); GEMV prefetch on" in GemvPolicy(2, 1).describe()
    # a row count beyond the machine's kernel is stated with the kernel's limit
    assert "M <= 16, at most 8 here run the bf16 GEMV (vdpbf16ps)" in GemvPolicy(16).describe(8)
    for bad in ("linear_m=65", "prefetch=2", "rows=1"):
        with pytest.raises(SettingError, match="PLUGIN_API_ONEDNN_GEMV"):
            GemvPolicy.parse(bad)


def test_lm_head_policy_gemv_rows():
    assert LmHeadPolicy.parse("off,gemv_m=0").gemv_m == 0
    assert "M <= 3 runs the bf16 GEMV (vdpbf16ps)" in LmHeadPolicy.parse("gemv_m=3").describe(8)
    for bad in ("gemv_m=65", "gemv_m=-1"):
        with pytest.raises(SettingError, match="gemv_m"):
            LmHeadPolicy.parse(bad)
    assert LmHeadPolicy.default_for("x86_64").gemv_m == 8
    assert LmHeadPolicy.default_for("x86_64", amx=True) == LmHeadPolicy(enabled=False, gemv_m=64)
    assert LmHeadPolicy.default_for("aarch64").gemv_m == 0
    assert LmHeadPolicy.default_for("aarch64", amx=True) == LmHeadPolicy()


@pytest.mark.parametrize(
    "host,gemv_rows,kernel", [(AMX, 64, "AMX tiles"), (ZEN4, 8, "vdpbf16ps")], ids=["amx", "zen4"]
)
def test_the_decision_shows_the_machines_gemv_rows(host, gemv_rows, kernel):
    """The report names the policy and GEMV kernel of the machine it describes (AMX or not),
    not the host's."""
    impl = OneDnnGemm(threads=2)
    for usage in ("lm_head", "linear"):
        why = impl.supports(GemmSpec(4096, 4096, BF16, BF16, usage), host).because()
        assert f"M <= {gemv_rows} run" in why and f"bf16 GEMV ({kernel})" in why, (usage, why)


def test_the_gemv_kernel_is_the_cpus(onednn_backend):
    """A CPU with AMX-BF16 runs the AMX GEMV (Linux grants the tile state to a process that asks),
    one with AVX-512 BF16 alone the vdpbf16ps one."""
    flags = onednn_backend.info.cpu_flags
    if "avx512_bf16" not in flags:
        pytest.skip("no AVX-512 BF16 on this CPU: the build has no bf16 GEMV")
    amx = {"amx_bf16", "amx_tile"} <= flags
    assert gemv_kernel() == GEMV_KERNELS["amx" if amx else "avx512bf16"]
    assert gemv_max_rows() == (64 if amx else 8)


@pytest.mark.parametrize("threads,n,k", [(1, 300, 2048), (3, 300, 2048), (3, 300, 1056)])
def test_the_gemv_matches_the_oracle_at_every_row_count(onednn_backend, threads, n, k):
    """Every row count the GEMV takes, fp32 and bf16 out, N not a multiple of 64 (column blocks
    split unevenly between threads), a deep K and one that ends in a part of the AMX kernel's
    4-block K chunk, as the fp64 oracle."""
    rows = gemv_max_rows()
    if rows == 0:
        pytest.skip("this build has no bf16 GEMV (no AVX-512 BF16)")
    impl = OneDnnGemm(threads=threads, gemv=GemvPolicy(linear_m=rows, prefetch=1))
    w = _rand(n, k, seed=21, scale=0.05)
    spec = GemmSpec(n, k, BF16, F32, "linear")
    packed = impl.prepare(spec, w, None)
    if not packed.gemv:
        pytest.skip(f"oneDNN packed {packed.layout!r} here, not its AVX-512 BF16 layout")
    ext = extension().ops
    for m in range(1, rows + 1):
        x = _rand(m, k, seed=30 + m)
        exact = x.double() @ w.double().t()
        for odt in (F32, BF16):
            out = torch.full((m, n), float("nan"), dtype=odt)
            ext.gemv(packed.packed, x, out, threads, bool(m % 2))
            tol = dict(atol=1e-4, rtol=1e-5) if odt == F32 else dict(atol=2e-2, rtol=1.6e-2)
            torch.testing.assert_close(out.double(), exact, **tol, msg=f"m={m} out={odt}")
    with pytest.raises(RuntimeError, match="gemv x must be bf16"):
        ext.gemv(packed.packed, _rand(rows + 1, k, seed=1), torch.empty(rows + 1, n), 1, False)


def test_lm_head_policy_argument_overrides():
    impl = OneDnnGemm(policy=LmHeadPolicy(min_n=1, min_m=1))
    assert impl.kernel_dst(GemmSpec(8, 8, BF16, BF16), 1) == F32


LM_HEAD = GemmSpec(128256, 4096, BF16, F32, "lm_head")
W8A8 = GemmSpec(4096, 14336, S8, BF16)
FP16 = GemmSpec(4096, 4096, torch.float16, torch.float16)


@pytest.mark.parametrize(
    "info,spec,chosen,why",
    [
        (AVX2, LM_HEAD, "panel", "no oneDNN bf16 kernel"),
        (AVX2, W8A8, "panel", "vpmaddwd into int32"),
        (AMX, LM_HEAD, "onednn", "fp32 out is the kernel's dst"),
        (AMX, W8A8, "onednn", "per-channel weight scales"),
        (MACHINES["graviton4"], LM_HEAD, "onednn", "fp32 out is the kernel's dst"),
        (MACHINES["graviton4"], W8A8, "onednn", "per-channel weight scales"),
        (NEOVERSE_N1, LM_HEAD, "panel", "generic kernels"),
        (NEOVERSE_N1, W8A8, "onednn", "per-channel weight scales"),
        (AVX2, GemmSpec(64, 64, F32, F32), "panel", "fp32 on AVX2 (oneDNN has only its jit"),
        (AMX, GemmSpec(64, 64, F32, F32), "onednn", "oneDNN f32 matmul"),
        (AVX2, FP16, "panel", "fp16 on AVX2 (not offered by oneDNN here): avx2 kernels"),
        (AMX, FP16, "panel", "fp16 on AMX (not offered by oneDNN here): avx2 kernels"),
        (NEOVERSE_N1, FP16, "panel", "generic kernels"),
    ],
    ids=[
        "avx2-bf16",
        "avx2-int8",
        "amx-bf16",
        "amx-int8",
        "graviton4-bf16",
        "graviton4-int8",
        "neoverse-n1-bf16",
        "neoverse-n1-int8",
        "avx2-fp32",
        "amx-fp32",
        "avx2-fp16",
        "amx-fp16",
        "neoverse-n1-fp16",
    ],
)
def test_exactly_one_implementation_serves_each_machine_and_spec(info, spec, chosen, why):
    """The two implementations split the work by ISA, each naming its reasons (pure: no
    hardware needed)."""
    impls = {"onednn": OneDnnGemm(), "panel": PanelGemm()}
    decisions = {name: impl.supports(spec, info) for name, impl in impls.items()}
    assert [n for n, d in decisions.items() if d] == [chosen], {
        n: d.because() for n, d in decisions.items()
    }
    assert why in decisions[chosen].because()
    other = next(d for n, d in decisions.items() if n != chosen)
    assert other.reasons  # the rejection says why


def test_rejections_name_their_reason():
    onednn, panel = OneDnnGemm(), PanelGemm()
    assert "saturates" in onednn.supports(W8A8, AVX2).because()
    assert "no oneDNN bf16 matmul" in onednn.supports(LM_HEAD, AVX2).because()
    assert "oneDNN has a bf16 matmul" in panel.supports(LM_HEAD, AMX).because()
    assert "exact on" in panel.supports(W8A8, AMX).because()
    assert (
        "int8: oneDNN's s8 matmul is exact on NEON" in panel.supports(W8A8, NEOVERSE_N1).because()
    )
    generic = PanelGemm(policy=PanelPolicy(isa="generic"))
    assert "no exact int8 panel kernel in the generic" in generic.supports(W8A8, AVX2).because()
    assert generic.supports(LM_HEAD, AVX2)
    forced = PanelGemm(policy=PanelPolicy(isa="avx2")).supports(LM_HEAD, NEOVERSE_N1)
    assert "isa=avx2, but NEON lacks AVX2/FMA" in forced.because()
    big_k = GemmSpec(64, 1 << 17, S8, BF16)
    assert "overflow the int32 accumulator" in panel.supports(big_k, AVX2).because()
    fp16_w8a8 = GemmSpec(64, 64, S8, torch.float16)
    assert "int8 with fp16 out: not offered" in onednn.supports(fp16_w8a8, AMX).because()
    fp32 = GemmSpec(8, 8, F32, F32)
    assert "fp32 weights: oneDNN's f32 matmul" in panel.supports(fp32, AMX).because()
    assert "oneDNN 3.2 has only its jit sgemm" in onednn.supports(fp32, AVX2).because()


def test_unsupported_ops_fall_back_visibly(onednn_backend):
    """A spec cpu-arm-acl rejects (its attention takes block sizes in multiples of 16): the
    reference serves it, warned, and strict refuses."""
    spec = AttentionSpec(8, 2, 64, BF16, block_size=8)
    loose = backend_for("cpu-arm-acl", settings=Settings(strict=False))
    with pytest.warns(PluginApiWarning, match="does not support .* falling back to reference"):
        _, prov = loose.implementation_for(OpFamily.ATTENTION, spec)
    assert prov.fallback and prov.backend == "reference"
    strict = backend_for("cpu-arm-acl", settings=Settings(strict=True))
    with pytest.raises(FallbackRefused, match="PLUGIN_API_STRICT=1"):
        strict.implementation_for(OpFamily.ATTENTION, spec)


def test_a_form_that_is_not_a_matmul_form_is_an_error():
    with pytest.raises(TypeError, match="OneDnnGemm: form must be a MatmulForm or None, got 'acl'"):
        OneDnnGemm(form="acl")  # type: ignore[arg-type]


def test_bad_thread_count_is_an_error():
    with pytest.raises(ValueError, match="threads=0 must be >= 1"):
        OneDnnGemm(threads=0)
    with pytest.raises(ValueError, match="threads=0 must be >= 1"):
        PanelGemm(threads=0)


@pytest.mark.parametrize(
    "impl,machine,reference",
    [
        ("ref:any", "x86_64", True),
        ("ref_int8:any", "aarch64", True),
        ("brg:avx512_core_bf16", "x86_64", False),
        ("gemm:jit:f32", "x86_64", False),  # x86: oneDNN's jit sgemm
        ("gemm:jit:f32", "aarch64", True),  # aarch64: the same name runs its C++ reference gemm
        ("gemm:acl", "aarch64", False),
        ("lowp_gemm:acl", "aarch64", False),
        ("brg_matmul:sve_256", "aarch64", False),
    ],
)
def test_reference_kernel_names(impl, machine, reference):
    assert reference_kernel(impl, machine) is reference


def test_arm_keeps_bias_and_weight_scales_out_of_the_primitive():
    assert MatmulForm.for_machine("aarch64") == ACL == MatmulForm(bias=False, weight_scales=False)
    assert MatmulForm.for_machine("x86_64") == FULL
    graviton = MACHINES["graviton4"]
    assert "weight scales in the torch epilogue" in OneDnnGemm().supports(W8A8, graviton).because()
    assert "bias added to the fp32 dst" in OneDnnGemm().supports(LM_HEAD, graviton).because()
    assert "bias in the primitive" in OneDnnGemm().supports(LM_HEAD, AMX).because()
    forced = OneDnnGemm(form=FULL).supports(W8A8, graviton).because()
    assert "weight scales in the primitive" in forced


def _reference_conf(impl: OneDnnGemm, payload: object, m: int, n: int, k: int) -> tuple:
    """A problem this oneDNN serves with its reference kernel (a strided src: OneDnnGemm never
    asks for one, because oneDNN 3.2's x86 kernels reject it), or a skip where it has none."""
    conf = (m, n, k, k + 64, n, CODES[F32], CODES[F32], CODES[F32], 0, 0, 2)
    built = extension().ops.matmul(list(conf), payload.packed)
    if not reference_kernel(str(built.impl()), platform.machine()):
        pytest.skip(f"this oneDNN runs a strided src in {built.impl()}, not its reference code")
    return conf


def test_a_primitive_on_oneDNNs_reference_kernel_is_warned_once_and_refused_when_strict(
    onednn_backend,
):
    spec = GemmSpec(64, 128, F32, F32)
    loose = OneDnnGemm(threads=2, strict=False)
    payload = loose.prepare(spec, _rand(64, 128, seed=1, dtype=F32), None)
    conf = _reference_conf(loose, payload, 3, 64, 128)
    with pytest.warns(PluginApiWarning, match=r"fp32xfp32->fp32 M=3 N=64 K=128.*reference kernel"):
        loose._build(conf, payload)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loose._build(conf, payload)  # the same kind again: not warned twice
    strict = OneDnnGemm(threads=2, strict=True)
    with pytest.raises(FallbackRefused, match=r"reference kernel '[^']+'.*PLUGIN_API_STRICT=1"):
        strict._build(conf, payload)


@pytest.mark.parametrize("form", [None, ACL], ids=["machine-default", "acl"])
def test_strided_rows_run_optimised_kernels(onednn_backend, form: MatmulForm | None):
    """x and out with row strides beyond the row (a slice of a wider buffer) are staged through
    dense buffers, so oneDNN never sees the strided problem its x86 kernels reject."""
    spec = GemmSpec(96, 256, F32, F32)
    impl = OneDnnGemm(threads=2, form=form, strict=True)
    w = _rand(96, 256, seed=2, dtype=F32)
    payload = impl.prepare(spec, w, None)
    b = _rand(96, seed=3, dtype=F32)
    for m in (1, 2, 7):
        x = _rand(m, 320, seed=m, dtype=F32)[:, :256]
        out = torch.full((m, 128), float("nan"))[:, :96]
        impl.mm(spec, x, payload, b, out)
        torch.testing.assert_close(out, x @ w.t() + b, atol=1e-4, rtol=1e-5)
    for problem in impl.cache.problems():
        built = impl.cache.get_or_build(problem, lambda _: pytest.fail("not cached"))
        assert built.kernel == f"oneDNN {built.prim.impl()}"
        assert not reference_kernel(str(built.prim.impl()), platform.machine()), problem


@pytest.mark.parametrize("wdt", [S8, BF16, F32])
@pytest.mark.parametrize("n,k", [(48, 64), (64, 96), (100, 100), (384, 256)])
def test_small_weights_run_optimised_kernels_at_every_m(onednn_backend, wdt, n, k):
    """Weights are packed in the layout PACK_M rows pick, unless a one-row call over it would run
    oneDNN's reference kernel (3.2 on AMX did for int8 weights with K <= 256 at M 1-5): then in
    a one-row problem's. Strict, so any M on reference code fails the test."""
    host = onednn_backend.info
    spec = GemmSpec(n, k, wdt, F32)
    impl = OneDnnGemm(threads=2, strict=True, gemv=GemvPolicy())
    if not impl.supports(spec, host):
        pytest.skip(impl.supports(spec, host).because())
    w = _rand(n, k, seed=k, dtype=wdt)
    scale = _rand(n, seed=n, dtype=F32).abs() * 0.01 if wdt == S8 else None
    payload = impl.prepare(spec, w, scale)
    for m in (*range(1, 21), 64):
        x = _rand(m, k, seed=m, dtype=wdt)
        out = torch.full((m, n), float("nan"))
        if wdt == S8:
            sx = _rand(m, seed=m, dtype=F32).abs() * 0.02
            impl.scaled_mm(spec, x, sx, payload, None, out)
            want = (x.long() @ w.long().t()).double() * sx.double()[:, None] * scale.double()
        else:
            impl.mm(spec, x, payload, None, out)
            want = x.double() @ w.double().t()
        torch.testing.assert_close(out.double(), want, atol=1e-3, rtol=1e-4)
    for problem in impl.cache.problems():
        built = impl.cache.get_or_build(problem, lambda _: pytest.fail("not cached"))
        assert not reference_kernel(str(built.prim.impl()), platform.machine()), problem


def test_the_bench_reports_the_onednn_kernel_each_case_ran(onednn_backend):
    """``note_kernel``: a bench case served by the oneDNN GEMM names the oneDNN implementation
    its primitive got, in the JSON and the progress line; other implementations name none."""
    from plugin_api.bench import cases as C
    from plugin_api.bench.ceilings import measure_ceilings
    from plugin_api.bench.harness import Method, synchronizer
    from plugin_api.bench.report import run_dict
    from plugin_api.bench.run import run_bench

    tiny = Method(warmup=0, target_s=1e-3, min_samples=2, max_samples=3, cap_s=1.0)
    cpu = torch.device("cpu")
    ceilings = measure_ceilings(cpu, 8 << 20, tiny, synchronizer(cpu), stop_after_s=1.0,
                                sizes=(64, 128))  # fmt: skip
    cases = (
        C.GemmCase("tiny_head", 65, 64, 32, C.BF16, C.FP32, "lm_head"),  # M=65: past gemv_m
        C.GemmCase("tiny_w8a8", 2, 48, 64, C.INT8, C.BF16),
    )
    progress = io.StringIO()
    run = run_bench(onednn_backend, C.FAMILIES, quick=True, cases=cases, method=tiny,
                    ceilings=ceilings, progress=progress)  # fmt: skip
    results = run_dict(run)["cases"]
    if not any(p["impl"] == "onednn" for d in results for p in d.get("provenance", ())):
        pytest.skip("the oneDNN GEMM serves none of these cases here (bf16 and int8 on panels)")
    for d in results:
        assert d["status"] == "ok", d
        if any(p["impl"] == "onednn" for p in d["provenance"]):
            assert d["kernels"] and all(k.startswith("oneDNN ") for k in d["kernels"]), d
            assert not any(reference_kernel(k[7:], platform.machine()) for k in d["kernels"])
            assert f"[{d['kernels'][0]}" in progress.getvalue()
        else:
            assert "kernels" not in d, d

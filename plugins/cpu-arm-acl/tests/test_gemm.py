"""oneDNN GEMM: primitive-cache keys, LM-head numerics, variant policy, visible fallbacks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plugin_api.backend import backend_for
from plugin_api.contract import OpFamily
from plugin_api.errors import FallbackRefused
from plugin_api.machines import MACHINES
from plugin_api.ops import gemm
from plugin_api.ops.attention import AttentionSpec
from plugin_api.ops.gemm import GemmProblem, GemmSpec
from plugin_api.reference.gemm import ReferenceGemm
from plugin_api.selection import PluginApiWarning
from plugin_api.settings import Settings
from plugin_api_cpu_arm_acl.gemm import OneDnnGemm
from plugin_api_cpu_arm_acl.settings import LmHeadPolicy

BF16, F32 = torch.bfloat16, torch.float32


def _rand(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = BF16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def test_every_problem_field_keys_its_own_primitive(onednn_backend):
    """Real calls that differ in one descriptor field each get their own cached primitive."""
    impl = OneDnnGemm(policy=LmHeadPolicy(), threads=2)
    w = {(n, k, dt): _rand(n, k, seed=n + k, dtype=dt) for n in (64, 80) for k in (96, 128)
         for dt in (BF16, F32)}  # fmt: skip
    packed = {}
    calls: list[tuple[GemmProblem, object, torch.Tensor]] = []
    prim_of: dict[GemmProblem, object] = {}

    def call(n=64, k=96, wdt=BF16, odt=F32, usage="linear", m=3, bias=None, x_pad=0, o_pad=0,
             threads=2):  # fmt: skip
        key = (n, k, wdt, odt, usage)
        if key not in packed:
            packed[key] = gemm.prepare(w[(n, k, wdt)], out_dtype=odt, usage=usage,
                                       backend=onednn_backend)  # fmt: skip
        p = packed[key]
        x = _rand(m, k + x_pad, seed=m, dtype=wdt)[:, :k]
        out = torch.full((m, n + o_pad), float("nan"), dtype=odt)[:, :n]
        b = None if bias is None else _rand(n, seed=5, dtype=bias)
        impl.threads = threads
        plan = impl.plan(p.spec, p.payload, x, b, out)
        before = len(impl.cache)
        impl.mm(p.spec, x, p.payload, b, out)
        expect = x.double() @ w[(n, k, wdt)].double().t() + (0 if b is None else b.double())
        tol = dict(atol=1e-3, rtol=1e-4) if odt == F32 else dict(atol=2e-2, rtol=1.6e-2)
        torch.testing.assert_close(out.double(), expect, **tol)
        prim = impl.cache.get_or_build(plan.problem, lambda _: pytest.fail("not cached"))
        calls.append((plan.problem, prim, out))
        prim_of[plan.problem] = prim
        return plan.problem, len(impl.cache) - before

    base, added = call()
    assert added == 1
    f32_base, _ = call(wdt=F32)  # fp32 x is used in place (bf16 x may be upcast: contiguous)
    variations = {
        "m": (base, dict(m=4)),
        "n": (base, dict(n=80)),
        "k": (base, dict(k=128)),
        "b_dtype": (base, dict(wdt=F32)),
        "bias_dtype": (base, dict(bias=BF16)),
        "a_row_stride": (f32_base, dict(wdt=F32, x_pad=32)),
        "c_row_stride": (base, dict(o_pad=16)),
        "usage": (base, dict(usage="lm_head")),
        "variant": (base, dict(threads=1)),
    }
    for name, (ref, change) in variations.items():
        problem, added = call(**change)
        diff = {f.name for f in dataclasses.fields(GemmProblem)
                if getattr(problem, f.name) != getattr(ref, f.name)}  # fmt: skip
        assert name in diff, (name, diff)
        assert prim_of[problem] is not prim_of[ref], f"changing {name} reused a primitive"
    # same shape, bf16 out vs fp32 out: never the same primitive (upstream's missing c_type)
    bf16_out, _ = call(odt=BF16)
    assert bf16_out != base and prim_of[bf16_out] is not prim_of[base]
    call(odt=BF16, bias=F32)
    # every distinct problem has its own primitive object, and equal problems share one
    by_problem: dict[GemmProblem, set[int]] = {}
    for problem, prim, _ in calls:
        by_problem.setdefault(problem, set()).add(id(prim))
    assert all(len(ids) == 1 for ids in by_problem.values())
    prims = [next(iter(ids)) for ids in by_problem.values()]
    assert len(prims) == len(set(prims)) == len(impl.cache)


def test_bf16_out_is_one_downcast_of_the_fp32_accumulator(onednn_backend):
    w = _rand(300, 512, seed=1, scale=0.05)
    x = _rand(5, 512, seed=2)
    f32 = gemm.mm(x, gemm.prepare(w, out_dtype=F32, usage="lm_head", backend=onednn_backend))
    b16 = gemm.mm(x, gemm.prepare(w, out_dtype=BF16, usage="lm_head", backend=onednn_backend))
    policy = onednn_backend.candidates(OpFamily.GEMM)[0].impl.policy
    if policy.f32_dst(5, 300) or not _native_bf16(onednn_backend):
        assert torch.equal(b16, f32.to(BF16))


def _native_bf16(backend) -> bool:
    from plugin_api_cpu_arm_acl.isa import bf16_matmul

    return bf16_matmul(backend.info)


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
    for chunk in range(0, rows, 512):
        x = _rand(512, k, seed=100 + chunk)
        ours = gemm.mm(x, packed)
        theirs = torch.empty_like(ours)
        ref.mm(spec, x, ref_payload, None, theirs)
        agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
    assert agree / rows >= 0.999, f"argmax agrees on {agree} of {rows} rows"


@pytest.mark.parametrize("m,n,expect", [(1, 128256, BF16), (9, 128256, F32), (64, 4096, BF16)])
def test_policy_picks_the_kernel_dst(m, n, expect):
    impl = OneDnnGemm(policy=LmHeadPolicy(min_n=64000, min_m=9))
    spec = GemmSpec(n, 4096, BF16, BF16, "lm_head")
    assert impl.kernel_dst(spec, m, compute=BF16) == expect
    assert impl.kernel_dst(dataclasses.replace(spec, out_dtype=F32), m, compute=BF16) == F32
    assert impl.kernel_dst(spec, m, compute=F32) == F32  # no bf16 kernel: always f32 + downcast


def test_policy_argument_overrides():
    assert (
        OneDnnGemm(policy=LmHeadPolicy(min_n=1, min_m=1)).kernel_dst(
            GemmSpec(8, 8, BF16, BF16), 1, compute=BF16
        )
        == F32
    )


def test_supports_is_pure_and_names_reasons():
    impl = OneDnnGemm()
    avx2 = dataclasses.replace(MACHINES["xeon-cpu"], cpu_flags=frozenset({"avx2", "fma"}))
    amx = MACHINES["xeon-cpu"]
    lm_head = GemmSpec(128256, 4096, BF16, F32, "lm_head")
    w8a8 = GemmSpec(4096, 14336, torch.int8, BF16)
    assert "upcast once at prepare" in impl.supports(lm_head, avx2).because()
    assert "fp32 out is the kernel's dst" in impl.supports(lm_head, amx).because()
    assert not impl.supports(w8a8, avx2) and "saturates" in impl.supports(w8a8, avx2).because()
    assert impl.supports(w8a8, amx) and impl.supports(w8a8, MACHINES["graviton4"])
    fp16 = GemmSpec(64, 64, torch.float16, torch.float16)
    assert "fp16 GEMM is not offered" in impl.supports(fp16, amx).because()


def test_unsupported_ops_fall_back_visibly(onednn_backend):
    """A spec cpu-arm-acl rejects (its attention takes block sizes in multiples of 16): the
    reference serves it, warned, and strict refuses."""
    spec = AttentionSpec(8, 2, 64, BF16, block_size=8)
    loose = backend_for("cpu-arm-acl", settings=Settings(strict=False))
    with pytest.warns(PluginApiWarning, match="does not support .* falling back to reference"):
        _, prov = loose.resolve(OpFamily.ATTENTION, spec)
    assert prov.fallback and prov.backend == "reference"
    strict = backend_for("cpu-arm-acl", settings=Settings(strict=True))
    with pytest.raises(FallbackRefused, match="PLUGIN_API_STRICT=1"):
        strict.resolve(OpFamily.ATTENTION, spec)


def test_bad_thread_count_is_an_error():
    with pytest.raises(ValueError, match="threads=0 must be >= 1"):
        OneDnnGemm(threads=0)

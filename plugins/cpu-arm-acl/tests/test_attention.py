"""CPU paged attention: decisions for other machines (no hardware needed), and the native
kernels on this machine against the dense oracle for odd shapes, thread counts and splits."""

from __future__ import annotations

import dataclasses
import platform
import shutil
import subprocess

import pytest
import torch
from torch.utils.cpp_extension import include_paths

from plugin_api.backend import backend_for
from plugin_api.conformance.cases import make_case, with_query_layout
from plugin_api.conformance.test_attention import (
    TOLERANCE,
    assert_same_in_every_layout,
    run_and_check,
    spec_of,
)
from plugin_api.contract.graphs import GraphLevel
from plugin_api.device_info import DeviceInfo, TorchBuild, read_device_info
from plugin_api.errors import BackendUnavailable
from plugin_api.machines import MACHINES
from plugin_api.ops.attention import FP8, Attention, AttentionSpec
from plugin_api_cpu_arm_acl import _attention_ext as ext
from plugin_api_cpu_arm_acl import cpu_family
from plugin_api_cpu_arm_acl.attention import CpuPagedAttention, matrix_path, prefetch_target
from plugin_api_cpu_arm_acl.settings import ATTENTION_MATRIX, ATTENTION_PREFETCH

IMPL = CpuPagedAttention()
SPEC = AttentionSpec(num_heads=32, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
THIS_BOX = DeviceInfo(  # the development machine: AMD EPYC (Zen 3), AVX2 + FMA, no AVX-512
    machine="x86_64",
    cpu_model="AMD EPYC",
    cpu_count=2,
    cpu_flags=frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}),
    torch=TorchBuild("2.13.0+cpu"),
)


PATHS = {i.name: i for i in ext.ISA_PATHS}
SKYLAKE_X = dataclasses.replace(  # AVX-512 without BF16
    MACHINES["xeon-cpu"], cpu_flags=MACHINES["xeon-cpu"].cpu_flags - {"avx512_bf16", "amx_bf16"}
)


@pytest.mark.parametrize(
    "info,isa",
    [
        (MACHINES["graviton4"], "neon"),
        (MACHINES["xeon-cpu"], "avx512bf16"),
        (MACHINES["mi300x"], "avx512bf16"),  # its host CPU: an AVX-512 EPYC
        (SKYLAKE_X, "avx512"),
        (THIS_BOX, "avx2"),
    ],
    ids=["graviton4", "xeon", "epyc-zen4", "skylake-x", "epyc-zen3"],
)
def test_isa_path_is_chosen_from_cpu_flags_and_shown(info, isa):
    d = IMPL.supports(SPEC, info)
    assert d.ok, d.reasons
    assert f"native {isa} path" in d.because()


@pytest.mark.parametrize(
    "info,change,tiles",
    [
        (MACHINES["xeon-cpu"], {}, True),
        (MACHINES["xeon-cpu"], dict(head_size=80), False),  # not whole 32-element chunks
        (MACHINES["xeon-cpu"], dict(kv_cache_dtype=FP8), False),
        (MACHINES["mi300x"], {}, False),  # AVX-512 BF16 without AMX
    ],
    ids=["amx", "amx-head-80", "amx-fp8-cache", "zen4"],
)
def test_decode_scores_on_amx_tiles_are_shown(info, change, tiles):
    """The decision says when the decode scores run on AMX tiles (attention_tiles.h's rule)."""
    d = IMPL.supports(dataclasses.replace(SPEC, **change), info)
    assert d.ok, d.reasons
    assert ("decode scores on AMX tiles" in d.because()) is tiles, d.because()


def test_cpu_without_vector_isa_is_rejected():
    old = dataclasses.replace(THIS_BOX, cpu_flags=frozenset({"sse4_2", "avx"}))
    d = IMPL.supports(SPEC, old)
    assert not d.ok and "without a supported vector ISA" in d.because()


@pytest.mark.parametrize(
    "change,why",
    [
        (dict(head_size=72), "head_size=72"),
        (dict(head_size=1024), "head_size=1024"),
        (dict(block_size=8), "block_size=8"),
        (dict(block_size=24), "block_size=24"),
        (dict(dcp_size=2), "dcp_size=2"),
        (dict(query_dtype=FP8, kv_cache_dtype=FP8), "no fp8-query path"),
    ],
)
def test_unsupported_specs_are_rejected_with_reasons(change, why):
    d = IMPL.supports(dataclasses.replace(SPEC, **change), THIS_BOX)
    assert not d.ok and why in d.because()


@pytest.mark.parametrize(
    "change",
    [dict(head_size=80), dict(head_size=256), dict(block_size=32), dict(kv_cache_dtype=FP8)],
)
def test_supported_variants_are_accepted(change):
    assert IMPL.supports(dataclasses.replace(SPEC, **change), THIS_BOX).ok


def test_graph_level_is_never_with_a_reason():
    g = IMPL.graph_support(SPEC, THIS_BOX)
    assert g.level == GraphLevel.NEVER and "CPU" in g.reason


def test_build_key_changes_with_torch_version_and_isa():
    avx2, neon = PATHS["avx2"], PATHS["neon"]
    keys = {
        ext.build_key(avx2, "2.13.0"),
        ext.build_key(avx2, "2.14.0"),
        ext.build_key(neon, "2.13.0"),
    }
    assert len(keys) == 3


def test_failed_build_names_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    broken = dataclasses.replace(PATHS["avx2"], name="broken", cflags=("-mno-such-flag",))
    folder = ext.cache_root() / "broken"
    with pytest.raises(ext.ExtensionBuildError, match=r"compiler output in .*build\.log") as e:
        ext._build(broken, "plugin_api_cpu_attention_broken", folder, folder / "x.so")
    assert "no-such-flag" in (folder / "build.log").read_text()
    assert e.value.backend == "cpu-arm-acl"


# ---- the native kernels on this machine --------------------------------------------------------

native = pytest.mark.skipif(
    ext.isa_path(read_device_info()) is None, reason="this CPU has no supported vector ISA"
)


@pytest.fixture(scope="module")
def backend():
    return backend_for("cpu-arm-acl")


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


# this CPU's variant, and AVX2's where this CPU runs it too: the x86 variants' fp8 loads are
# AVX-512's (avx512bf16, avx512) or AVX2's own
_INFO = read_device_info()
RUNNABLE = [
    i
    for i in ext.ISA_PATHS
    if i == ext.isa_path(_INFO)
    or (i.name == "avx2" and _INFO.machine in i.machines and i.needs <= _INFO.cpu_flags)
]


@pytest.mark.parametrize("isa", RUNNABLE, ids=[i.name for i in RUNNABLE])
def test_fp8_load_matches_torch(isa):
    """Every fp8 byte as each variant's loads decode it (to fp32: integer arithmetic on x86, a
    table on NEON; to bf16 words: the AVX-512 BF16 build's vdpbf16ps path and AVX2's pair loads)
    equals torch's conversion, signed zeros included."""
    got_f32, got_bf16 = ext.load(isa.name).ops.fp8_values()
    fp8 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8)
    for got, want, bits in (
        (got_f32, fp8.float(), torch.int32),
        (got_bf16, fp8.to(torch.bfloat16), torch.int16),
    ):
        if got is got_bf16 and isa.name not in ("avx512bf16", "avx2"):
            assert got.numel() == 0  # the build has no bf16 path
            continue
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got[~nan].view(bits), want[~nan].view(bits))  # bits: -0.0


@native
def test_ops_report_the_limits_they_were_built_with():
    """The admission limits reach the C++ as definitions and come back through ``limits``; the
    plan's tables have the columns the kernels report."""
    kernels = ext.load(ext.isa_path(read_device_info()).name)
    limits = kernels.limits
    assert (limits.head_multiple, limits.max_head_size) == (ext.HEAD_MULTIPLE, ext.MAX_HEAD_SIZE)
    assert (limits.block_multiple, limits.max_block_size) == (
        ext.BLOCK_MULTIPLE,
        ext.MAX_BLOCK_SIZE,
    )
    assert limits.vector_width in (4, 8, 16)
    assert kernels.ops is getattr(torch.ops, ext.namespace(kernels.isa))
    spec = spec_of(num_heads=8, num_kv_heads=2)
    case = make_case(spec, [1, 40], [70, 40], num_decodes=1, device="cpu", seed=1)
    plan = IMPL.plan(spec, case.batch, torch.device("cpu"), None)
    assert plan.items.shape[1] == limits.item_fields
    assert plan.reduce.shape[1] == limits.reduce_fields


@native
def test_ops_reject_bad_arguments_by_name():
    """A direct call with a wrong tensor fails in the op with the argument's name, before any
    kernel reads a pointer."""
    ops = ext.load(ext.isa_path(read_device_info()).name).ops
    spec = spec_of(num_heads=8, num_kv_heads=2)
    case = make_case(spec, [1, 3], [20, 9], num_decodes=1, device="cpu", seed=2)
    plan = IMPL.plan(spec, case.batch, torch.device("cpu"), None)
    args = dict(
        query=case.query,
        kv_cache=case.cache.data,
        block_table=plan.block_table,
        seq_lens=plan.seq_lens,
        items=plan.items,
        reduce=plan.reduce,
        partial_acc=plan.partial_acc,
        partial_ml=plan.partial_ml,
        sinks=None,
        out=torch.empty_like(case.query),
        scale=spec.softmax_scale,
        k_scale=1.0,
        v_scale=1.0,
        causal=True,
        window=0,
        soft_cap=0.0,
        matrix=False,
        ahead_l1=False,
    )
    ops.forward(**args)  # as given: accepted
    fused = with_query_layout(case, "fused-qkv").query
    ops.forward(**{**args, "query": fused})  # rows and heads read by stride: accepted
    bad = {
        "query": case.query.transpose(1, 2).contiguous().transpose(1, 2),
        "out": torch.empty(3, 8, spec.head_size, dtype=spec.dtype),
        "sinks": torch.zeros(8, dtype=torch.float64),
        "items": plan.items[:, :4].contiguous(),
        "kv_cache": case.cache.data[:, :, :, :8],
        "block_table": plan.block_table.long(),
    }
    for name, value in bad.items():
        with pytest.raises(RuntimeError, match=name):
            ops.forward(**{**args, name: value})
    with pytest.raises(RuntimeError, match="block_size=24"):
        ops.plan(
            query_start_loc=case.batch.query_start_loc,
            seq_lens=case.batch.seq_lens,
            num_seqs=2,
            group=4,
            kv_heads=2,
            block_size=24,
            causal=True,
            window=0,
            num_threads=1,
            tile_rows=64,
            min_split_keys=512,
        )


# (query_lens, seq_lens, num_decodes): one-token sequences, contexts ending on a block boundary
# (16, 32, 64), decode-only, a prefill tile of many rows next to decodes.
ODD_BATCHES = {
    "one-token-seqs": ([1, 1, 1], [1, 1, 2], 3),
    "block-boundaries": ([1, 1, 16], [16, 32, 64], 2),
    "decode-and-prefill": ([1, 3, 40], [70, 19, 40], 2),
}


@native
@pytest.mark.parametrize("cache", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("head_size", [64, 80, 128, 256])
@pytest.mark.parametrize("shape", list(ODD_BATCHES))
def test_odd_shapes(backend, threads, head_size, shape, cache):
    q, L, nd = ODD_BATCHES[shape]
    spec = spec_of(
        num_heads=8,
        num_kv_heads=2,
        head_size=head_size,
        num_speculative_tokens=2,
        kv_cache_dtype=cache,
    )
    case = make_case(spec, q, L, num_decodes=nd, device="cpu", seed=head_size, pad_rows=3)
    run_and_check(backend, torch.device("cpu"), case)


@native
@pytest.mark.parametrize(
    "feature",
    [{}, dict(has_sinks=True), dict(kv_cache_dtype=FP8, logits_soft_cap=6.0)],
    ids=["base", "sinks", "fp8+softcap"],
)
def test_long_context_split_across_threads(backend, threads, feature):
    """One request with a long context: its key range is split into parts that run on every
    thread and are combined afterwards (sinks join only that final combination)."""
    spec = spec_of(**feature)
    case = make_case(spec, [1], [2100], num_decodes=1, device="cpu", seed=21)
    plan = Attention(spec, backend).plan(case.batch)
    split = plan.impl_plan.reduce.shape[0] > 0
    assert split == (threads > 1), "a single long request must be split when threads > 1"
    run_and_check(backend, torch.device("cpu"), case)


@native
@pytest.mark.parametrize("mode", ["on", "off"], ids=["matrix", "vector"])
def test_strided_query_is_read_in_place(monkeypatch, threads, mode):
    """A query whose rows and heads are strided (a fused QKV split, padded heads, head-major)
    is read by stride in every layout of the kernels, with no copy: decode items, a long
    decode split across threads, multi-token decode and a prefill tile of many rows (rows or
    matrix layout); the output and the cache write are the contiguous query's, bit for bit."""
    monkeypatch.setenv(ATTENTION_MATRIX, mode)
    spec = spec_of(num_heads=8, num_kv_heads=2, has_sinks=True, num_speculative_tokens=2)
    case = make_case(
        spec, [1, 3, 1, 40], [2100, 30, 17, 60], num_decodes=3, device="cpu", seed=8, pad_rows=2
    )
    assert_same_in_every_layout(backend_for("cpu-arm-acl"), case)


@native
@pytest.mark.parametrize("heads,kv_heads", [(12, 12), (24, 12), (6, 3), (64, 16)])
def test_decode_items_take_several_kv_heads(backend, threads, heads, kv_heads):
    """A decode item reads up to 8 KV heads of each block (one contiguous run of the cache);
    head counts that leave a smaller last group, MHA, and split long contexts included."""
    spec = spec_of(num_heads=heads, num_kv_heads=kv_heads, num_speculative_tokens=2)
    case = make_case(spec, [1, 3, 1], [40, 77, 1300], num_decodes=3, device="cpu", seed=kv_heads)
    items = Attention(spec, backend).plan(case.batch).impl_plan.items
    first, count = items[:, 1].tolist(), items[:, 2].tolist()
    assert max(count) == min(kv_heads, 8)
    assert all(f % 8 == 0 and 0 < c <= 8 for f, c in zip(first, count, strict=True))
    run_and_check(backend, torch.device("cpu"), case)


@native
@pytest.mark.parametrize("cache", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("head_size", [80, 128])
@pytest.mark.parametrize("window", [None, 7, 20])
def test_decode_of_odd_key_ranges(backend, threads, head_size, window, cache):
    """Decode rows whose visible keys start or end at odd positions, for 1-4 rows per KV
    head: the bf16 P.V of the avx512bf16 path takes keys in pairs (a lone key pairs with zero),
    and head size 80 ends on a 16-element chunk; an fp8 cache takes the same path widened to
    bf16. Besides the kit's tolerance, the mean error stays within 2x that of rounding the
    exact result to bf16 (with p rounded to bf16 as well: 1.1-1.3x on the Zen 4)."""
    for group in (1, 2, 3, 4):
        spec = spec_of(
            num_heads=2 * group,
            num_kv_heads=2,
            head_size=head_size,
            sliding_window=window,
            kv_cache_dtype=cache,
        )
        case = make_case(spec, [1, 1, 1, 1], [1, 2, 33, 301], num_decodes=4, device="cpu", seed=7)
        run_and_check(backend, torch.device("cpu"), case)
        attn = Attention(spec, backend)
        out = torch.empty_like(case.query)
        attn.run(case.query, case.key, case.value, case.cache, attn.plan(case.batch), out=out)
        want = case.expected()
        rounding = (want.to(spec.dtype).float() - want).abs().mean()
        assert (out.float() - want).abs().mean() <= 2 * rounding


@native
def test_window_and_gqa_in_a_wide_prefill_tile(backend, threads):
    spec = spec_of(num_heads=16, num_kv_heads=2, sliding_window=21, logits_soft_cap=4.0)
    case = make_case(spec, [1, 37], [50, 90], num_decodes=1, device="cpu", seed=4)
    run_and_check(backend, torch.device("cpu"), case)


@native
@pytest.mark.parametrize(
    "feature",
    [
        {},
        dict(sliding_window=37, logits_soft_cap=4.0),
        dict(has_sinks=True, block_size=32),
        dict(block_size=48, head_size=96),
        dict(block_size=80, head_size=64),
    ],
    ids=["bs16", "bs16-window+softcap", "bs32-sinks", "bs48-d96", "bs80-d64"],
)
def test_rows_layout_runs_of_blocks_against_the_oracle(monkeypatch, threads, feature):
    """The rows layout (prefill tiles where the matrix layout is off) takes runs of whole blocks
    (about 64 keys: four of 16, two of 32, one of 48 or 80): key ranges that start and end inside
    a run (a window, a context starting mid-block, a tile of more than TILE_ROWS rows), and
    query rows in 6-row P.V and 24-row score tiles with their remainders (12 query heads)."""
    monkeypatch.setenv(ATTENTION_MATRIX, "off")
    backend = backend_for("cpu-arm-acl")
    spec = spec_of(num_heads=12, num_kv_heads=2, **feature)
    case = make_case(
        spec, [1, 23, 50, 9], [40, 230, 171, 9], num_decodes=1, device="cpu", seed=5, pad_rows=2
    )
    assert not Attention(spec, backend).plan(case.batch).impl_plan.matrix
    run_and_check(backend, torch.device("cpu"), case)


# ---- the variants this machine cannot run still compile ----------------------------------------

COMPILERS = {"x86_64": "g++", "aarch64": "aarch64-linux-gnu-g++"}


@pytest.mark.parametrize("isa", ext.ISA_PATHS, ids=[i.name for i in ext.ISA_PATHS])
def test_every_isa_variant_compiles(isa):
    """Type-checks every source as each variant is compiled (no code generation: seconds).
    The aarch64 variant needs a cross compiler (Debian: g++-aarch64-linux-gnu)."""
    arch = "aarch64" if "aarch64" in isa.machines else "x86_64"
    cxx = COMPILERS[arch] if arch != platform.machine() else "g++"
    if shutil.which(cxx) is None:
        pytest.skip(f"no {cxx} to compile the {isa.name} variant with")
    includes = [f"-isystem{p}" for p in include_paths()] + [f"-I{ext.CSRC}"]
    cmd = [cxx, "-std=c++17", "-fsyntax-only", *ext.cflags(isa), *includes]
    runs = {
        source: subprocess.Popen([*cmd, str(ext.CSRC / source)], stderr=subprocess.PIPE, text=True)
        for source in ext.SOURCES
    }
    for source, run in runs.items():
        _, err = run.communicate()
        assert run.returncode == 0, f"{source}: {err[-3000:]}"


# ---- the matrix layout: prefill tiles as bf16 GEMMs through torch's cpublas::brgemm ------------

XEON = MACHINES["xeon-cpu"]  # AMX


@pytest.mark.parametrize(
    "info,mode,change,used,shown",
    [
        (XEON, "auto", {}, True, "on AMX (oneDNN)"),
        (XEON, "off", {}, False, f"matrix-engine path off ({ATTENTION_MATRIX}=off)"),
        (XEON, "auto", dict(dtype=torch.float16), False, "it takes a bf16 query, a bf16 or fp8"),
        (XEON, "auto", dict(kv_cache_dtype=FP8), True, "widened to bf16, p as two bf16 terms"),
        (
            XEON,
            "on",
            dict(dtype=torch.float32, kv_cache_dtype=FP8),
            False,
            "it takes a bf16 query, a bf16 or fp8 KV cache",
        ),
        (THIS_BOX, "auto", {}, False, "no matrix-engine path: no AMX"),
        (THIS_BOX, "on", {}, True, f"forced on ({ATTENTION_MATRIX}=on) without AMX"),
    ],
    ids=["amx", "amx-off", "amx-fp16", "amx-fp8-cache", "amx-fp32-fp8", "no-amx", "no-amx-forced"],
)
def test_matrix_path_is_chosen_from_amx_and_the_setting_and_shown(info, mode, change, used, shown):
    spec = dataclasses.replace(SPEC, **change)
    d = CpuPagedAttention(matrix=mode).supports(spec, info)
    assert d.ok and shown in d.because()
    assert matrix_path(spec, info, mode).used is used


@native
def test_matrix_setting_reaches_the_plan(monkeypatch):
    spec = spec_of(num_heads=4, num_kv_heads=2)
    case = make_case(spec, [1, 20], [9, 40], num_decodes=1, device="cpu")
    for mode, used in (("on", True), ("off", False)):
        monkeypatch.setenv(ATTENTION_MATRIX, mode)
        attn = Attention(spec, backend_for("cpu-arm-acl"))
        assert attn.impl.matrix == mode
        assert attn.plan(case.batch).impl_plan.matrix is used
    monkeypatch.setenv(ATTENTION_MATRIX, "sometimes")
    # like every setting of the plugin, a bad value stops it from loading, with the reason
    with pytest.raises(BackendUnavailable, match=f"{ATTENTION_MATRIX}='sometimes' must be one of"):
        backend_for("cpu-arm-acl")


@pytest.fixture
def matrix_on(monkeypatch):
    """The backend with the matrix layout forced on (without AMX: torch's gemm runs it)."""
    monkeypatch.setenv(ATTENTION_MATRIX, "on")
    return backend_for("cpu-arm-acl")


# (query_lens, seq_lens, num_decodes): prefill tiles of 16+ rows per KV head next to a decode,
# contexts that start and end inside blocks, a tile of more than TILE_ROWS rows (two items)
MATRIX_BATCHES = {
    "mixed": ([1, 9, 40], [33, 25, 107], 1),
    "long-tile": ([70], [90], 0),
    # 300 rows per KV head: a full MATRIX_TILE_ROWS item and a 44-row one
    "two-tiles": ([150], [170], 0),
    # with 2 threads, a 48-row item over 1100 keys is split in two, the partials combined
    "split-keys": ([24], [1100], 0),
}


@native
@pytest.mark.parametrize(
    "feature",
    [
        {},
        dict(has_sinks=True),
        dict(sliding_window=21, logits_soft_cap=4.0),
        dict(causal=False),
        dict(block_size=32, head_size=80),
        dict(block_size=128, head_size=64),
        dict(block_size=48, head_size=96),  # panels 48 wide
        dict(block_size=80, head_size=144),  # panels of 64 and 16
        dict(head_size=256),
        dict(kv_cache_dtype=FP8),
        dict(kv_cache_dtype=FP8, sliding_window=21, has_sinks=True, block_size=48, head_size=80),
    ],
    ids=[
        "base",
        "sinks",
        "window+softcap",
        "non-causal",
        "bs32-d80",
        "bs128-d64",
        "bs48-d96",
        "bs80-d144",
        "d256",
        "fp8",
        "fp8-window-sinks-bs48-d80",
    ],
)
@pytest.mark.parametrize("shape", list(MATRIX_BATCHES))
def test_matrix_layout_against_the_oracle(matrix_on, threads, feature, shape):
    """Besides the kit's tolerance, the mean error stays within 2x that of rounding the exact
    result to bf16 (p is rounded to bf16 before P.V here), and the result is not the vector
    kernels' (so the setting really switched the path)."""
    q, L, nd = MATRIX_BATCHES[shape]
    spec = spec_of(num_heads=4, num_kv_heads=2, **feature)
    case = make_case(spec, q, L, num_decodes=nd, device="cpu", seed=len(feature), pad_rows=2)
    attn = Attention(spec, matrix_on)
    plan = attn.plan(case.batch)
    assert plan.impl_plan.matrix
    run_and_check(matrix_on, torch.device("cpu"), case)
    out = torch.empty_like(case.query)
    attn.run(case.query, case.key, case.value, case.cache, plan, sinks=case.sinks, out=out)
    want = case.expected()
    n = case.num_tokens
    rounding = (want.to(spec.dtype).float() - want).abs().mean()
    assert (out[:n].float() - want).abs().mean() <= 2 * rounding
    vector = CpuPagedAttention(matrix="off")
    vplan = vector.plan(spec, case.batch, torch.device("cpu"), None)
    vout = torch.empty_like(case.query)
    vector.forward(spec, case.query, case.cache, vplan, case.sinks, vout)
    assert not torch.equal(vout[:n], out[:n])


@native
@pytest.mark.parametrize("cache", [None, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("mode", ["on", "off"])
def test_nan_past_the_end_of_sequences_stays_out(monkeypatch, threads, mode, cache):
    """Cache rows past a sequence's end hold NaN (a freed block's old contents can): the matrix
    layout multiplies whole panels, so those rows must enter them as zeros, and no path may
    read them."""
    monkeypatch.setenv(ATTENTION_MATRIX, mode)
    spec = spec_of(
        num_heads=4, num_kv_heads=2, sliding_window=30, kv_sharing=True, kv_cache_dtype=cache
    )
    case = make_case(spec, [1, 24, 40], [17, 40, 75], num_decodes=1, device="cpu", seed=5)
    bs = spec.block_size
    used = set()
    for row, length in zip(case.batch.block_table.tolist(), [17, 40, 75], strict=True):
        blocks = -(-length // bs)
        used.update(row[:blocks])
        case.cache.data[row[blocks - 1], :, :, length % bs or bs :, :] = float("nan")
    for b in set(range(case.cache.data.shape[0])) - used:
        case.cache.data[b] = float("nan")
    attn = Attention(spec, backend_for("cpu-arm-acl"))
    out = torch.empty_like(case.query)
    attn.run(case.query, None, None, case.cache, attn.plan(case.batch), out=out)
    torch.testing.assert_close(out.float(), case.expected(), **TOLERANCE[spec.dtype])


ZEN5_CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
NEOVERSE_CPUINFO = (
    "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"
)


def test_cpu_family_is_read_from_cpuinfo():
    assert cpu_family.read(ZEN5_CPUINFO) == "AuthenticAMD 26"
    assert cpu_family.read(NEOVERSE_CPUINFO) is None
    assert cpu_family.parse("AuthenticAMD 26") == ("AuthenticAMD", 26)
    assert cpu_family.parse("GenuineIntel 6") == ("GenuineIntel", 6)
    for bad in (None, "", "AuthenticAMD", "AuthenticAMD x"):
        assert cpu_family.parse(bad) is None


def _with_family(family: str | None) -> DeviceInfo:
    return THIS_BOX.with_facts({cpu_family.FACT: family} if family else {})


@pytest.mark.parametrize(
    "family,mode,l1,says",
    [
        ("AuthenticAMD 26", "auto", True, "into L1 (AuthenticAMD family 26: measured faster)"),
        ("AuthenticAMD 25", "auto", False, "into L2 (AuthenticAMD family 25)"),
        ("GenuineIntel 6", "auto", False, "into L2 (GenuineIntel family 6)"),
        (None, "auto", False, "into L2 (CPU family unknown)"),
        ("AuthenticAMD 26", "l2", False, f"into L2 ({ATTENTION_PREFETCH}=l2)"),
        ("AuthenticAMD 25", "l1", True, f"into L1 ({ATTENTION_PREFETCH}=l1)"),
    ],
)
def test_prefetch_target_by_cpu_family(family, mode, l1, says):
    """Where the decode kernels prefetch the next KV block: L1 only where it was measured faster
    (AMD family 26, the Zen 5), L2 elsewhere; the setting overrides; doctor's line says which."""
    target = prefetch_target(_with_family(family), mode)
    assert target.l1 is l1
    assert says in target.reason
    decision = CpuPagedAttention(prefetch=mode).supports(SPEC, _with_family(family))
    assert says in decision.reasons[0]


def test_prefetch_mode_is_checked():
    with pytest.raises(ValueError, match="prefetch='L3'"):
        CpuPagedAttention(prefetch="L3")
    with pytest.raises(ValueError, match="prefetch mode 'L3'"):
        prefetch_target(THIS_BOX, "L3")


@native
def test_prefetch_target_changes_no_result(monkeypatch, threads):
    """Either prefetch target gives bit-identical outputs (they are hints), the reference's
    within tolerance: a split long decode, a windowed one and a spec-decode row group."""
    spec = spec_of(num_speculative_tokens=2, sliding_window=300, kv_sharing=True)
    case = make_case(spec, [1, 3, 1], [2100, 77, 1300], num_decodes=3, device="cpu", seed=3)
    outs = []
    for mode in ("l1", "l2"):
        monkeypatch.setenv(ATTENTION_PREFETCH, mode)
        attn = Attention(spec, backend_for("cpu-arm-acl"))
        plan = attn.plan(case.batch)
        assert plan.impl_plan.ahead_l1 is (mode == "l1")
        out = torch.empty_like(case.query)
        attn.run(case.query, None, None, case.cache, plan, out=out)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0].float(), case.expected(), **TOLERANCE[spec.dtype])


# ---- masked keys never enter P.V (issue 30, item 8) ---------------------------------------------


def _visible(spec: AttentionSpec, pos: int, j: int) -> bool:
    if not spec.causal:
        return True
    return j <= pos and (spec.sliding_window is None or j > pos - spec.sliding_window)


def _poison(case, query_lens, seq_lens, marks):
    """NaN/Inf into K and V of positions `marks(length, n)` ({position: (k, v)}, None: leave),
    in the cache or this step's inputs, and the oracle's copies. Returns the rows that see one."""
    bs = case.spec.block_size
    table, qsl = case.batch.block_table, case.batch.query_start_loc.tolist()
    sees = torch.zeros(case.num_tokens, dtype=torch.bool)
    for s, (n, length) in enumerate(zip(query_lens, seq_lens, strict=True)):
        poison = marks(length, n)
        for j, pair in poison.items():
            for which, x in enumerate(pair):
                if x is None:
                    continue
                (case.k_full if which == 0 else case.v_full)[s][j] = x
                if j >= length - n:
                    src = case.key if which == 0 else case.value
                    src[qsl[s] + j - (length - n)] = x
                else:
                    case.cache.data[int(table[s, j // bs]), which, :, j % bs, :] = x
        for i, p in enumerate(range(length - n, length)):
            sees[qsl[s] + i] = any(_visible(case.spec, p, j) for j in poison)
    return sees


NAN, INF = float("nan"), float("inf")


def _marks(length: int, n: int, window: int | None) -> dict[int, tuple[float | None, float | None]]:
    """Keys of the step that earlier queries of the step cannot see, keys that a window hides
    from later ones, and (with a window) history no query sees."""
    start = length - n
    marks: dict[int, tuple[float | None, float | None]] = {}
    if window is not None:
        marks.update({j: (NAN, -INF) for j in range(max(0, start - 40), start - 30)})
    if n >= 3:
        marks.update({length - 1: (None, INF), length - 2: (NAN, None)})
    if n >= 30:
        marks.update({start + n // 2: (None, -INF), start + 5: (INF, NAN)})
    return marks


@native
@pytest.mark.parametrize("mode", ["on", "off"], ids=["matrix", "vector"])
@pytest.mark.parametrize(
    "feature",
    [
        dict(dtype=torch.bfloat16),
        dict(dtype=torch.bfloat16, sliding_window=9),
        dict(dtype=torch.float32, sliding_window=12, logits_soft_cap=20.0),
        dict(dtype=torch.float16, sliding_window=7, has_sinks=True),
        dict(dtype=torch.bfloat16, num_heads=16, num_kv_heads=2, sliding_window=6),
    ],
    ids=["causal-bf16", "window-bf16", "window-softcap-fp32", "window-sinks-fp16", "gqa8-bf16"],
)
def test_masked_non_finite_values_stay_out_of_every_layout(monkeypatch, threads, mode, feature):
    """NaN/Inf in keys a query cannot see (causally, or outside its window) never reach its row,
    in the dot (decode, spec decode), rows and matrix (prefill tiles, several items per
    sequence) layouts; a row that sees one is non-finite, as the oracle is."""
    monkeypatch.setenv(ATTENTION_MATRIX, mode)
    spec = spec_of(**{"num_heads": 4, "num_kv_heads": 2, "num_speculative_tokens": 3, **feature})
    query_lens, seq_lens = [1, 4, 9, 40, 70], [80, 57, 60, 75, 110]
    case = make_case(spec, query_lens, seq_lens, num_decodes=2, device="cpu", seed=9)
    sees = _poison(case, query_lens, seq_lens, lambda L, n: _marks(L, n, spec.sliding_window))
    clean = ~sees
    assert clean.any() and sees.any()
    attn = Attention(spec, backend_for("cpu-arm-acl"))
    out = attn.run(
        case.query, case.key, case.value, case.cache, attn.plan(case.batch), sinks=case.sinks
    )
    got = out[: case.num_tokens].float()
    expected = case.expected()
    assert torch.isfinite(expected[clean]).all()
    bad = (~torch.isfinite(got[clean])).flatten(1).any(1)
    assert not bad.any(), f"rows {clean.nonzero().flatten()[bad].tolist()} took a masked NaN/Inf"
    torch.testing.assert_close(got[clean], expected[clean], **TOLERANCE[spec.dtype])
    assert (~torch.isfinite(got[sees])).flatten(1).any(1).all()

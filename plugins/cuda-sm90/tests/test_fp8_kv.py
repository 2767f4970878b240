"""An fp8 KV cache on SM90/SM12x (issue 34, item 3): every row of a step, decode rows included,
goes through the FA2 paged prefill. The plan built for it (no decode step, one prefill step from
row 0) against the batch it came from, and every FlashInfer call of such a step bound to the
installed FlashInfer's real signatures with the cache's scales; CPU tensors, no GPU."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from plugin_api.conformance.cases import PagedCase, make_case
from plugin_api.ops.attention import FP8, AttentionSpec
from plugin_api_cuda_sm90 import calls, metadata
from plugin_api_cuda_sm90.metadata import FlashInferPlan
from plugin_api_cuda_sm90.rules import Arch, decodes_in_prefill

flashinfer = pytest.importorskip("flashinfer", reason="flashinfer-python (installed by make test)")
CPU = torch.device("cpu")
WORKSPACE = torch.zeros(64, dtype=torch.uint8)
K_SCALE, V_SCALE = 0.5, 4.0
FA2_ARCHS = [Arch.SM90, Arch.SM12X]

SPECS: dict[str, dict[str, Any]] = {
    "base": {},
    "sinks+window": dict(has_sinks=True, sliding_window=48),
    "non-causal": dict(causal=False),
    "kv-sharing": dict(kv_sharing=True),
    "fp16-head256": dict(dtype=torch.float16, head_size=256),
    "head128-block64": dict(head_size=128, block_size=64),
}
# (query_lens, seq_lens, num_decodes, padding rows): decodes first
BATCHES: dict[str, tuple[list[int], list[int], int, int]] = {
    "mixed": ([1, 1, 7, 12], [20, 33, 7, 40], 2, 0),
    "decode-only": ([1, 1, 1], [16, 5, 48], 3, 0),
    "decode-only-padded": ([1, 1, 1], [16, 5, 48], 3, 2),
    "one-token-seqs": ([1, 1], [1, 1], 2, 0),
    "uniform-spec": ([4, 4, 4], [20, 32, 9], 3, 0),
    "ragged-spec+prefill": ([2, 4, 1, 10], [19, 22, 40, 10], 3, 0),
    "prefill-only": ([9, 17], [9, 30], 0, 0),
}


def spec_of(**kw: Any) -> AttentionSpec:
    base: dict[str, Any] = dict(
        num_heads=8,
        num_kv_heads=2,
        head_size=64,
        block_size=16,
        num_speculative_tokens=3,
        kv_cache_dtype=FP8,
    )
    return AttentionSpec(**{**base, **kw})


def case_of(spec: AttentionSpec, batch: str) -> PagedCase:
    q, L, nd, pad = BATCHES[batch]
    return make_case(
        spec,
        q,
        L,
        num_decodes=nd,
        device=CPU,
        seed=3,
        pad_rows=pad,
        k_scale=K_SCALE,
        v_scale=V_SCALE,
    )


def plan_of(
    spec: AttentionSpec, case: PagedCase, arch: Arch, reuse: FlashInferPlan | None = None
) -> FlashInferPlan:
    """What ``FlashInferAttention.plan`` builds for ``arch`` (before planning the wrapper)."""
    flag = decodes_in_prefill(spec, arch)
    return metadata.build_plan(spec, case.batch, CPU, reuse, decodes_in_prefill=flag)


def step_calls(
    spec: AttentionSpec, case: PagedCase, plan: FlashInferPlan, out: torch.Tensor
) -> list[calls.Call]:
    """The calls ``FlashInferAttention.plan`` and ``forward`` make for an FA2-only step."""
    assert plan.decode is None and plan.prefill is not None
    p = plan.prefill
    return [
        calls.prefill_wrapper_call(spec, WORKSPACE),
        calls.prefill_plan_call(spec, p, None),
        calls.prefill_run_call(spec, p, None, case.query, case.cache, case.sinks, out),
    ]


def bind(call: calls.Call, function: Any = None) -> inspect.BoundArguments:
    fn = function or call.function()
    receiver = () if call.method is None else (object(),)  # the unbound method's ``self``
    return inspect.signature(fn).bind(*receiver, *call.args, **call.kwargs)


@pytest.mark.parametrize("arch", FA2_ARCHS, ids=str)
@pytest.mark.parametrize("batch", list(BATCHES))
def test_the_plan_puts_every_row_in_one_prefill_step(batch: str, arch: Arch) -> None:
    spec = spec_of()
    q, L, _, pad = BATCHES[batch]
    case = case_of(spec, batch)
    assert len(case.query) == sum(q) + pad
    plan = plan_of(spec, case, arch)
    assert plan.decode is None
    assert plan.decode_rows(len(case.query)) == 0 and plan.decode_requests(len(case.query)) == 0
    p = plan.prefill
    assert p is not None
    assert (p.first_row, p.num_rows) == (0, sum(q))  # padding rows are never computed
    starts = [sum(q[:i]) for i in range(len(q) + 1)]
    blocks = [-(-n // spec.block_size) for n in L]
    table = case.batch.block_table.tolist()
    assert p.qo_indptr.tolist() == starts
    assert p.kv_indptr.tolist() == [sum(blocks[:i]) for i in range(len(L) + 1)]
    pages = list(zip(table, L, blocks, strict=True))
    assert p.kv_indices.tolist() == [b for row, _, k in pages for b in row[:k]]
    assert p.kv_last_page_len.tolist() == [n - (k - 1) * spec.block_size for _, n, k in pages]
    for t in (p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_last_page_len):
        assert t.dtype == torch.int32 and t.device == CPU  # FlashInfer copies host metadata


def test_a_reusing_plan_keeps_every_row_in_the_prefill() -> None:
    spec = spec_of()
    first = plan_of(spec, case_of(spec, "mixed"), Arch.SM90)
    second = plan_of(spec, case_of(spec, "uniform-spec"), Arch.SM90, reuse=first)
    assert second.decode is None and second.prefill is not None
    assert second.prefill.qo_indptr.tolist() == [0, 4, 8, 12]
    assert second.bufs is first.bufs


@pytest.mark.parametrize(
    "arch,kv,decode",
    [
        (Arch.SM90, torch.bfloat16, True),  # XQA
        (Arch.SM12X, torch.float16, True),  # XQA
        (Arch.SM100, FP8, True),  # trtllm-gen takes the fp8 cache itself
        (Arch.SM90, FP8, False),
        (Arch.SM12X, FP8, False),
    ],
)
def test_only_an_fp8_cache_on_xqa_archs_loses_the_decode_step(
    arch: Arch, kv: torch.dtype, decode: bool
) -> None:
    dtype = torch.float16 if kv == torch.float16 else torch.bfloat16
    spec = spec_of(kv_cache_dtype=kv, dtype=dtype)
    plan = plan_of(spec, case_of(spec, "mixed"), arch)
    assert (plan.decode is not None) is decode
    assert plan.prefill is not None and plan.prefill.first_row == (2 if decode else 0)


@pytest.mark.parametrize("arch", FA2_ARCHS, ids=str)
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("feature", list(SPECS))
def test_every_fp8_call_binds_with_the_scales(feature: str, batch: str, arch: Arch) -> None:
    spec = spec_of(**SPECS[feature])
    case = case_of(spec, batch)
    plan = plan_of(spec, case, arch)
    out = torch.empty(case.query.shape, dtype=spec.dtype)
    ctor, plan_call, run = step_calls(spec, case, plan, out)
    target = calls.SINK_PREFILL if spec.has_sinks else calls.PREFILL
    assert {ctor.target, plan_call.target, run.target} == {target}
    for call in (ctor, plan_call, run):
        bind(call)
    if spec.has_sinks:
        # the sink wrapper forwards its keywords (the scales, out) to the plain run
        plain = calls.import_target(calls.PREFILL).run
        inspect.signature(plain).bind(object(), *run.args, **run.kwargs)
        assert ctor.kwargs["kv_data_type"] == FP8 and ctor.kwargs["q_data_type"] == spec.dtype
        assert ctor.kwargs["backend"] == "fa2"
    assert ctor.kwargs["backend"] == calls.PREFILL_BACKEND == "fa2"
    kw = plan_call.kwargs
    assert (kw["q_data_type"], kw["kv_data_type"], kw["o_data_type"]) == (
        spec.dtype,
        FP8,
        spec.dtype,
    )
    assert kw["causal"] is spec.causal and kw["page_size"] == spec.block_size
    assert (run.kwargs["k_scale"], run.kwargs["v_scale"]) == (K_SCALE, V_SCALE)
    # the real rows of the caller's query and output, from row 0, as views (no copies)
    n = case.num_tokens
    query, cache = run.args[0], run.args[1]
    assert query.shape[0] == n and query.data_ptr() == case.query.data_ptr()
    assert run.kwargs["out"].shape[0] == n and run.kwargs["out"].data_ptr() == out.data_ptr()
    assert cache is case.cache.data and cache.dtype == FP8


def test_the_sink_variant_takes_an_fp8_cache_and_the_k_scale() -> None:
    """The sink-aware JIT variant is specialised for an e4m3 cache with no extra scale tensors
    (those are NVFP4's), and its run folds ``k_scale`` into the positional ``sm_scale`` the
    kernel reads (the plain wrapper folds it only into its own, which this variant ignores)."""
    from flashinfer.attention import _core

    spec = spec_of(has_sinks=True, sliding_window=48, scale=0.1)
    case = case_of(spec, "mixed")
    out = torch.empty(case.query.shape, dtype=spec.dtype)
    ctor, _, run = step_calls(spec, case, plan_of(spec, case, Arch.SM90), out)
    cls = calls.import_target(calls.SINK_PREFILL)
    k = ctor.kwargs
    backend, jit_args, jit_kwargs = cls._sink_jit_args(
        CPU, k["backend"], k["q_data_type"], k["kv_data_type"], 64, 64, k["window_left"]
    )
    assert backend == "fa2" and "_bf16_e4m3_" in jit_args[0]
    assert (jit_args[1], jit_args[2], jit_args[3]) == (torch.bfloat16, FP8, torch.bfloat16)
    assert jit_args[7] == ["sink"] and jit_args[9] == ["sm_scale"], jit_args
    assert jit_kwargs["use_sliding_window"] is True
    sinks, sm_scale = run.args[2:]
    assert sinks is case.sinks and sm_scale == pytest.approx(0.1)
    folded, q_scale, k_scale = _core._fold_qk_scale(run.args[2:], None, run.kwargs["k_scale"])
    assert folded[0] is sinks and folded[1] == pytest.approx(0.1 * K_SCALE)
    assert q_scale is None and k_scale is None


def test_the_installed_flashinfer_keeps_what_the_fp8_path_relies_on() -> None:
    """Two facts of FlashInfer's source the contract precision rests on: the FA2 prefill's fp8
    MMAs are chosen by the query's dtype alone (an fp8 cache under a bf16/fp16 query is cast to
    the query's dtype before the MMAs), and ``run`` scales ``out`` by ``v_scale`` in place (so
    the plugin's preallocated output view gets the scaled result)."""
    from pathlib import Path

    root = Path(flashinfer.__file__).parent
    prefill_cuh = root / "data/include/flashinfer/attention/prefill.cuh"
    source = prefill_cuh.read_text()
    assert "USE_FP8_MMA = std::is_same_v<DTypeQ_, __nv_fp8_e4m3>;" in source
    assert "vec_cast<typename KTraits::DTypeQ, typename KTraits::DTypeKV>" in source
    run = inspect.getsource(calls.import_target(calls.PREFILL).run)
    assert "sm_scale *= k_scale" in run
    assert "out *= v_scale" in run


# auto picks cuda-sm90 where it is validated (SM90); on SM12x, where it is experimental, the
# user names it
@pytest.mark.parametrize("machine,chosen", [("h200", None), ("rtx-5090", "cuda-sm90")])
def test_the_doctor_report_serves_fp8_kv_natively_never_captured(
    machine: str, chosen: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``plugin-api doctor --device-info h200`` reports for a model with an fp8 cache (its
    own example models have none): the selection's backend, the doctor's per-model report."""
    from plugin_api.backend import Backend
    from plugin_api.cli.model_specs import Layer, ModelExample
    from plugin_api.cli.op_report import model_report
    from plugin_api.contract import OpFamily
    from plugin_api.machines import MACHINES
    from plugin_api.registry import load_plugins
    from plugin_api.selection import LoadedSelection, select
    from plugin_api.settings import read_settings

    for name in ("PLUGIN_API_BACKEND", "PLUGIN_API_PLUGINS", "PLUGIN_API_STRICT"):
        monkeypatch.delenv(name, raising=False)
    if chosen is not None:
        monkeypatch.setenv("PLUGIN_API_BACKEND", chosen)
    settings = read_settings()
    registry = load_plugins(settings, MACHINES[machine])
    backend = Backend(
        LoadedSelection(select(registry.records, settings, registry.info), registry, settings)
    )
    assert backend.id == "cuda-sm90"
    fp8 = AttentionSpec(32, 8, 128, torch.bfloat16, block_size=16, kv_cache_dtype=FP8)
    model = ModelExample("llama-3-8b, fp8 KV", (Layer("attention", OpFamily.ATTENTION, fp8),))
    (layer,) = model_report(backend, model)["layers"]
    assert layer["chosen"] == {
        "impl": "flashinfer",
        "path": "native",
        "backend": "cuda-sm90",
        "fallback": False,
    }
    (flashinfer_row,) = [c for c in layer["trace"] if c["impl"] == "flashinfer"]
    assert "decode and prefill rows through the FlashInfer FA2" in flashinfer_row["reason"]
    assert layer["graph"]["level"] == "NEVER"
    assert "SM90 or SM12x, fp8 KV cache" in layer["graph"]["reason"]

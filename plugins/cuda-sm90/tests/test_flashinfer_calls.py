"""Every FlashInfer call the plugin makes, built by the code path that makes it (CPU tensors of
the right shapes and dtypes), bound to the installed FlashInfer's real signatures: an API
drift fails here instead of on a GPU."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from plugin_api.conformance.cases import make_case
from plugin_api.ops.attention import FP8, AttentionSpec
from plugin_api_cuda_sm90 import calls, metadata
from plugin_api_cuda_sm90.rules import Arch, decodes_in_prefill

flashinfer = pytest.importorskip("flashinfer", reason="flashinfer-python (installed by make test)")
CPU = torch.device("cpu")
WORKSPACE = torch.zeros(64, dtype=torch.uint8)

SPECS = {
    "base": {},
    "sinks+window": dict(has_sinks=True, sliding_window=48),
    "fp8-kv": dict(kv_cache_dtype=FP8),
    "non-causal": dict(causal=False),
    "kv-sharing": dict(kv_sharing=True),
    "fp16-head256": dict(dtype=torch.float16, head_size=256),
}
BATCHES = {
    "mixed": ([1, 1, 7, 12], [20, 33, 7, 40], 2),
    "uniform-spec": ([4, 4, 4], [20, 32, 9], 3),
    "ragged-spec+prefill": ([2, 4, 1, 10], [19, 22, 40, 10], 3),
    "single-token": ([1, 1, 1], [16, 5, 48], 3),
    "prefill-only": ([9, 17], [9, 30], 0),
}


def spec_of(**kw: Any) -> AttentionSpec:
    base: dict[str, Any] = dict(
        num_heads=8, num_kv_heads=2, head_size=64, block_size=16, num_speculative_tokens=3
    )
    return AttentionSpec(**{**base, **kw})


def bind(call: calls.Call, function: Any = None) -> inspect.BoundArguments:
    fn = function or call.function()
    sig = inspect.signature(fn)
    receiver = () if call.method is None else (object(),)  # the unbound method's ``self``
    return sig.bind(*receiver, *call.args, **call.kwargs)


def step_calls(spec: AttentionSpec, batch: str, arch: Arch, pad: int = 0) -> list[calls.Call]:
    """The calls ``plan`` and ``forward`` make for one step, in order."""
    q, L, nd = BATCHES[batch]
    case = make_case(spec, q, L, num_decodes=nd, device=CPU, seed=1, pad_rows=pad)
    in_prefill = decodes_in_prefill(spec, arch)  # as the implementation's plan() decides
    plan = metadata.build_plan(spec, case.batch, CPU, None, decodes_in_prefill=in_prefill)
    out = torch.empty(case.query.shape, dtype=spec.dtype)
    made = []
    if plan.decode is not None:
        made.append(
            calls.decode_call(spec, arch, plan, case.query, case.cache, case.sinks, out, WORKSPACE)
        )
    if plan.prefill is not None:
        made.append(calls.prefill_wrapper_call(spec, WORKSPACE))
        made.append(calls.prefill_plan_call(spec, plan.prefill, None))
        made.append(
            calls.prefill_run_call(
                spec, plan.prefill, None, case.query, case.cache, case.sinks, out
            )
        )
    return made


@pytest.mark.parametrize("arch", [Arch.SM90, Arch.SM100], ids=str)
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("feature", list(SPECS))
def test_every_call_binds_to_the_installed_api(feature: str, batch: str, arch: Arch) -> None:
    spec = spec_of(**SPECS[feature])
    made = step_calls(spec, batch, arch)
    assert made, "a step makes at least one call"
    for call in made:
        bind(call)
        if call.method == "run" and call.target == calls.SINK_PREFILL:
            # the sink wrapper forwards its keywords to the plain run: bind them there too
            plain = calls.import_target(calls.PREFILL).run
            inspect.signature(plain).bind(object(), *call.args, **call.kwargs)


def test_decode_kernel_per_architecture() -> None:
    spec = spec_of()
    assert step_calls(spec, "single-token", Arch.SM90)[0].target == calls.XQA_DECODE
    assert step_calls(spec, "single-token", Arch.SM12X)[0].target == calls.XQA_DECODE
    sm100 = step_calls(spec, "single-token", Arch.SM100)[0]
    assert sm100.target == calls.TRTLLM_DECODE and sm100.kwargs["backend"] == "trtllm-gen"


def test_xqa_uniform_and_ragged_arguments() -> None:
    spec = spec_of(causal=False)
    uniform = step_calls(spec, "uniform-spec", Arch.SM90)[0].kwargs
    assert uniform["q_len_per_req"] == 4 and "q_cu_seq_lens" not in uniform
    assert tuple(uniform["mask"].shape) == (3, 4, 2) and uniform["mask"].dtype == torch.uint16
    assert tuple(uniform["query"].shape) == (12, 8, 64)
    ragged = step_calls(spec, "ragged-spec+prefill", Arch.SM90)[0].kwargs
    assert ragged["q_len_per_req"] == 4  # the step's longest draft
    assert ragged["q_cu_seq_lens"].tolist() == [0, 2, 6, 7]
    assert tuple(ragged["mask"].shape) == (7, 2) and tuple(ragged["query"].shape) == (7, 8, 64)
    assert ragged["kv_layout"] == "HND" and ragged["kv_cache"].dim() == 5
    single = step_calls(spec_of(num_speculative_tokens=0), "single-token", Arch.SM90, pad=2)
    kw = single[0].kwargs
    assert kw["q_len_per_req"] == 1 and "mask" not in kw
    assert kw["query"].shape[0] == 5 and kw["seq_lens"].tolist() == [16, 5, 48, 0, 0]


def test_trtllm_ragged_uses_cumulative_offsets() -> None:
    kw = step_calls(spec_of(), "ragged-spec+prefill", Arch.SM100)[0].kwargs
    assert kw["q_len_per_req"] is None and kw["max_q_len"] == 4
    assert kw["cum_seq_lens_q"].tolist() == [0, 2, 6, 7] and "mask" not in kw


def test_scales_and_window_reach_the_kernels() -> None:
    spec = spec_of(kv_cache_dtype=FP8, sliding_window=10, scale=0.1)
    q, L, nd = BATCHES["mixed"]
    case = make_case(spec, q, L, num_decodes=nd, device=CPU, k_scale=0.5, v_scale=4.0)
    plan = metadata.build_plan(spec, case.batch, CPU, None)  # SM100: fp8 decode rows decode
    out = torch.empty(case.query.shape, dtype=spec.dtype)
    dec = calls.decode_call(spec, Arch.SM100, plan, case.query, case.cache, None, out, WORKSPACE)
    assert dec.kwargs["bmm1_scale"] == pytest.approx(0.05) and dec.kwargs["bmm2_scale"] == 4.0
    assert dec.kwargs["window_left"] == 9
    assert plan.prefill is not None
    run = calls.prefill_run_call(spec, plan.prefill, None, case.query, case.cache, None, out)
    assert (run.kwargs["k_scale"], run.kwargs["v_scale"]) == (0.5, 4.0)
    assert calls.prefill_plan_call(spec, plan.prefill, None).kwargs["window_left"] == 9


def test_sinks_never_reach_the_plain_prefill() -> None:
    """The plain wrapper accepts ``sinks`` and FA2/FA3 drop them: only the sink variant gets
    them, positionally, as the extra tensor and scalar its JIT module declares."""
    with_sinks = step_calls(spec_of(has_sinks=True), "mixed", Arch.SM90)
    ctor, plan_call, run = with_sinks[1:]
    assert {ctor.target, plan_call.target, run.target} == {calls.SINK_PREFILL}
    sinks = with_sinks[0].kwargs["sinks"]
    assert run.args[2] is sinks and "sinks" not in run.kwargs
    cls = calls.import_target(calls.SINK_PREFILL)
    _, jit_args, _ = cls._sink_jit_args(
        CPU, calls.PREFILL_BACKEND, torch.bfloat16, torch.bfloat16, 64, 64, -1
    )
    assert jit_args[7] == ["sink"] and jit_args[9] == ["sm_scale"], jit_args
    for call in step_calls(spec_of(), "mixed", Arch.SM90)[1:]:
        assert call.target == calls.PREFILL
        assert "sinks" not in call.kwargs and len(call.args) <= 2


def test_kv_sharing_calls_carry_no_key_or_value() -> None:
    """A KV-sharing step reads the shared cache: every tensor a call gets is the query, the
    output, the cache, the sinks, a plan buffer, the workspace or host page metadata; there
    is no K/V tensor and no placeholder."""
    spec = spec_of(kv_sharing=True, has_sinks=True)
    for batch, (q, L, nd) in BATCHES.items():
        case = make_case(spec, q, L, num_decodes=nd, device=CPU, seed=2)
        assert case.key is None and case.value is None
        plan = metadata.build_plan(spec, case.batch, CPU, None)
        out = torch.empty(case.query.shape, dtype=spec.dtype)
        made = []
        if plan.decode is not None:
            made.append(
                calls.decode_call(
                    spec, Arch.SM90, plan, case.query, case.cache, case.sinks, out, WORKSPACE
                )
            )
        allowed = [case.query, out, case.cache.data, case.sinks, WORKSPACE]
        allowed += list(plan.buffers().values())
        if plan.prefill is not None:
            p = plan.prefill
            made.append(calls.prefill_wrapper_call(spec, WORKSPACE))
            made.append(calls.prefill_plan_call(spec, p, None))
            made.append(
                calls.prefill_run_call(spec, p, None, case.query, case.cache, case.sinks, out)
            )
            allowed += [p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_last_page_len]
        storages = {t.untyped_storage().data_ptr() for t in allowed if t is not None}
        for call in made:
            for v in [*call.args, *call.kwargs.values()]:
                if isinstance(v, torch.Tensor):
                    assert v.untyped_storage().data_ptr() in storages, (batch, call.target)

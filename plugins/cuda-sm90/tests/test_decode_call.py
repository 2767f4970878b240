"""The decode call per layer: what depends only on the spec and the plan is made on a step's
first layer and shared by the rest; what each layer brings (query, cache, scales, output,
sinks, workspace) is that layer's. CPU tensors; the calls bind to the installed FlashInfer in
``test_flashinfer_calls.py``."""

from __future__ import annotations

import torch

from plugin_api.conformance.cases import make_case
from plugin_api.ops.attention import AttentionSpec, KVCache
from plugin_api_cuda_sm90 import calls, metadata
from plugin_api_cuda_sm90.rules import Arch

CPU = torch.device("cpu")
WORKSPACE = torch.zeros(64, dtype=torch.uint8)
SPEC = AttentionSpec(8, 2, 64, torch.bfloat16, block_size=16, has_sinks=True)
PER_LAYER = ("query", "kv_cache", "workspace_buffer", "bmm1_scale", "bmm2_scale", "out", "sinks")


def test_layers_of_a_step_share_what_only_the_plan_decides() -> None:
    case = make_case(SPEC, [1, 1, 1], [20, 33, 7], num_decodes=3, device=CPU, seed=1)
    plan = metadata.build_plan(SPEC, case.batch, CPU, None)
    made = []
    for _ in range(3):  # three layers, each its own query, cache, output and sinks
        q = torch.randn_like(case.query, dtype=torch.float32).to(SPEC.dtype)
        cache = KVCache(case.cache.data.clone())
        out = torch.empty_like(q)
        sinks = torch.randn(SPEC.num_heads)
        call = calls.decode_call(SPEC, Arch.SM90, plan, q, cache, sinks, out, WORKSPACE)
        assert call.kwargs["query"] is q and call.kwargs["out"] is out  # all rows: no slice
        assert call.kwargs["kv_cache"] is cache.data and call.kwargs["sinks"] is sinks
        made.append(call)
    first, *rest = made
    shared = set(first.kwargs) - set(PER_LAYER)
    assert shared >= {"block_tables", "seq_lens", "max_seq_len", "window_left", "q_len_per_req"}
    for call in rest:
        assert call.target == first.target
        for name in shared:
            assert call.kwargs[name] is first.kwargs[name], name  # made once, not per layer


def test_padding_rows_and_a_new_step_get_their_own_arguments() -> None:
    spec = AttentionSpec(8, 2, 64, torch.bfloat16, block_size=16)
    case = make_case(spec, [1, 1, 1], [20, 33, 7], num_decodes=3, device=CPU, pad_rows=2)
    plan = metadata.build_plan(spec, case.batch, CPU, None)
    out = torch.empty_like(case.query)
    padded = calls.decode_call(spec, Arch.SM90, plan, case.query, case.cache, None, out, WORKSPACE)
    exact = calls.decode_call(
        spec, Arch.SM90, plan, case.query[:3], case.cache, None, out[:3], WORKSPACE
    )
    assert padded.kwargs["seq_lens"].tolist() == [20, 33, 7, 0, 0]
    assert exact.kwargs["seq_lens"].tolist() == [20, 33, 7]
    assert exact.kwargs["query"].shape[0] == 3 and exact.kwargs["out"].shape[0] == 3
    # the next step refills the same buffers: its plan makes its own arguments
    step = make_case(spec, [1, 1], [9, 64], num_decodes=2, device=CPU, seed=3)
    again = metadata.build_plan(spec, step.batch, CPU, plan)
    call = calls.decode_call(spec, Arch.SM90, again, step.query, step.cache, None, out, WORKSPACE)
    assert call.kwargs["seq_lens"].tolist() == [9, 64]
    assert call.kwargs["query"].shape[0] == 2 and call.kwargs["out"].shape[0] == 2

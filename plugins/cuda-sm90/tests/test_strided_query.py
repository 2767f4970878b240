"""A strided query (the split of a fused QKV output) on the FlashInfer path, without a GPU: the
FA2 prefill gets the view itself (it reads rows and heads by stride), the decode kernels get the
decode rows as dense rows, copied only when they are strided and the copy is noted."""

from __future__ import annotations

import pytest
import torch

from plugin_api.conformance.cases import QUERY_LAYOUTS, make_case, with_query_layout
from plugin_api.contract.provenance import record_kernels
from plugin_api.ops.attention import AttentionSpec
from plugin_api_cuda_sm90 import calls, metadata
from plugin_api_cuda_sm90.attention import DENSE_DECODE_QUERY, dense_decode_rows
from plugin_api_cuda_sm90.rules import Arch

CPU = torch.device("cpu")
WORKSPACE = torch.zeros(64, dtype=torch.uint8)
SPEC = AttentionSpec(
    num_heads=8, num_kv_heads=2, head_size=64, block_size=16, num_speculative_tokens=3
)
# (query_lens, seq_lens, num_decodes, padding rows)
BATCHES = {
    "mixed": ([1, 1, 7, 12], [20, 33, 7, 40], 2, 0),
    "ragged-spec+prefill": ([2, 4, 1, 10], [19, 22, 40, 10], 3, 0),
    "single-token+padding": ([1, 1, 1], [16, 5, 48], 3, 2),
    "prefill-only": ([9, 17], [9, 30], 0, 0),
}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("arch", [Arch.SM90, Arch.SM100], ids=str)
@pytest.mark.parametrize("layout", QUERY_LAYOUTS)
@pytest.mark.parametrize("batch", list(BATCHES))
def test_strided_query_reaches_each_kernel_as_it_reads_it(batch, layout, arch):
    q, L, nd, pad = BATCHES[batch]
    case = make_case(SPEC, q, L, num_decodes=nd, device=CPU, seed=3, pad_rows=pad)
    strided = with_query_layout(case, layout)
    plan = metadata.build_plan(SPEC, case.batch, CPU, None)
    out = torch.empty(case.query.shape, dtype=SPEC.dtype)
    t = case.query.shape[0]
    if plan.decode is not None:
        rows = plan.decode_rows(t)
        with record_kernels() as noted:
            dense = dense_decode_rows(strided.query, rows)
        assert noted == [DENSE_DECODE_QUERY]
        assert dense.is_contiguous() and torch.equal(_bytes(dense), _bytes(case.query[:rows]))
        want = calls.decode_call(SPEC, arch, plan, case.query, case.cache, None, out, WORKSPACE)
        got = calls.decode_call(SPEC, arch, plan, dense, case.cache, None, out, WORKSPACE)
        # the dense rows make the same call: the same rows, requests, lengths and masks
        assert got.kwargs["query"].data_ptr() == dense.data_ptr()
        for name, value in want.kwargs.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(_bytes(got.kwargs[name]), _bytes(value)), name
            else:
                assert got.kwargs[name] == value, name
    if plan.prefill is not None:
        run = calls.prefill_run_call(SPEC, plan.prefill, None, strided.query, case.cache, None, out)
        view = run.args[0]
        first = plan.prefill.first_row
        assert view.stride() == strided.query.stride(), "the prefill gets the view, not a copy"
        assert view.data_ptr() == strided.query[first].data_ptr()


def test_a_dense_query_is_never_copied():
    case = make_case(SPEC, [1, 1, 7], [20, 33, 7], num_decodes=2, device=CPU, seed=5)
    with record_kernels() as noted:
        dense = dense_decode_rows(case.query, 2)
    assert noted == [] and dense.data_ptr() == case.query.data_ptr()

"""Checks that need the GPU this plugin is for (the conformance kit covers the rest): padding
rows of one-token full graphs, and a graph captured on one step replayed after re-planning
another into the same buffers. Skipped, with the reason, where there is no such GPU."""

from __future__ import annotations

import pytest
import torch

from plugin_api.backend import backend_for
from plugin_api.conformance.cases import make_case
from plugin_api.errors import SelectionError
from plugin_api.gpu.device_graphs import capture
from plugin_api.ops.attention import Attention, AttentionSpec


@pytest.fixture(scope="module")
def backend():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: these checks run on an SM90 GPU (gpu_check.sh)")
    try:
        return backend_for("cuda-sm90")
    except SelectionError as e:
        pytest.skip(f"cuda-sm90 cannot run here: {e}")


SPEC = AttentionSpec(32, 8, 128, torch.bfloat16, block_size=16)


def _graph_run(attn: Attention, case, plan, out: torch.Tensor) -> torch.cuda.CUDAGraph:
    def step() -> None:
        attn.run(case.query, case.key, case.value, case.cache, plan, out=out)

    return capture(step, "cuda")  # after a warm-up off the capture stream (JIT loads)


def test_padded_single_token_graph(backend) -> None:
    attn = Attention(SPEC, backend)
    case = make_case(SPEC, [1, 1, 1], [20, 300, 7], num_decodes=3, device="cuda", pad_rows=5)
    plan = attn.plan(case.batch)
    out = torch.full(case.query.shape, float("nan"), dtype=SPEC.dtype, device="cuda")
    graph = _graph_run(attn, case, plan, out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    got = out[: case.num_tokens].float().cpu()
    torch.testing.assert_close(got, case.expected(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("spec_tokens,lens", [(0, [1, 1, 1, 1]), (3, [4, 4, 4, 4])])
def test_replay_after_replanning_into_the_same_buffers(backend, spec_tokens, lens) -> None:
    spec = AttentionSpec(32, 8, 128, torch.bfloat16, num_speculative_tokens=spec_tokens)
    attn = Attention(spec, backend)
    first = make_case(spec, lens, [50, 700, 33, 129], num_decodes=4, device="cuda", seed=1)
    plan = attn.plan(first.batch)
    out = torch.empty(first.query.shape, dtype=spec.dtype, device="cuda")
    graph = _graph_run(attn, first, plan, out)
    # the next step: other lengths and blocks, same shapes; the graph reads the new plan
    second = make_case(spec, lens, [9, 64, 400, 17], num_decodes=4, device="cuda", seed=2)
    attn.plan(second.batch, reuse=plan)
    first.query.copy_(second.query)
    first.key.copy_(second.key)
    first.value.copy_(second.value)
    assert second.cache.data.shape[0] <= first.cache.data.shape[0]
    first.cache.data[: second.cache.data.shape[0]].copy_(second.cache.data)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(
        out[: second.num_tokens].float().cpu(), second.expected(), atol=2e-2, rtol=2e-2
    )

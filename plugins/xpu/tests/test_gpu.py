"""Checks that need an Intel GPU (the conformance kit covers the rest): the graph level that
attention declares where torch can capture XPU graphs. A mixed prefill/decode step is captured
once and replayed after another step is planned into the same buffers. Skipped, with the reason,
where there is no such GPU or no graph capture."""

from __future__ import annotations

import pytest
import torch

from plugin_api.backend import backend_for
from plugin_api.conformance.cases import make_case
from plugin_api.errors import SelectionError
from plugin_api.ops.attention import Attention, AttentionSpec
from plugin_api.ops.graphs import GraphLevel

SPEC = AttentionSpec(
    32, 8, 128, torch.bfloat16, block_size=16, has_sinks=True, num_speculative_tokens=3
)


@pytest.fixture(scope="module")
def attn() -> Attention:
    if not torch.xpu.is_available():
        pytest.skip("no XPU device: these checks run on an Intel GPU")
    try:
        a = Attention(SPEC, backend_for("xpu"))
    except SelectionError as e:
        pytest.skip(f"xpu cannot run here: {e}")
    support = a.graph_support()
    if support.level < GraphLevel.ALWAYS:
        pytest.skip(f"attention declares {support.level}: {support.reason}")
    return a


def test_replay_of_a_mixed_batch_after_replanning_into_the_same_buffers(attn) -> None:
    # 44 query rows each: decodes (ragged multi-token) first, then prefills
    first = make_case(SPEC, [4, 1, 9, 30], [50, 700, 33, 129], num_decodes=2, device="xpu")
    second = make_case(SPEC, [2, 3, 20, 19], [9, 64, 400, 19], num_decodes=2, device="xpu", seed=2)
    plan = attn.plan(first.batch)
    out = torch.empty(first.query.shape, dtype=SPEC.dtype, device="xpu")

    def step() -> None:
        attn.run(first.query, first.key, first.value, first.cache, plan, sinks=first.sinks, out=out)

    stream = torch.xpu.Stream()
    with torch.xpu.stream(stream):  # warm-up off the capture stream (kernel compilation)
        step()
    torch.xpu.synchronize()
    graph = torch.xpu.XPUGraph()
    with torch.xpu.graph(graph):
        step()
    # the next step: other lengths, blocks and split, same row count; the graph reads the new plan
    attn.plan(second.batch, reuse=plan)
    first.query.copy_(second.query)
    first.key.copy_(second.key)
    first.value.copy_(second.value)
    first.sinks.copy_(second.sinks)
    assert second.cache.data.shape[0] <= first.cache.data.shape[0]
    first.cache.data[: second.cache.data.shape[0]].copy_(second.cache.data)
    out.fill_(float("nan"))
    torch.xpu.synchronize()
    graph.replay()
    torch.xpu.synchronize()
    torch.testing.assert_close(
        out[: second.num_tokens].float().cpu(), second.expected(), atol=2e-2, rtol=2e-2
    )

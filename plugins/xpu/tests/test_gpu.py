"""Checks that need an Intel GPU (the conformance kit covers the rest): the graph level that
attention declares where torch can capture XPU graphs. A mixed prefill/decode step is captured
once and replayed after another step is planned into the same buffers. Skipped, with the reason,
where there is no such GPU or no graph capture."""

from __future__ import annotations

import torch

from plugin_api.conformance.graph_replay import graph_capable_or_skip, replay_after_replanning
from plugin_api.ops.attention import AttentionSpec

SPEC = AttentionSpec(
    32, 8, 128, torch.bfloat16, block_size=16, has_sinks=True, num_speculative_tokens=3
)


def test_replay_of_a_mixed_batch_after_replanning_into_the_same_buffers() -> None:
    got, expected = replay_after_replanning(graph_capable_or_skip("xpu", SPEC))
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)

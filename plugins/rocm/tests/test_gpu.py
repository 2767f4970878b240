"""Checks that need an AMD GPU (the conformance kit covers the rest): the graph level that
attention declares where the installed torch captures HIP graphs (``torch.cuda.CUDAGraph`` on
ROCm). A mixed prefill/decode step is captured once and replayed after another step is planned
into the same buffers, for specs covering sinks with speculative decode, an fp8 cache with a
sliding window, and KV sharing. Skipped, with the reason, where rocm cannot run or declares a
level below ALWAYS."""

from __future__ import annotations

import pytest
import torch

from plugin_api.conformance.graph_replay import graph_capable_or_skip, replay_after_replanning
from plugin_api.ops.attention import FP8, AttentionSpec

BF16 = torch.bfloat16
SPECS = {
    "sinks+spec3": AttentionSpec(32, 8, 128, BF16, has_sinks=True, num_speculative_tokens=3),
    "fp8-kv+window": AttentionSpec(8, 2, 64, BF16, kv_cache_dtype=FP8, sliding_window=64),
    "kv-sharing+head256": AttentionSpec(8, 2, 256, BF16, kv_sharing=True, block_size=32),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_replay_of_a_mixed_batch_after_replanning_into_the_same_buffers(name: str) -> None:
    got, expected = replay_after_replanning(graph_capable_or_skip("rocm", SPECS[name]))
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)

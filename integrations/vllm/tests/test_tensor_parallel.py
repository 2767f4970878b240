"""vLLM's tensor parallelism (torch.distributed worker processes) runs on the bridge: every rank
serves its weight shards through plugin-api, reuses the first process's selection, and the fp32
greedy tokens equal the single-process run's."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.needs_vllm, pytest.mark.tensor_parallel]


def test_tensor_parallel_2_tokens_equal_one_process(runs: Any) -> None:
    one = runs.get("cpu-arm-acl", kinds=("llama",))["llama"]
    two = runs.get("cpu-arm-acl", kinds=("llama",), tensor_parallel=2)["llama"]
    assert two["tokens"] == one["tokens"]

    reports = two["reports"]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for r in reports:
        # each worker took the first process's selection (PLUGIN_API_SELECTION): no probe
        assert r["selection_reused"], r["rank"]
        assert r["backend"] == "cpu-arm-acl"
        assert not r["fallbacks"] and not r["engine_layers"], r
        assert {e["path"] for e in r["layers"].values()} == {"native"}
        assert all(e["calls"] > 0 for e in r["layers"].values()), r["rank"]

    # each rank plans its shard: half the heads, half of each linear's N or K, half the vocab
    whole = one["report"]["layers"]
    for r in reports:
        assert r["layers"].keys() == whole.keys()
        for name, entry in r["layers"].items():
            assert entry["spec"] != whole[name]["spec"], (r["rank"], name)

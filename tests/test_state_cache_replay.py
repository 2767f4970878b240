"""The replay: the upstream long-prefill scenario, the mixed workload, and per-step work that
does not depend on context length."""

from __future__ import annotations

import json
import math

import pytest

from plugin_api.state_cache import CacheMode
from plugin_api.state_cache.cost import manager_cost_per_step
from plugin_api.state_cache.replay import (
    DEFAULT_BLOCK_BYTES,
    ReplayEngine,
    RequestSpec,
    Scenario,
    main,
    run_replay,
)

PROMPT = 480_000


def upstream(mode: CacheMode, block_size: int, in_flight: int) -> Scenario:
    """One 480k-token prompt, budget 8192, 5 draft tokens; decode long enough to cross blocks."""
    return Scenario(
        (RequestSpec("long", PROMPT, decode_tokens=8_192),),
        mode=mode,
        block_size=block_size,
        token_budget=8192,
        num_speculative_tokens=5,
        in_flight=in_flight,
    )


@pytest.mark.parametrize("in_flight", [1, 2])
@pytest.mark.parametrize("block_size", [3584, 4608])
def test_upstream_scenario_keeps_at_most_9_states(block_size, in_flight):
    res = run_replay(upstream(CacheMode.ALIGN, block_size, in_flight))
    (req,) = res.requests
    assert req.peak_blocks <= 9
    assert res.pool_peak_blocks == req.peak_blocks  # nothing else holds blocks
    # the same trace keeping every boundary state holds one block per block of context
    everything = run_replay(upstream(CacheMode.ALL, block_size, in_flight))
    assert everything.requests[0].peak_blocks >= math.ceil(PROMPT / block_size)


def test_mixed_workload_reuses_the_shared_prefix(capsys):
    assert main(["--json", "--block-size", "3584", "--in-flight", "2"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)
    reqs = {r["name"]: r for r in doc["requests"]}
    assert set(reqs) == {"long", "chat-0", "chat-1", "chat-2"}
    assert reqs["chat-0"]["hit_tokens"] == 0
    assert reqs["chat-1"]["hit_tokens"] > 0 and reqs["chat-2"]["hit_tokens"] > 0
    assert doc["peak_blocks_per_request"] == max(r["peak_blocks"] for r in reqs.values()) <= 9
    assert doc["pool_peak_bytes"] == doc["pool_peak_blocks"] * DEFAULT_BLOCK_BYTES
    assert doc["cache_peak_entries"] >= 1


def test_text_output_names_every_figure(capsys):
    main(["--mode", "none", "--block-size", "4608", "--in-flight", "1", "--chat-requests", "1"])
    out = capsys.readouterr().out
    assert "mode=none block_size=4608" in out and "chat-0" in out
    assert "pool: peak" in out and "MiB/block" in out


@pytest.mark.parametrize("mode", ["align", "all", "none"])
def test_work_per_step_does_not_grow_with_context(mode):
    """The deterministic side of the bench's 4k-vs-480k time ratio: the table entries a decode
    step appends or scans are the same at both context lengths."""
    per_step = []
    for context in (4096, PROMPT):
        sc = Scenario(
            tuple(RequestSpec(f"r{i}", context, 100_000) for i in range(4)),
            mode=CacheMode(mode),
            block_size=64,  # decode crosses a boundary every few steps
        )
        e = ReplayEngine(sc)
        while not e.decoding():
            e.step()
        before = e.manager.stats.slots_visited
        for _ in range(1000):
            e.step()
        per_step.append((e.manager.stats.slots_visited - before) / 1000)
    assert per_step[1] <= 1.2 * per_step[0] + 0.01
    if mode != "none":
        assert per_step[0] > 0  # the steps did cross block boundaries


def test_manager_cost_per_step_is_a_positive_time():
    t = manager_cost_per_step(4096, steps=4, repeats=2, num_requests=2)
    assert 0 < t < 1
    with pytest.raises(ValueError, match="context_tokens=0 must be >= 1"):
        manager_cost_per_step(0)


def test_scenario_is_checked():
    with pytest.raises(ValueError, match="block_size=9000 must not exceed token_budget=8192"):
        Scenario((RequestSpec("a", 10, 1),), block_size=9000)
    with pytest.raises(ValueError, match="acceptance=2"):
        Scenario((RequestSpec("a", 10, 1),), acceptance=2)
    with pytest.raises(ValueError, match="requests must not be empty"):
        Scenario(())

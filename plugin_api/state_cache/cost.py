"""The manager's cost per engine step, for ``plugin-api bench --op state``.

Requests are first prefilled to ``context_tokens`` (not timed), then the replay's decode steps
(one token plus draft tokens per request, accepted at random) are timed: only the manager's
calls count. The data structures make this independent of context length: a step touches the
slots it writes and retirement resumes at the request's watermark, so nothing walks the table.
"""

from __future__ import annotations

import gc
import statistics

from .modes import CacheMode, parse_mode
from .pool import check_count
from .replay import ReplayEngine, RequestSpec, Scenario


def manager_cost_per_step(
    context_tokens: int,
    *,
    mode: CacheMode | str = CacheMode.ALIGN,
    block_size: int = 3584,
    token_budget: int = 8192,
    num_speculative_tokens: int = 5,
    num_requests: int = 8,
    steps: int = 256,
    repeats: int = 7,
    seed: int = 0,
) -> float:
    """Seconds of manager work per engine step (schedule and commit for each of
    ``num_requests`` decoding requests), median of ``repeats`` runs of ``steps`` steps after
    one warm-up run. Wall-clock (``time.perf_counter``): measure on a quiet machine."""
    check_count("context_tokens", context_tokens, 1)
    check_count("steps", steps, 1)
    check_count("repeats", repeats, 1)
    check_count("num_requests", num_requests, 1)
    decode = steps * (repeats + 1) * (num_speculative_tokens + 1) + 1  # never finishes while timed
    scenario = Scenario(
        tuple(RequestSpec(f"r{i}", context_tokens, decode) for i in range(num_requests)),
        mode=parse_mode(mode),
        block_size=block_size,
        token_budget=token_budget,
        num_speculative_tokens=num_speculative_tokens,
        seed=seed,
    )
    engine = ReplayEngine(scenario)
    while not engine.decoding():
        engine.step()
    per_step = []
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection inside one repeat would be charged to the manager
    try:
        for _ in range(steps):  # warm-up, not counted
            engine.step()
        for _ in range(repeats):
            engine.manager_seconds = 0.0
            for _ in range(steps):
                engine.step()
            per_step.append(engine.manager_seconds / steps)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(per_step)

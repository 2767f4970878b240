"""Random traces (admit, chunks, decode with drafts, accept/reject, abort, preempt, resume,
fork, prefix hits, evictions) in every mode, with the invariants checked after every step."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugin_api.state_cache import CacheMode

from .block_walk import chooser
from .state_cache_walk import WalkConfig, run_walk

MIN_STEPS = 100_000
MODES = list(CacheMode)


def config(rng: random.Random, i: int) -> WalkConfig:
    return WalkConfig(
        mode=MODES[i % len(MODES)],
        block_size=rng.choice([1, 2, 3, 4, 8]),
        num_spec=rng.choice([0, 1, 2, 5]),
        depth=rng.randint(1, 3),
        pool_blocks=rng.randint(6, 48),  # small pools: schedules get refused and preempt
        cache_entries=rng.choice([0, 2, 8]),
    )


def test_seeded_random_walks_run_100k_checked_steps():
    steps = hits = refused = accepted = 0
    per_mode = dict.fromkeys(MODES, 0)
    i = 0
    while steps < MIN_STEPS:
        rng = random.Random(i)
        cfg = config(rng, i)
        w = run_walk(cfg, rng.randrange, events=2_000)
        steps += w.steps
        per_mode[cfg.mode] += w.steps
        hits, refused, accepted = (
            hits + w.hits,
            refused + w.out_of_blocks,
            accepted + w.accepted_drafts,
        )
        i += 1
    assert steps >= MIN_STEPS
    assert min(per_mode.values()) >= MIN_STEPS // 4
    # the walks reached what they are meant to exercise
    assert hits > 100 and refused > 100 and accepted > 1000


@st.composite
def walk_configs(draw: st.DrawFn) -> WalkConfig:
    return WalkConfig(
        mode=draw(st.sampled_from(MODES)),
        block_size=draw(st.sampled_from([1, 2, 3, 4, 8])),
        num_spec=draw(st.integers(0, 5)),
        depth=draw(st.integers(1, 3)),
        pool_blocks=draw(st.integers(4, 40)),
        cache_entries=draw(st.sampled_from([0, 1, 4])),
        max_requests=draw(st.integers(1, 4)),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=walk_configs(), choices=st.lists(st.integers(0, 1 << 16), min_size=200, max_size=1000))
def test_hypothesis_traces_keep_every_invariant(cfg: WalkConfig, choices: list[int]) -> None:
    run_walk(cfg, chooser(choices), events=len(choices) // 2)

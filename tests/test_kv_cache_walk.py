"""Random engine traces through the KV block manager (prefill chunks, decodes with drafts,
rejections, forks, preemption, prefix hits, evictions), invariants checked after every step."""

from __future__ import annotations

import random
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .block_walk import chooser
from .kv_cache_walk import WalkConfig, run_walk

MIN_STEPS = 100_000


def config(rng: random.Random) -> WalkConfig:
    return WalkConfig(
        block_size=rng.choice([1, 2, 3, 4, 8, 16]),
        num_spec=rng.choice([0, 1, 3]),
        pool_blocks=rng.randint(4, 40),  # small pools: schedules get refused and preempt
        cache_entries=rng.choice([0, 2, 8]),
        max_seq_len=rng.choice([None, 24, 64]),
    )


def test_seeded_random_walks_run_100k_checked_steps():
    steps = hits = refused = copies = forks = rejected = 0
    i = 0
    t0 = time.perf_counter()
    while steps < MIN_STEPS:
        rng = random.Random(i)
        w = run_walk(config(rng), rng.randrange, events=2_000)
        steps += w.steps
        hits += w.hits
        refused += w.out_of_blocks
        copies += w.copies
        forks += w.forks
        rejected += w.rejected
        i += 1
    print(f"{steps} steps in {time.perf_counter() - t0:.1f} s")
    assert steps >= MIN_STEPS
    # the walks reached what they are meant to exercise
    assert hits > 1000 and refused > 1000 and copies > 1000 and forks > 1000 and rejected > 1000


@st.composite
def walk_configs(draw: st.DrawFn) -> WalkConfig:
    return WalkConfig(
        block_size=draw(st.sampled_from([1, 2, 3, 4, 8])),
        num_spec=draw(st.integers(0, 3)),
        pool_blocks=draw(st.integers(2, 32)),
        cache_entries=draw(st.sampled_from([0, 1, 4])),
        max_seq_len=draw(st.sampled_from([None, 8, 32])),
        max_seqs=draw(st.integers(1, 4)),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=walk_configs(), choices=st.lists(st.integers(0, 1 << 16), min_size=200, max_size=1000))
def test_hypothesis_traces_keep_every_invariant(cfg: WalkConfig, choices: list[int]) -> None:
    run_walk(cfg, chooser(choices), events=len(choices) // 2)

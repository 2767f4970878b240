"""Drive a state-cache manager with a scheduler trace and report the blocks it holds.

The scheduler is a small model of a serving engine's: each engine step has a token budget;
decoding requests go first (one token plus up to N draft tokens each), then prefills, shortest
remaining first, in chunks that end on a block boundary in ``align`` mode (or at the prompt's
end). ``--in-flight 2`` schedules each batch before the previous one has completed, as an
asynchronous scheduler does; a request whose draft step is in flight sits the next batch out,
since the accepted count decides where it goes on. Draft tokens are accepted one by one with a
fixed probability until the first rejection. Requests of one prefix group share their first
tokens: their block-aligned states go into a prefix cache, and later members start from a hit.

    python -m plugin_api.state_cache.replay [--block-size 3584 4608] [--in-flight 1 2] [--json]

Reports the peak live state blocks per request and in the pool, and the memory they hold at
``--block-bytes`` per block. There are no tensors here, so nothing is zeroed
(``check_initialised=False``); the tests drive the same manager with a device model that is.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field, replace

from .manager import StateCacheManager, StepBlocks
from .modes import CacheMode, parse_mode
from .pool import BlockPool, check_count
from .prefix import PrefixCache

MIB = 1 << 20
# One state block across a group's layers: 2006 MiB / 71 blocks in the upstream report.
DEFAULT_BLOCK_BYTES = 29_622_272  # 28.25 MiB


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a trace. Members of ``prefix_group`` share their first ``shared_tokens``."""

    name: str
    prompt_tokens: int
    decode_tokens: int
    arrival_step: int = 0
    prefix_group: str | None = None
    shared_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Scenario:
    requests: tuple[RequestSpec, ...]
    mode: CacheMode = CacheMode.ALIGN
    block_size: int = 3584
    token_budget: int = 8192
    num_speculative_tokens: int = 5
    in_flight: int = 1  # engine batches in flight
    acceptance: float = 0.7  # probability that each draft token is accepted
    prefix_cache_entries: int = 0  # 0: no prefix cache
    pool_blocks: int | None = None  # None: enough for every request at its worst
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", parse_mode(self.mode))
        check_count("block_size", self.block_size, 1)
        check_count("token_budget", self.token_budget, 1)
        check_count("num_speculative_tokens", self.num_speculative_tokens)
        check_count("in_flight", self.in_flight, 1)
        check_count("prefix_cache_entries", self.prefix_cache_entries)
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"acceptance={self.acceptance} must be in [0, 1]")
        if self.mode is CacheMode.ALIGN and self.block_size > self.token_budget:
            raise ValueError(
                f"align mode splits prefills on block boundaries: block_size={self.block_size} "
                f"must not exceed token_budget={self.token_budget}"
            )
        if not self.requests:
            raise ValueError("requests must not be empty")
        for r in self.requests:
            check_count(f"{r.name}.prompt_tokens", r.prompt_tokens, 1)
            check_count(f"{r.name}.decode_tokens", r.decode_tokens, 1)

    def default_pool_blocks(self) -> int:
        """Blocks for every request at its worst at once, the prefix cache full, plus null."""
        per_req = []
        for r in self.requests:
            if self.mode is CacheMode.ALL:
                table = -(
                    -(r.prompt_tokens + r.decode_tokens + self.num_speculative_tokens)
                    // self.block_size
                )
            else:
                table = self.in_flight + 1
            per_req.append(table + self.num_speculative_tokens + 1)
        return sum(per_req) + self.prefix_cache_entries + 1


@dataclass(frozen=True, slots=True)
class RequestResult:
    name: str
    prompt_tokens: int
    hit_tokens: int
    steps: int
    prefill_peak_blocks: int  # while the prompt was being computed
    peak_blocks: int  # over the request's life


@dataclass(frozen=True, slots=True)
class ReplayResult:
    scenario: Scenario
    requests: tuple[RequestResult, ...]
    pool_blocks: int
    pool_peak_blocks: int
    cache_peak_entries: int
    engine_steps: int
    manager_seconds: float

    @property
    def peak_request_blocks(self) -> int:
        return max(r.peak_blocks for r in self.requests)

    def to_json(self, block_bytes: int) -> dict[str, object]:
        s = asdict(self.scenario)
        s["mode"] = self.scenario.mode.value
        return {
            "scenario": s,
            "requests": [asdict(r) for r in self.requests],
            "peak_blocks_per_request": self.peak_request_blocks,
            "pool_blocks": self.pool_blocks,
            "pool_peak_blocks": self.pool_peak_blocks,
            "cache_peak_entries": self.cache_peak_entries,
            "block_bytes": block_bytes,
            "pool_peak_bytes": self.pool_peak_blocks * block_bytes,
            "request_peak_bytes": self.peak_request_blocks * block_bytes,
            "engine_steps": self.engine_steps,
        }


@dataclass(slots=True)
class _Live:
    spec: RequestSpec
    hit_tokens: int = 0
    scheduled: int = 0  # tokens scheduled (prompt and decode, drafts excluded)
    generated: int = 0  # decode tokens committed
    steps: int = 0
    inflight: int = 0
    prefill_peak: int = 0


@dataclass(slots=True)
class ReplayEngine:
    """Runs a ``Scenario`` one engine step at a time; times only the manager's calls."""

    scenario: Scenario
    manager_seconds: float = 0.0
    engine_steps: int = 0
    pool: BlockPool = field(init=False)
    manager: StateCacheManager = field(init=False)
    cache: PrefixCache | None = field(init=False)
    _rng: random.Random = field(init=False)
    _arrivals: deque[RequestSpec] = field(init=False)
    _waiting: list[RequestSpec] = field(init=False, default_factory=list)
    _running: dict[str, _Live] = field(init=False, default_factory=dict)
    _inflight: deque[list[StepBlocks]] = field(init=False, default_factory=deque)
    _results: list[RequestResult] = field(init=False, default_factory=list)
    _cache_peak: int = 0

    def __post_init__(self) -> None:
        sc = self.scenario
        self.pool = BlockPool(sc.pool_blocks or sc.default_pool_blocks())
        self.manager = StateCacheManager(
            self.pool,
            block_size=sc.block_size,
            mode=sc.mode,
            num_speculative_tokens=sc.num_speculative_tokens,
            check_initialised=False,  # no tensors in a replay
        )
        self.cache = None
        if sc.prefix_cache_entries and sc.mode.traits.boundary_states:
            self.cache = PrefixCache(
                self.pool, block_size=sc.block_size, capacity=sc.prefix_cache_entries
            )
        self._rng = random.Random(sc.seed)
        self._arrivals = deque(sorted(sc.requests, key=lambda r: r.arrival_step))

    @property
    def done(self) -> bool:
        return not (self._arrivals or self._waiting or self._running)

    def decoding(self) -> bool:
        """Every admitted request is past its prompt, nothing waits and nothing is in flight."""
        return (
            not self._arrivals
            and not self._waiting
            and not self._inflight
            and all(x.scheduled >= x.spec.prompt_tokens for x in self._running.values())
        )

    def step(self) -> None:
        """One engine step: schedule a batch, then complete batches down to the depth."""
        while self._arrivals and self._arrivals[0].arrival_step <= self.engine_steps:
            self._waiting.append(self._arrivals.popleft())
        batch = self._schedule()
        self._inflight.append(batch)
        while len(self._inflight) >= self.scenario.in_flight or (self._inflight and not batch):
            self._complete(self._inflight.popleft())
        if self.cache is not None:
            self._cache_peak = max(self._cache_peak, len(self.cache))
        self.engine_steps += 1

    def run(self, max_steps: int = 10_000_000) -> ReplayResult:
        while not self.done:
            if self.engine_steps >= max_steps:
                raise RuntimeError(f"replay did not finish in {max_steps} engine steps")
            self.step()
        return self.result()

    def result(self) -> ReplayResult:
        order = {r.name: i for i, r in enumerate(self.scenario.requests)}
        return ReplayResult(
            scenario=self.scenario,
            requests=tuple(sorted(self._results, key=lambda r: order[r.name])),
            pool_blocks=self.pool.num_blocks,
            pool_peak_blocks=self.pool.peak_used,
            cache_peak_entries=self._cache_peak,
            engine_steps=self.engine_steps,
            manager_seconds=self.manager_seconds,
        )

    # ---- scheduling ----------------------------------------------------------------------

    def _schedule(self) -> list[StepBlocks]:
        sc = self.scenario
        budget = sc.token_budget
        batch: list[StepBlocks] = []
        for x in self._running.values():  # decodes first
            if x.scheduled < x.spec.prompt_tokens or x.inflight >= sc.in_flight:
                continue
            left = x.spec.prompt_tokens + x.spec.decode_tokens - x.scheduled
            drafts = min(sc.num_speculative_tokens, left - 1)
            if left <= 0 or budget < 1 + drafts or (sc.num_speculative_tokens and x.inflight):
                continue  # with drafts, a step starts from committed state
            batch.append(self._call_schedule(x, 1, drafts))
            budget -= 1 + drafts
        prefills = [x for x in self._running.values() if x.scheduled < x.spec.prompt_tokens]
        prefills += [self._admit(w) for w in self._waiting]
        self._waiting.clear()
        prefills.sort(key=lambda x: x.spec.prompt_tokens - x.scheduled)
        for x in prefills:
            if budget <= 0 or x.inflight >= sc.in_flight:
                continue
            chunk = self._chunk(x, budget)
            if chunk:
                batch.append(self._call_schedule(x, chunk, 0))
                budget -= chunk
        return batch

    def _chunk(self, x: _Live, budget: int) -> int:
        left = x.spec.prompt_tokens - x.scheduled
        if left <= budget:
            return left
        if self.scenario.mode is CacheMode.ALIGN:  # chunks end on block boundaries
            bs = self.scenario.block_size
            return (x.scheduled + budget) // bs * bs - x.scheduled
        return budget

    def _admit(self, spec: RequestSpec) -> _Live:
        hit = None
        if self.cache is not None and spec.prefix_group is not None:
            bs = self.scenario.block_size
            usable = min(spec.shared_tokens, spec.prompt_tokens - 1)  # compute >= 1 token
            keys = [(spec.prefix_group, (i + 1) * bs) for i in range(usable // bs)]
            t0 = time.perf_counter()
            hit = self.cache.lookup(keys, self.scenario.mode)
            self.manager.add_request(spec.name, hit)
            self.manager_seconds += time.perf_counter() - t0
        else:
            t0 = time.perf_counter()
            self.manager.add_request(spec.name)
            self.manager_seconds += time.perf_counter() - t0
        n = hit.num_tokens if hit else 0
        x = _Live(spec, hit_tokens=n, scheduled=n)
        self._running[spec.name] = x
        return x

    def _call_schedule(self, x: _Live, tokens: int, drafts: int) -> StepBlocks:
        t0 = time.perf_counter()
        step = self.manager.schedule(x.spec.name, tokens, drafts)
        self.manager_seconds += time.perf_counter() - t0
        if x.scheduled < x.spec.prompt_tokens:  # peaks right after an allocation
            x.prefill_peak = max(x.prefill_peak, self.manager.live_blocks(x.spec.name))
        x.scheduled += tokens
        x.inflight += 1
        x.steps += 1
        return step

    # ---- completion ----------------------------------------------------------------------

    def _complete(self, batch: list[StepBlocks]) -> None:
        for step in batch:
            x = self._running[str(step.req_id)]
            accepted = self._accepted(step.num_drafts)
            t0 = time.perf_counter()
            commit = self.manager.commit(step.req_id, accepted)
            self.manager_seconds += time.perf_counter() - t0
            x.inflight -= 1
            x.scheduled += accepted
            x.generated = max(0, commit.computed - x.spec.prompt_tokens)
            if self.cache is not None and x.spec.prefix_group is not None:
                self._register(x.spec, commit.boundary_states)
            if x.generated >= x.spec.decode_tokens and x.inflight == 0:
                self._finish(x)

    def _accepted(self, drafts: int) -> int:
        n = 0
        while n < drafts and self._rng.random() < self.scenario.acceptance:
            n += 1
        return n

    def _register(self, spec: RequestSpec, states: Sequence[tuple[int, int]]) -> None:
        assert self.cache is not None
        t0 = time.perf_counter()
        for tokens, block in states:
            if tokens <= spec.shared_tokens:
                self.cache.insert((spec.prefix_group, tokens), tokens, block)
        self.manager_seconds += time.perf_counter() - t0

    def _finish(self, x: _Live) -> None:
        name: Hashable = x.spec.name
        peak = self.manager.peak_blocks(name)
        t0 = time.perf_counter()
        self.manager.free(name)
        self.manager_seconds += time.perf_counter() - t0
        del self._running[x.spec.name]
        self._results.append(
            RequestResult(
                x.spec.name, x.spec.prompt_tokens, x.hit_tokens, x.steps, x.prefill_peak, peak
            )
        )


def run_replay(scenario: Scenario) -> ReplayResult:
    return ReplayEngine(scenario).run()


def default_requests(
    *,
    prompt_tokens: int,
    decode_tokens: int,
    chat_requests: int,
    chat_prompt: int,
    shared_prefix: int,
    chat_decode: int,
    chat_gap: int,
) -> tuple[RequestSpec, ...]:
    """A long prefill, plus chat requests sharing a system prompt, arriving ``chat_gap`` steps
    apart."""
    reqs = [RequestSpec("long", prompt_tokens, decode_tokens)]
    for i in range(chat_requests):
        reqs.append(
            RequestSpec(
                f"chat-{i}",
                chat_prompt,
                chat_decode,
                arrival_step=i * chat_gap,
                prefix_group="system",
                shared_tokens=shared_prefix,
            )
        )
    return tuple(reqs)


# ---- command line ------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m plugin_api.state_cache.replay",
        description="Replay a scheduler trace through the state-cache manager; print peak blocks.",
    )
    p.add_argument("--mode", nargs="+", default=["align"], choices=[m.value for m in CacheMode])
    p.add_argument("--block-size", nargs="+", type=int, default=[3584, 4608], help="tokens")
    p.add_argument("--in-flight", nargs="+", type=int, default=[1, 2], help="batches in flight")
    p.add_argument("--budget", type=int, default=8192, help="tokens per engine step")
    p.add_argument("--spec", type=int, default=5, help="draft tokens per decode step")
    p.add_argument("--accept", type=float, default=0.7, help="per-draft acceptance probability")
    p.add_argument("--prompt-tokens", type=int, default=480_000, help="the long request's prompt")
    p.add_argument("--decode-tokens", type=int, default=256, help="the long request's output")
    p.add_argument("--chat-requests", type=int, default=3, help="requests sharing a prefix")
    p.add_argument("--chat-prompt", type=int, default=16_384)
    p.add_argument("--shared-prefix", type=int, default=12_288, help="tokens the chats share")
    p.add_argument("--chat-decode", type=int, default=512)
    p.add_argument("--chat-gap", type=int, default=4, help="engine steps between chat arrivals")
    p.add_argument("--prefix-cache", type=int, default=64, help="cache entries (0: off)")
    p.add_argument("--block-bytes", type=int, default=DEFAULT_BLOCK_BYTES)
    p.add_argument("--pool-blocks", type=int, default=None, help="default: enough for all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return p


def _print(res: ReplayResult, block_bytes: int) -> None:
    sc = res.scenario
    print(
        f"mode={sc.mode.value} block_size={sc.block_size} budget={sc.token_budget} "
        f"spec={sc.num_speculative_tokens} in_flight={sc.in_flight} accept={sc.acceptance} "
        f"prefix_cache={sc.prefix_cache_entries} engine_steps={res.engine_steps}"
    )
    print(
        f"  {'request':<8} {'prompt':>7} {'hit':>6} {'steps':>6} "
        f"{'peak in prefill':>15} {'peak blocks':>11} {'MiB':>8}"
    )
    for r in res.requests:
        mib = r.peak_blocks * block_bytes / MIB
        print(
            f"  {r.name:<8} {r.prompt_tokens:>7} {r.hit_tokens:>6} {r.steps:>6} "
            f"{r.prefill_peak_blocks:>15} {r.peak_blocks:>11} {mib:>8.1f}"
        )
    print(
        f"  pool: peak {res.pool_peak_blocks} of {res.pool_blocks - 1} blocks = "
        f"{res.pool_peak_blocks * block_bytes / MIB:.1f} MiB at {block_bytes / MIB:.2f} MiB/block"
        f"; prefix cache peak {res.cache_peak_entries} entries"
    )


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    requests = default_requests(
        prompt_tokens=a.prompt_tokens,
        decode_tokens=a.decode_tokens,
        chat_requests=a.chat_requests,
        chat_prompt=a.chat_prompt,
        shared_prefix=a.shared_prefix,
        chat_decode=a.chat_decode,
        chat_gap=a.chat_gap,
    )
    base = Scenario(
        requests,
        token_budget=a.budget,
        num_speculative_tokens=a.spec,
        acceptance=a.accept,
        prefix_cache_entries=a.prefix_cache,
        pool_blocks=a.pool_blocks,
        seed=a.seed,
    )
    results = []
    for mode in a.mode:
        for bs in a.block_size:
            for depth in a.in_flight:
                sc = replace(base, mode=parse_mode(mode), block_size=bs, in_flight=depth)
                results.append(run_replay(sc))
    if a.json:
        json.dump([r.to_json(a.block_bytes) for r in results], sys.stdout, indent=2)
        print()
    else:
        for r in results:
            _print(r, a.block_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())

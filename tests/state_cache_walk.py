"""A random trace through the state cache, checked against a model of device memory.

The driver plays engine and device. It admits requests (from prefix-cache hits when the cache
has their states), schedules prefill chunks and decode steps with draft tokens, runs each
step's "forward" when the step completes, commits with a random accepted count, aborts,
finishes, preempts and resumes, forks, and evicts cache entries. Every choice comes from
``choose(n)`` (``block_walk`` has what this walk shares with the KV cache's).

Device memory is a dict ``block -> label``. The label of the state after ``p`` tokens of a
request names the token prefix (requests of one group share their first tokens; a forked
child shares its parent's), so a block holds the right state exactly when its label matches.
Freed blocks turn to garbage, fresh blocks are zeroed by the driver (as
``zero_fresh_blocks`` does on tensors), drafts are written as tentative labels that become
real only when accepted. ``check`` runs after every event.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from plugin_api.state_cache import (
    NULL_BLOCK,
    BlockPool,
    CacheMode,
    OutOfStateBlocks,
    PrefixCache,
    StateCacheManager,
    StepBlocks,
)

from .block_walk import BlockWalk, drive

ZERO = ("zero",)
GARBAGE = ("garbage",)


@dataclass(frozen=True)
class WalkConfig:
    mode: CacheMode
    block_size: int
    num_spec: int
    depth: int  # plain steps a request may have in flight
    pool_blocks: int
    cache_entries: int  # 0: no prefix cache
    max_requests: int = 4
    max_prompt: int = 40
    max_decode: int = 24


@dataclass
class Req:
    name: str
    segments: list[tuple[float, str]]  # (last token count, key): who owns a token prefix
    prompt: int
    target: int
    sched: int = 0
    steps: list[StepBlocks] = field(default_factory=list)
    stable: list[int] = field(default_factory=list)  # all mode: blocks of complete slots

    def label(self, p: int) -> object:
        if p == 0:
            return ZERO
        for limit, key in self.segments:
            if p <= limit:
                return (key, p)
        raise AssertionError("unreachable: the last segment is unbounded")


class Walk(BlockWalk[Req]):
    name_prefix = "q"
    pool: BlockPool
    cache: PrefixCache | None

    def __init__(self, cfg: WalkConfig, choose: Callable[[int], int]) -> None:
        super().__init__(choose, max_live=cfg.max_requests)
        self.cfg = cfg
        self.pool = BlockPool(cfg.pool_blocks)
        self.m = StateCacheManager(
            self.pool,
            block_size=cfg.block_size,
            mode=cfg.mode,
            num_speculative_tokens=cfg.num_spec,
        )
        self.cache = None
        if cfg.cache_entries and cfg.mode.traits.boundary_states:
            self.cache = PrefixCache(
                self.pool, block_size=cfg.block_size, capacity=cfg.cache_entries
            )
        self.mem: dict[int, object] = dict.fromkeys(range(1, cfg.pool_blocks), GARBAGE)
        self.accepted_drafts = 0

    # ---- events --------------------------------------------------------------------------

    def event(self) -> None:
        kind = self.choose(20)
        if kind < 3 or not self.live:
            self.admit()
        elif kind < 14:
            self.advance(self.pick())
        elif kind == 14:
            self.end(self.pick(), preempt=False)
        elif kind == 15:
            self.end(self.pick(), preempt=True)
        elif kind == 16:
            self.resume()
        elif kind == 17:
            self.fork(self.pick())
        elif kind == 18 and self.cache is not None:
            self.gone(self.cache.evict(1 + self.choose(2)))
        else:
            self.complete(self.pick())
        self.steps += 1
        self.check()

    def admit(self) -> None:
        if self.full():
            return
        name = self.new_name()
        group = self.choose(3)  # two shared system prompts, or none
        segments: list[tuple[float, str]] = [(math.inf, name)]
        if group:
            segments.insert(0, (float(1 + self.choose(self.cfg.max_prompt)), f"g{group}"))
        prompt = 1 + self.choose(self.cfg.max_prompt)
        req = Req(name, segments, prompt, prompt + 1 + self.choose(self.cfg.max_decode))
        self.start(req)

    def start(self, req: Req) -> None:
        hit = None
        if self.cache is not None:
            bs = self.cfg.block_size
            keys = [req.label((i + 1) * bs) for i in range((req.prompt - 1) // bs)]
            hit = self.cache.lookup(keys, self.cfg.mode)
        self.m.add_request(req.name, hit)
        if hit is not None:
            self.hits += 1
            assert self.mem[hit.blocks[-1]] == req.label(hit.num_tokens)
        req.sched = hit.num_tokens if hit else 0
        assert self.m.watermark(req.name) == (
            len(hit.blocks) - 1 if hit and self.cfg.mode.traits.retires else 0
        )
        req.steps, req.stable = [], []
        self.live[req.name] = req

    def advance(self, req: Req) -> None:
        """Schedule the next step if the request may; otherwise complete its oldest step."""
        inflight = len(req.steps)
        drafting = inflight and req.steps[-1].num_drafts
        if drafting or inflight >= self.cfg.depth:
            self.complete(req)
            return
        if req.sched >= req.target:
            if inflight:
                self.complete(req)
            else:
                self.end(req, preempt=False)
            return
        drafts = 0
        if req.sched < req.prompt:
            left = req.prompt - req.sched
            n = 1 + self.choose(min(left, 3 * self.cfg.block_size))
            if self.cfg.mode is CacheMode.ALIGN and self.choose(2):  # end on a boundary
                end = (req.sched + n) // self.cfg.block_size * self.cfg.block_size
                n = end - req.sched if end > req.sched else n
        else:
            n = 1
            if not inflight:
                drafts = self.choose(1 + min(self.cfg.num_spec, req.target - req.sched - 1))
        self.schedule(req, n, drafts)

    def schedule(self, req: Req, n: int, drafts: int) -> None:
        before = self.snapshot(req)
        try:
            step = self.m.schedule(req.name, n, drafts)
        except OutOfStateBlocks:
            self.out_of_blocks += 1
            assert self.snapshot(req) == before, "a refused schedule changed something"
            victims = [r for r in self.live.values() if r is not req]
            self.end(victims[self.choose(len(victims))] if victims else req, preempt=True)
            return
        assert step.start == req.sched and step.num_tokens == n and step.num_drafts == drafts
        for b in step.fresh:  # what zero_fresh_blocks does to the tensors
            assert self.pool.refcount(b) == 1
            self.mem[b] = ZERO
        self.pool.mark_initialised(step.fresh)
        req.sched += n
        req.steps.append(step)

    def complete(self, req: Req) -> None:
        """The device runs the oldest step's forward, then the engine commits it."""
        if not req.steps:
            return
        step = req.steps.pop(0)
        assert self.mem[step.read] == req.label(step.start), "forward read a wrong state"
        self.serial += 1
        for n, b in step.writes:
            assert self.pool.refcount(b) == 1, "forward writes a shared block"
            self.mem[b] = req.label(n)
        for j, b in enumerate(step.drafts):
            assert self.pool.refcount(b) == 1, "draft written into a shared block"
            self.mem[b] = ("draft", self.serial, step.end + j + 1)
        k = self.choose(step.num_drafts + 1)
        for j in range(k):  # accepted drafts were the right tokens after all
            self.mem[step.drafts[j]] = req.label(step.end + j + 1)
        self.accepted_drafts += k
        c = self.m.commit(req.name, k)
        assert c.computed == step.end + k == self.m.computed(req.name)
        if step.num_drafts:
            req.sched = c.computed
        for n, b in c.boundary_states:
            assert n % self.cfg.block_size == 0 and self.mem[b] == req.label(n)
            if self.cache is not None:
                self.cache.insert(req.label(n), n, b)
        self.gone(c.retired.freed)
        if self.cfg.mode.traits.retires:  # retirement is idempotent
            again = self.m.retire(req.name, 0, self.m.slot(c.computed))
            assert not again.freed and not again.shared

    def end(self, req: Req, *, preempt: bool) -> None:
        """Finish, abort or preempt: the device drains the request's steps, then free."""
        while req.steps:
            self.complete(req)
        computed = self.m.computed(req.name)
        out = self.m.free(req.name)
        self.gone(out.freed)
        del self.live[req.name]
        if preempt and computed < req.target:
            req.prompt = max(req.prompt, computed)  # recomputed on resume
            self.preempted.append(req)

    def fork(self, parent: Req) -> None:
        if parent.steps or self.full():
            return
        c = self.m.computed(parent.name)
        if c == 0:
            return
        name = self.new_name()
        segs = [(min(limit, c), key) for limit, key in parent.segments] + [(math.inf, name)]
        child = Req(name, segs, c, c + 1 + self.choose(self.cfg.max_decode), sched=c)
        try:
            f = self.m.fork(parent.name, name)
        except OutOfStateBlocks:
            self.out_of_blocks += 1
            return
        for src, dst in f.copies:  # what copy_fork_blocks does to the tensors
            self.mem[dst] = self.mem[src]
        self.pool.mark_initialised([d for _, d in f.copies])
        self.live[name] = child

    def gone(self, freed: tuple[int, ...] | list[int]) -> None:
        for b in freed:  # someone else may write a free block
            self.mem[b] = GARBAGE

    # ---- invariants ----------------------------------------------------------------------

    def snapshot(self, req: Req) -> tuple[object, ...]:
        m = self.m
        return (
            m.table(req.name),
            m.spec_blocks(req.name),
            m.scheduled(req.name),
            len(m.in_flight(req.name)),
            self.pool.free_ids(),
        )

    def check(self) -> None:
        cfg, m = self.cfg, self.m
        owners = [0] * self.pool.num_blocks
        assert set(m.requests()) == set(self.live)
        for name, req in self.live.items():
            table, spec = m.table(name), m.spec_blocks(name)
            live = [b for b in table if b != NULL_BLOCK] + list(spec)
            assert len(set(live)) == len(live), f"{name} holds a block twice"
            for b in live:
                owners[b] += 1
            assert m.live_blocks(name) == len(live) <= m.peak_blocks(name)
            assert len(live) <= self.bound(req, table, len(req.steps)), "peak bound exceeded"
            c = m.computed(name)
            wm = m.watermark(name)
            assert table[:wm].count(NULL_BLOCK) == wm, "a block below the watermark"
            if c:
                assert self.mem[table[m.slot(c)]] == req.label(c), "committed state lost"
            if cfg.mode is CacheMode.ALIGN:
                k = m.slot(c)
                assert table[:k].count(NULL_BLOCK) == k, "missed retirement"
            if cfg.mode is CacheMode.ALL:
                assert NULL_BLOCK not in table
                complete = c // cfg.block_size
                known = len(req.stable)
                assert table[:known] == tuple(req.stable), "a complete slot changed"
                for i in range(known, complete):  # newly complete: the right state, then fixed
                    assert self.mem[table[i]] == req.label((i + 1) * cfg.block_size)
                    req.stable.append(table[i])
        self.check_books(owners)

    def bound(self, req: Req, table: tuple[int, ...], inflight: int) -> int:
        n = self.cfg.num_spec
        if self.cfg.mode is CacheMode.ALIGN:
            return 1 + inflight + n
        if self.cfg.mode is CacheMode.NONE:
            return 1 + n
        assert len(table) <= self.m.slot(req.sched) + 1
        return self.m.slot(req.sched) + 1 + n


def run_walk(cfg: WalkConfig, choose: Callable[[int], int], events: int) -> Walk:
    """``events`` random events, then everything finished: the pool must be whole again."""
    return drive(Walk(cfg, choose), events)

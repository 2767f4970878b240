"""A random engine trace through the KV block manager, checked against a model of device memory.

The driver plays engine and device. It admits sequences (from prefix-cache hits when the cache
holds their first blocks), schedules batches of prefill chunks and decodes with draft tokens,
runs each step's "forward" (the copy-on-write copies, then the writes, then the reads of every
cached token), rejects drafts (truncate), forks, finishes, preempts and resumes, and evicts cache
entries. Every choice comes from ``choose(n)`` (``block_walk`` has what this walk shares with
the state cache's).

Device memory is ``block -> [label per slot]``. The label of position ``p`` of a sequence names
its tokens ``0..p`` (interned: equal prefixes, equal label), which is what the K/V there depend
on. Freed blocks turn to garbage, so a block read without being written or copied into, or
written while another owner reads it, gives a wrong label. ``check`` runs after every event.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from plugin_api.kv_cache import (
    KVBlockPool,
    KVCacheError,
    KVCacheManager,
    OutOfKVBlocks,
    PrefixCache,
    Step,
)

from .block_walk import BlockWalk, drive

GARBAGE = -1


@dataclass(frozen=True)
class WalkConfig:
    block_size: int
    num_spec: int
    pool_blocks: int
    cache_entries: int  # 0: no prefix cache
    max_seq_len: int | None = None
    max_seqs: int = 4
    max_prompt: int = 40
    max_decode: int = 24


@dataclass
class Seq:
    name: str
    tokens: list[int]  # prompt and generated so far; the first ``cached`` are in the cache
    target: int  # finishes at this many cached tokens
    labels: list[int] = field(default_factory=list)


class Walk(BlockWalk[Seq]):
    name_prefix = "s"
    pool: KVBlockPool
    cache: PrefixCache | None

    def __init__(self, cfg: WalkConfig, choose: Callable[[int], int]) -> None:
        super().__init__(choose, max_live=cfg.max_seqs)
        self.cfg = cfg
        self.pool = KVBlockPool(cfg.pool_blocks)
        self.m = KVCacheManager(
            self.pool,
            block_size=cfg.block_size,
            num_speculative_tokens=cfg.num_spec,
            max_seq_len=cfg.max_seq_len,
        )
        self.cache = (
            PrefixCache(self.pool, capacity=cfg.cache_entries) if cfg.cache_entries else None
        )
        bs = cfg.block_size
        self.mem: dict[int, list[int]] = {b: [GARBAGE] * bs for b in range(cfg.pool_blocks)}
        self.interned: dict[tuple[int, int], int] = {}
        self.copies = 0
        self.forks = 0
        self.rejected = 0

    # ---- the model's tokens ----------------------------------------------------------------

    def label_all(self, seq: Seq) -> None:
        """``seq.labels[p]`` for every token: the interned chain over tokens ``0..p``."""
        del seq.labels[len(seq.tokens) :]
        prev = seq.labels[-1] if seq.labels else GARBAGE
        for t in seq.tokens[len(seq.labels) :]:
            prev = self.interned.setdefault((prev, t), len(self.interned))
            seq.labels.append(prev)

    def cap(self) -> int:
        """Longest sequence the pool and ``max_seq_len`` allow (so that a lone one progresses)."""
        n = (self.cfg.pool_blocks - 1) * self.cfg.block_size
        return min(n, self.cfg.max_seq_len) if self.cfg.max_seq_len else n

    # ---- events ----------------------------------------------------------------------------

    def event(self) -> None:
        kind = self.choose(20)
        if kind < 3 or not self.live:
            self.admit()
        elif kind < 13:
            self.step()
        elif kind == 13:
            self.end(self.pick(), preempt=False)
        elif kind == 14:
            self.end(self.pick(), preempt=True)
        elif kind == 15:
            self.resume()
        elif kind == 16:
            self.fork(self.pick())
        elif kind == 17 and self.cache is not None:
            self.evict(1 + self.choose(2))
        elif kind == 18:
            self.too_long(self.pick())
        else:
            self.truncate(self.pick())
        self.steps += 1
        self.check()

    def admit(self) -> None:
        if self.full():
            return
        cap = self.cap()
        group = self.choose(3)  # two shared system prompts, or none
        shared = (
            [1000 * group + i for i in range(self.choose(self.cfg.max_prompt))] if group else []
        )
        prompt = 1 + self.choose(self.cfg.max_prompt)
        tokens = (shared + [self.choose(50) for _ in range(prompt)])[: max(1, cap - 1)]
        target = min(cap, len(tokens) + 1 + self.choose(self.cfg.max_decode))
        self.start(Seq(self.new_name(), tokens, target))

    def start(self, seq: Seq) -> None:
        self.label_all(seq)
        hit: tuple[int, ...] = ()
        bs = self.cfg.block_size
        if self.cache is not None:  # keep >= 1 token to compute, as an engine must
            keys = [seq.labels[(i + 1) * bs - 1] for i in range((len(seq.tokens) - 1) // bs)]
            hit = self.cache.lookup(keys)
        self.m.add_sequence(seq.name, prefix=hit)
        if hit:
            self.hits += 1
            for p in range(len(hit) * bs):
                assert self.mem[hit[p // bs]][p % bs] == seq.labels[p], "prefix hit holds wrong K/V"
        assert self.m.num_tokens(seq.name) == len(hit) * bs
        self.live[seq.name] = seq

    def step(self) -> None:
        """A batch: a random subset of sequences, each a prefill chunk or a decode with drafts."""
        names = list(self.live)
        chosen = [n for n in names if self.choose(3)] or [names[self.choose(len(names))]]
        work: list[tuple[Hashable, int]] = []
        drafts: dict[str, int] = {}
        for name in chosen:
            seq = self.live[name]
            cached = self.m.num_tokens(name)
            room = seq.target - cached
            if room <= 0:
                self.end(seq, preempt=False)
                continue
            if cached < len(seq.tokens):  # prefill chunk
                n = 1 + self.choose(min(len(seq.tokens) - cached, 3 * self.cfg.block_size))
            else:  # decode: the sampled token plus drafts
                d = self.choose(1 + min(self.cfg.num_spec, room - 1))
                n = 1 + d
                drafts[name] = d
                seq.tokens += [self.choose(50) for _ in range(n)]
                self.label_all(seq)
            work.append((name, n))
        if not work:
            return
        ordered = self.choose(2)
        arg: object = dict(work) if ordered else work
        before = self.snapshot()
        needed = self.m.blocks_needed(arg)  # type: ignore[arg-type]
        try:
            step = self.m.schedule(arg)  # type: ignore[arg-type]
        except OutOfKVBlocks as e:
            self.out_of_blocks += 1
            assert self.snapshot() == before, "a refused schedule changed something"
            assert e.needed == needed > e.free == self.pool.num_free
            for name, d in drafts.items():  # the tokens were not scheduled
                seq = self.live[name]
                del seq.tokens[len(seq.tokens) - 1 - d :]
                self.label_all(seq)
            if self.cache is not None and self.choose(2):
                self.evict(e.needed)
            else:
                self.end(self.pick(), preempt=True)
            return
        assert len(step.fresh) == needed == len(set(step.fresh))
        self.forward(step, work)
        for name, d in drafts.items():  # accept some drafts, reject the rest
            if d and name in self.live:
                k = self.choose(d + 1)
                if k < d:
                    self.rejected += 1
                    seq = self.live[name]
                    keep = self.m.num_tokens(name) - (d - k)
                    self.gone(self.m.truncate(name, keep).freed)
                    del seq.tokens[keep:]
                    self.label_all(seq)
        self.register()

    def forward(self, step: Step, work: list[tuple[Hashable, int]]) -> None:
        """The device: copies, then every write, then every read of the step's sequences."""
        limit = 1 + self.cfg.num_spec
        decodes = [x for x in work if x[1] <= limit]
        assert list(zip(step.seq_ids, step.query_lens, strict=True)) == decodes + [
            x for x in work if x[1] > limit
        ], "decodes first, otherwise in the given order"
        assert step.num_decodes == len(decodes)
        bs = self.cfg.block_size
        for src, dst in step.copies:
            assert dst in step.fresh and self.pool.refcount(src) >= 1
            self.mem[dst] = list(self.mem[src])
            self.copies += 1
        t = 0
        for name, n, length, table in zip(
            step.seq_ids, step.query_lens, step.seq_lens, step.block_tables, strict=True
        ):
            assert isinstance(name, str)
            seq = self.live[name]
            assert table == self.m.table(name) and length == self.m.num_tokens(name)
            assert len(table) == -(-length // bs)
            for p in range(length - n, length):
                slot = step.slot_mapping[t]
                assert step.positions[t] == p
                block, off = divmod(slot, bs)
                assert block == table[p // bs] and off == p % bs
                assert self.pool.refcount(block) == 1, "a write into a shared block"
                self.mem[block][off] = seq.labels[p]
                t += 1
        assert t == step.num_tokens
        for name, length, table in zip(step.seq_ids, step.seq_lens, step.block_tables, strict=True):
            labels = self.live[str(name)].labels
            for p in range(length):
                assert self.mem[table[p // bs]][p % bs] == labels[p], "attention read wrong K/V"

    def register(self) -> None:
        """Offer every sequence's full blocks to the prefix cache."""
        if self.cache is None:
            return
        bs = self.cfg.block_size
        for name, seq in self.live.items():
            for i, b in enumerate(self.m.full_blocks(name)):
                self.cache.insert(seq.labels[(i + 1) * bs - 1], b)

    def evict(self, n: int) -> None:
        """Only entries that hold the last reference to their block go (freeing it)."""
        assert self.cache is not None
        before = len(self.cache)
        unshared = sum(self.pool.refcount(b) == 1 for b in self.cache.blocks())
        freed = self.cache.evict(n)
        assert len(freed) == before - len(self.cache) == min(n, unshared)
        self.gone(freed)

    def too_long(self, seq: Seq) -> None:
        """Scheduling past ``max_seq_len`` is refused, naming it, and changes nothing."""
        if self.cfg.max_seq_len is None:
            return
        before = self.snapshot()
        n = self.cfg.max_seq_len - self.m.num_tokens(seq.name) + 1
        try:
            self.m.schedule([(seq.name, n)])
        except KVCacheError as e:
            assert "max_seq_len" in str(e)
        else:
            raise AssertionError("scheduled past max_seq_len")
        assert self.snapshot() == before

    def truncate(self, seq: Seq) -> None:
        cached = self.m.num_tokens(seq.name)
        keep = self.choose(cached + 1)
        out = self.m.truncate(seq.name, keep)
        for b in out.freed:
            assert self.pool.refcount(b) == 0
        for b in out.shared:
            assert self.pool.refcount(b) > 0
        self.gone(out.freed)
        del seq.tokens[keep:]
        self.label_all(seq)
        self.rejected += 1

    def end(self, seq: Seq, *, preempt: bool) -> None:
        """Finish, abort or preempt (a preempted sequence resumes later and recomputes)."""
        out = self.m.free(seq.name)
        assert sorted(out.freed + out.shared) == sorted(set(out.freed + out.shared))
        for b in out.freed:
            assert self.pool.refcount(b) == 0
        self.gone(out.freed)
        del self.live[seq.name]
        if preempt:
            self.preempted.append(seq)

    def fork(self, parent: Seq) -> None:
        if self.full():
            return
        cached = self.m.num_tokens(parent.name)
        child = Seq(self.new_name(), parent.tokens[:cached], parent.target)
        child.labels = parent.labels[:cached]
        self.m.fork(parent.name, child.name)
        assert self.m.table(child.name) == self.m.table(parent.name)
        self.live[child.name] = child
        self.forks += 1

    def gone(self, freed: tuple[int, ...] | list[int]) -> None:
        for b in freed:  # someone else may write a free block
            self.mem[b] = [GARBAGE] * self.cfg.block_size

    # ---- invariants ------------------------------------------------------------------------

    def snapshot(self) -> tuple[object, ...]:
        m = self.m
        tables = tuple((n, m.table(n), m.num_tokens(n)) for n in m.sequences())
        cache = tuple(self.cache.blocks()) if self.cache is not None else ()
        return (tables, cache, self.pool.refcounts(), self.pool.free_ids())

    def check(self) -> None:
        m, bs = self.m, self.cfg.block_size
        owners = [0] * self.pool.num_blocks
        assert set(m.sequences()) == set(self.live)
        for name, seq in self.live.items():
            table, n = m.table(name), m.num_tokens(name)
            assert n <= len(seq.tokens) == len(seq.labels)
            assert len(table) == -(-n // bs), "a table has blocks past its tokens, or too few"
            assert len(set(table)) == len(table), f"{name} holds a block twice"
            assert m.full_blocks(name) == table[: n // bs]
            for b in table:
                owners[b] += 1
        self.check_books(owners)


def run_walk(cfg: WalkConfig, choose: Callable[[int], int], events: int) -> Walk:
    """``events`` random events, then everything finished: the pool must be whole again."""
    return drive(Walk(cfg, choose), events)

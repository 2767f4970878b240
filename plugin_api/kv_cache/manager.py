"""Per-sequence KV block tables: add, schedule a step's tokens, fork, truncate, free.

A sequence's table lists the blocks its tokens occupy: token ``p`` lives in block
``table[p // B]`` at offset ``p % B`` (``B`` = ``block_size``), so its cache slot is
``table[p // B] * B + p % B``. A table always has ``ceil(num_tokens / B)`` blocks.

Sharing and copy-on-write. A block may have several owners (a forked sequence, a prefix-cache
entry): one pool reference each. Full blocks are never written again, so sharing them is free.
A partly filled last block that is shared is copied when a sequence first writes into it: the
writer gets a fresh block, and ``Step.copies`` lists ``(src, dst)``, which the engine copies in
every layer's KV cache before the step's forward, steps in order (``tensors.copy_kv_blocks``).
The last owner to write finds the block no longer shared and writes in place. A fork therefore
allocates nothing and copies nothing until someone writes.

Every call checks its arguments and the pool's capacity before changing anything.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..block_pool import check_count
from .errors import KVCacheError, OutOfKVBlocks
from .pool import KVBlockPool

if TYPE_CHECKING:
    from ..ops.attention import AttentionBatch

Work = Mapping[Hashable, int] | Sequence[tuple[Hashable, int]]


@dataclass(frozen=True, slots=True)
class Step:
    """One step's sequences in batch order (decodes first), with what the attention op needs.

    Sequence ``i`` has ``query_lens[i]`` new tokens at positions
    ``seq_lens[i] - query_lens[i] .. seq_lens[i] - 1``; the step's tokens are laid out
    sequence after sequence in this order. ``slot_mapping`` is the cache slot of each new
    token. ``copies``: ``(src, dst)`` block copies to run in every layer's KV cache before the
    forward (copy-on-write). ``fresh``: blocks this step took from the pool.
    """

    seq_ids: tuple[Hashable, ...]
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    slot_mapping: tuple[int, ...]
    num_decodes: int
    copies: tuple[tuple[int, int], ...]
    fresh: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.slot_mapping)

    @property
    def positions(self) -> tuple[int, ...]:
        """Each new token's position in its sequence (what RoPE rotates by)."""
        out: list[int] = []
        for n, length in zip(self.query_lens, self.seq_lens, strict=True):
            out.extend(range(length - n, length))
        return tuple(out)

    @property
    def last_token_indices(self) -> tuple[int, ...]:
        """Index in the step's tokens of each sequence's last token (whose logits sample)."""
        out, end = [], 0
        for n in self.query_lens:
            end += n
            out.append(end - 1)
        return tuple(out)

    def attention_batch(self, *, pad_to: int | None = None) -> AttentionBatch:
        """This step as an ``AttentionBatch`` (CPU int tensors); ``pad_to`` tokens give the
        padding rows slot ``-1``."""
        from .tensors import attention_batch

        return attention_batch(self, pad_to=pad_to)


@dataclass(frozen=True, slots=True)
class Released:
    """Blocks a sequence gave up: ``freed`` went back to the pool, ``shared`` are still held by
    another owner (a forked sequence, a prefix-cache entry)."""

    freed: tuple[int, ...] = ()
    shared: tuple[int, ...] = ()


@dataclass(slots=True)
class _Seq:
    table: list[int] = field(default_factory=list)
    num_tokens: int = 0


class KVCacheManager:
    """Block tables for sequences sharing one ``KVBlockPool``.

    ``block_size`` is in tokens (the ``AttentionSpec``'s). A sequence of at most
    ``1 + num_speculative_tokens`` new tokens in a step is a decode and goes first in the
    step's batch. ``max_seq_len`` (None: no limit) bounds every sequence's length.
    """

    def __init__(
        self,
        pool: KVBlockPool,
        *,
        block_size: int,
        num_speculative_tokens: int = 0,
        max_seq_len: int | None = None,
    ) -> None:
        if not isinstance(pool, KVBlockPool):
            raise TypeError(f"pool must be a KVBlockPool, got {type(pool).__name__}")
        self.pool = pool
        self.block_size = check_count("block_size", block_size, 1)
        self.num_speculative_tokens = check_count("num_speculative_tokens", num_speculative_tokens)
        self.max_seq_len = (
            None if max_seq_len is None else check_count("max_seq_len", max_seq_len, 1)
        )
        self._seqs: dict[Hashable, _Seq] = {}

    # ---- reading ---------------------------------------------------------------------------

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    def sequences(self) -> tuple[Hashable, ...]:
        return tuple(self._seqs)

    def table(self, seq_id: Hashable) -> tuple[int, ...]:
        return tuple(self._get("table", seq_id).table)

    def num_tokens(self, seq_id: Hashable) -> int:
        """Tokens of the sequence in the cache (its next token goes to this position)."""
        return self._get("num_tokens", seq_id).num_tokens

    def full_blocks(self, seq_id: Hashable) -> tuple[int, ...]:
        """The sequence's full blocks, in order: what a prefix cache may keep."""
        s = self._get("full_blocks", seq_id)
        return tuple(s.table[: s.num_tokens // self.block_size])

    # ---- sequences -------------------------------------------------------------------------

    def add_sequence(self, seq_id: Hashable, *, prefix: Sequence[int] = ()) -> None:
        """Start ``seq_id`` with no tokens, or with the full blocks of a prefix-cache hit
        (``PrefixCache.lookup``), which it shares: it then has ``len(prefix) * block_size``
        tokens and the engine schedules the rest of its prompt."""
        if seq_id in self._seqs:
            raise KVCacheError(f"add_sequence: sequence {seq_id!r} already exists")
        blocks = list(prefix)
        for i, b in enumerate(blocks):
            if self.pool.refcount(b) == 0:  # refcount checks the id
                raise KVCacheError(f"add_sequence: prefix[{i}]={b} is a free block")
        if len(set(blocks)) != len(blocks):
            raise KVCacheError(f"add_sequence: prefix {blocks} lists a block twice")
        n = len(blocks) * self.block_size
        self._check_len("add_sequence", seq_id, n, "prefix")
        for b in blocks:
            self.pool.retain(b)
        self._seqs[seq_id] = _Seq(blocks, n)

    def blocks_needed(self, work: Work) -> int:
        """Blocks ``schedule(work)`` would take from the pool (new blocks and copies)."""
        return self._plan(work)[1]

    def schedule(self, work: Work) -> Step:
        """Append ``n`` tokens to each ``(seq_id, n)`` of ``work`` (a mapping or pairs), all or
        nothing: raises ``OutOfKVBlocks`` (nothing changed) when the pool is short."""
        items, needed = self._plan(work)
        free = self.pool.num_free
        if needed > free:
            never = " (more than the whole pool)" if needed > self.pool.capacity else ""
            raise OutOfKVBlocks(
                f"schedule: {needed} KV block(s) needed for {len(items)} sequence(s), "
                f"{free} free{never}; preempt a sequence or evict prefix-cache entries",
                needed=needed,
                free=free,
            )
        bs, pool = self.block_size, self.pool
        copies: list[tuple[int, int]] = []
        fresh: list[int] = []
        for seq_id, n in items:
            s = self._seqs[seq_id]
            if s.num_tokens % bs and pool.refcount(s.table[-1]) > 1:  # copy on write
                src = s.table[-1]
                (dst,) = pool.allocate(1)
                pool.release([src])  # still held by another owner
                s.table[-1] = dst
                copies.append((src, dst))
                fresh.append(dst)
            end = s.num_tokens + n
            grow = -(-end // bs) - len(s.table)
            if grow:
                new = pool.allocate(grow)
                s.table.extend(new)
                fresh.extend(new)
            s.num_tokens = end
        assert len(fresh) == needed, (len(fresh), needed)
        limit = 1 + self.num_speculative_tokens
        order = [x for x in items if x[1] <= limit] + [x for x in items if x[1] > limit]
        slots: list[int] = []
        for seq_id, n in order:
            s = self._seqs[seq_id]
            for p in range(s.num_tokens - n, s.num_tokens):
                slots.append(s.table[p // bs] * bs + p % bs)
        return Step(
            seq_ids=tuple(i for i, _ in order),
            query_lens=tuple(n for _, n in order),
            seq_lens=tuple(self._seqs[i].num_tokens for i, _ in order),
            block_tables=tuple(tuple(self._seqs[i].table) for i, _ in order),
            slot_mapping=tuple(slots),
            num_decodes=sum(n <= limit for _, n in items),
            copies=tuple(copies),
            fresh=tuple(fresh),
        )

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Start ``child_id`` sharing every block of ``parent_id`` (parallel sampling, beam
        search). Nothing is allocated or copied now: the first of them to write into a shared,
        partly filled last block gets a copy (``Step.copies``)."""
        p = self._get("fork", parent_id)
        if child_id in self._seqs:
            raise KVCacheError(f"fork: sequence {child_id!r} already exists")
        for b in p.table:
            self.pool.retain(b)
        self._seqs[child_id] = _Seq(list(p.table), p.num_tokens)

    def truncate(self, seq_id: Hashable, num_tokens: int) -> Released:
        """Keep the first ``num_tokens`` tokens (rejected draft tokens go); blocks past them are
        released. A block the end now falls inside may be shared: the next write copies it."""
        s = self._get("truncate", seq_id)
        check_count("num_tokens", num_tokens)
        if num_tokens > s.num_tokens:
            raise KVCacheError(
                f"truncate: num_tokens={num_tokens} is past sequence {seq_id!r}'s "
                f"{s.num_tokens} tokens"
            )
        keep = -(-num_tokens // self.block_size)
        dropped = s.table[keep:]
        released = self._release(dropped)
        del s.table[keep:]
        s.num_tokens = num_tokens
        return released

    def free(self, seq_id: Hashable) -> Released:
        """Give up every block of a finished, aborted or preempted sequence (a preempted one
        is added again later and recomputes, or resumes from a prefix-cache hit)."""
        s = self._get("free", seq_id)
        released = self._release(s.table)
        del self._seqs[seq_id]
        return released

    # ---- internals -------------------------------------------------------------------------

    def _plan(self, work: Work) -> tuple[list[tuple[Hashable, int]], int]:
        """Check ``work``; return it as pairs and the blocks it needs. Changes nothing."""
        items = list(work.items()) if isinstance(work, Mapping) else list(work)
        bs, pool = self.block_size, self.pool
        needed = 0
        seen: set[Hashable] = set()
        copied_away: dict[int, int] = {}  # shared last block -> writers that will copy it
        for i, item in enumerate(items):
            if not (isinstance(item, tuple) and len(item) == 2):
                raise TypeError(f"schedule: work[{i}] must be a (seq_id, num_tokens) pair")
            seq_id, n = item
            s = self._get("schedule", seq_id)
            if seq_id in seen:
                raise KVCacheError(f"schedule: sequence {seq_id!r} is listed twice")
            seen.add(seq_id)
            check_count(f"num_tokens of sequence {seq_id!r}", n, 1)
            end = s.num_tokens + n
            self._check_len("schedule", seq_id, end, "num_tokens")
            needed += -(-end // bs) - len(s.table)
            if s.num_tokens % bs:
                last = s.table[-1]
                moved = copied_away.get(last, 0)
                if pool.refcount(last) - moved > 1:
                    copied_away[last] = moved + 1
                    needed += 1
        return items, needed

    def _check_len(self, op: str, seq_id: Hashable, n: int, arg: str) -> None:
        if self.max_seq_len is not None and n > self.max_seq_len:
            raise KVCacheError(
                f"{op}: {arg} would make sequence {seq_id!r} {n} tokens long, past "
                f"max_seq_len={self.max_seq_len}"
            )

    def _release(self, blocks: list[int]) -> Released:
        if not blocks:
            return Released()
        freed = self.pool.release(blocks)
        gone = set(freed)
        return Released(tuple(freed), tuple(b for b in blocks if b not in gone))

    def _get(self, op: str, seq_id: Hashable) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KVCacheError(
                f"{op}: sequence {seq_id!r} is not allocated (add_sequence first, or it was freed)"
            ) from None
        except TypeError:
            raise TypeError(f"{op}: seq_id must be hashable, got {type(seq_id).__name__}") from None

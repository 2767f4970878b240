"""Per-request state block tables: allocate for each step, commit, retire, free.

A request's table maps *slots* to blocks. Slot ``i`` covers tokens ``(i*B, (i+1)*B]`` (``B`` =
``block_size``): the state after ``p`` tokens belongs in slot ``(p - 1) // B`` (slot 0 for
``p = 0``, the initial state). ``none`` mode has a single slot. Slots without a state hold the
shared null block. The next forward of a request reads the state at its committed token count
``c`` from slot ``slot(c)``; nothing below that slot is needed by the request any more.

A step is scheduled (blocks allocated, reported in ``StepBlocks``), run by the caller, then
committed with the number of accepted draft tokens. Up to any number of plain steps may be in
flight per request (pipelined chunks); a step with draft tokens must be the only one, since
its accepted count decides where the next step starts. Every call checks its arguments and the
pool's capacity before changing anything.

Who zeroes: the caller. Blocks a call takes from the pool are listed in ``StepBlocks.fresh``;
the caller zeroes them (``zero_fresh_blocks``, which runs the host op ``zero_state_blocks``)
before the step's forward. With ``check_initialised`` (the default) ``commit`` refuses a step
whose fresh or read blocks were never zeroed (or, after ``fork``, copied into).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from ..block_pool import check_count
from .errors import StateCacheError
from .modes import CacheMode, parse_mode
from .pool import NULL_BLOCK, BlockPool
from .prefix import PrefixHit


@dataclass(frozen=True, slots=True)
class StepBlocks:
    """The blocks one scheduled step of one request reads and writes.

    The step computes tokens ``[start, start + num_tokens)``, then ``num_drafts`` draft tokens.
    ``read`` holds the state after ``start`` tokens (for ``start == 0``: the first written
    block, which is fresh and so zero, the initial state). ``writes`` lists
    ``(num_tokens, block)``: the state after that many tokens goes to that block (one entry in
    ``align``/``none``; in ``all`` one per block boundary crossed, then the step's end).
    ``drafts[j]`` receives the state after draft ``j + 1``. ``fresh``: blocks this call took
    from the pool, to be zeroed before the forward.
    """

    req_id: Hashable
    start: int
    num_tokens: int
    num_drafts: int
    read: int
    writes: tuple[tuple[int, int], ...]
    drafts: tuple[int, ...]
    fresh: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True, slots=True)
class Released:
    """Blocks a request gave up: ``freed`` went back to the pool, ``shared`` are still held
    by another owner (a prefix-cache entry, a forked request)."""

    freed: tuple[int, ...] = ()
    shared: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Commit:
    """The outcome of committing a step.

    ``computed``: the request's committed tokens now. ``boundary_states``: ``(num_tokens,
    block)`` for each block-aligned state this commit completed that the mode keeps (what a
    prefix cache may register). ``retired``: what retirement gave up.
    """

    req_id: Hashable
    computed: int
    accepted: int
    boundary_states: tuple[tuple[int, int], ...]
    retired: Released


@dataclass(frozen=True, slots=True)
class Fork:
    """A forked request's blocks: ``copies`` lists ``(src, dst)`` state copies the caller runs
    (``copy_state_blocks``) before the child's first step; the other blocks are shared."""

    req_id: Hashable
    copies: tuple[tuple[int, int], ...]


@dataclass(slots=True)
class ManagerStats:
    """Work counters, so that tests can show the per-step cost does not depend on context."""

    scheduled: int = 0
    committed: int = 0
    slots_visited: int = 0  # table entries appended, scanned by retirement or by free


@dataclass(slots=True)
class _Request:
    table: list[int] = field(default_factory=list)
    spec: list[int] = field(default_factory=list)
    computed: int = 0  # committed tokens
    scheduled: int = 0  # end of the last scheduled step
    watermark: int = 0  # slots below are retired (all null)
    inflight: deque[StepBlocks] = field(default_factory=deque)
    live: int = 0
    peak: int = 0


_NOTHING = Released()


class StateCacheManager:
    """Block tables for requests sharing one ``BlockPool``.

    ``block_size`` is in tokens; ``num_speculative_tokens`` bounds the draft tokens per step
    (each gets its own block, kept per request and reused step to step).
    """

    def __init__(
        self,
        pool: BlockPool,
        *,
        block_size: int,
        mode: CacheMode | str,
        num_speculative_tokens: int = 0,
        check_initialised: bool = True,
    ) -> None:
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a BlockPool, got {type(pool).__name__}")
        self.pool = pool
        self.block_size = check_count("block_size", block_size, 1)
        self.mode = parse_mode(mode)
        self.num_speculative_tokens = check_count("num_speculative_tokens", num_speculative_tokens)
        self.check_initialised = bool(check_initialised)
        self.stats = ManagerStats()
        self._reqs: dict[Hashable, _Request] = {}
        self._single_slot = self.mode is CacheMode.NONE

    # ---- queries -------------------------------------------------------------------------

    def slot(self, num_tokens: int) -> int:
        """The slot holding the state after ``num_tokens`` tokens."""
        if self._single_slot or num_tokens <= 0:
            return 0
        return (num_tokens - 1) // self.block_size

    def requests(self) -> list[Hashable]:
        return list(self._reqs)

    def __contains__(self, req_id: Hashable) -> bool:
        return req_id in self._reqs

    def table(self, req_id: Hashable, start: int = 0, stop: int | None = None) -> tuple[int, ...]:
        """The request's block table, or its slots ``[start, stop)``."""
        return tuple(self._get(req_id).table[start:stop])

    def spec_blocks(self, req_id: Hashable) -> tuple[int, ...]:
        return tuple(self._get(req_id).spec)

    def computed(self, req_id: Hashable) -> int:
        return self._get(req_id).computed

    def scheduled(self, req_id: Hashable) -> int:
        """Where the next step would start: the end of the last scheduled step."""
        return self._get(req_id).scheduled

    def watermark(self, req_id: Hashable) -> int:
        """Slots below this index were retired and hold the null block."""
        return self._get(req_id).watermark

    def in_flight(self, req_id: Hashable) -> tuple[StepBlocks, ...]:
        return tuple(self._get(req_id).inflight)

    def live_blocks(self, req_id: Hashable) -> int:
        """Blocks the request references now (table and speculative blocks)."""
        return self._get(req_id).live

    def peak_blocks(self, req_id: Hashable) -> int:
        """The most blocks the request referenced at once since it was added."""
        return self._get(req_id).peak

    # ---- lifecycle -----------------------------------------------------------------------

    def add_request(self, req_id: Hashable, hit: PrefixHit | None = None) -> None:
        """Start a request, from scratch or from cached states (``PrefixCache.lookup``)."""
        if req_id in self._reqs:
            raise StateCacheError(f"add_request: request {req_id!r} already exists")
        r = _Request()
        if hit is not None:
            self._check_hit(hit)
            for b in hit.blocks:
                if b != NULL_BLOCK:
                    self.pool.retain(b)
            r.table = list(hit.blocks)
            r.computed = r.scheduled = hit.num_tokens
            r.live = r.peak = sum(b != NULL_BLOCK for b in hit.blocks)
            if self.mode.traits.retires:
                r.watermark = len(r.table) - 1
        self._reqs[req_id] = r

    def fork(self, parent_id: Hashable, child_id: Hashable) -> Fork:
        """Start ``child_id`` from ``parent_id``'s committed state (parallel sampling).

        Complete slots and a block-aligned committed state are shared (one more reference
        each); a state the parent will update in place is copied into a fresh block.
        """
        p = self._get(parent_id)
        if child_id in self._reqs:
            raise StateCacheError(f"fork: request {child_id!r} already exists")
        if p.inflight:
            raise StateCacheError(
                f"fork: {parent_id!r} has {len(p.inflight)} step(s) in flight; commit them first"
            )
        table = list(p.table)
        copies: tuple[tuple[int, int], ...] = ()
        c = p.computed
        private = c > 0 and (self._single_slot or c % self.block_size != 0)
        if private:
            (dst,) = self.pool.allocate(1)
            s = self.slot(c)
            copies = ((table[s], dst),)
            table[s] = dst
        for i, b in enumerate(table):
            if b != NULL_BLOCK and not (private and i == self.slot(c)):
                self.pool.retain(b)
        live = sum(b != NULL_BLOCK for b in table)
        self._reqs[child_id] = _Request(
            table=table,
            computed=c,
            scheduled=c,
            watermark=p.watermark,
            live=live,
            peak=live,
        )
        return Fork(child_id, copies)

    def free(self, req_id: Hashable) -> Released:
        """Give up every block of a finished, aborted or preempted request and drop its
        watermark. Steps still in flight must be committed first (their forward may still
        write the blocks)."""
        r = self._get(req_id)
        if r.inflight:
            raise StateCacheError(
                f"free: {req_id!r} has {len(r.inflight)} step(s) in flight; commit them when "
                "their forward has completed, then free"
            )
        held = [b for b in r.table[r.watermark :] if b != NULL_BLOCK]
        held += r.spec
        self.stats.slots_visited += len(r.table) - r.watermark
        del self._reqs[req_id]
        return self._release(held)

    # ---- steps ---------------------------------------------------------------------------

    def schedule(self, req_id: Hashable, num_tokens: int, num_drafts: int = 0) -> StepBlocks:
        """Allocate what the next step of ``req_id`` writes: ``num_tokens`` tokens (a prefill
        chunk or a decode token) followed by ``num_drafts`` draft tokens."""
        r = self._get(req_id)
        check_count("num_tokens", num_tokens, 1)
        check_count("num_drafts", num_drafts)
        if num_drafts > self.num_speculative_tokens:
            raise ValueError(
                f"num_drafts={num_drafts} exceeds num_speculative_tokens="
                f"{self.num_speculative_tokens}"
            )
        if r.inflight and (num_drafts or r.inflight[-1].num_drafts):
            raise StateCacheError(
                f"schedule: {req_id!r} has a step in flight; a step with draft tokens must "
                "start from committed state and must be committed before the next one"
            )
        s = r.scheduled
        e = s + num_tokens
        table = r.table
        last = self.slot(e)
        new_slots = last + 1 - len(table)  # > 0 only when the step reaches past the table
        if self.mode is not CacheMode.ALL:
            new_slots = min(new_slots, 1)  # align/none: only the end state gets a block
        need_spec = max(0, num_drafts - len(r.spec))
        fresh = self.pool.allocate(max(new_slots, 0) + need_spec)  # may raise; nothing changed
        if new_slots > 0:
            self.stats.slots_visited += last + 1 - len(table)
            if self.mode is CacheMode.ALL:
                table.extend(fresh[:new_slots])
            else:
                table.extend([NULL_BLOCK] * (last - len(table)))
                table.append(fresh[0])
        if need_spec:
            r.spec.extend(fresh[len(fresh) - need_spec :])
        if self.mode is CacheMode.ALL:
            bs = self.block_size
            writes = [
                ((t + 1) * bs, table[t]) for t in range(self.slot(s), last) if (t + 1) * bs > s
            ]
            writes.append((e, table[last]))
        else:
            writes = [(e, table[last])]
        step = StepBlocks(
            req_id=req_id,
            start=s,
            num_tokens=num_tokens,
            num_drafts=num_drafts,
            read=table[self.slot(s)] if s > 0 else writes[0][1],
            writes=tuple(writes),
            drafts=tuple(r.spec[:num_drafts]),
            fresh=tuple(fresh),
        )
        r.inflight.append(step)
        r.scheduled = e
        r.live += len(fresh)
        if r.live > r.peak:
            r.peak = r.live
        self.stats.scheduled += 1
        return step

    def commit(self, req_id: Hashable, accepted: int = 0, *, retire: bool = True) -> Commit:
        """Commit the oldest in-flight step of ``req_id`` with ``accepted`` of its drafts
        accepted, move accepted draft states into the table, then retire (``align``).

        ``retire=False`` leaves retirement to a later ``retire`` call (e.g. while an
        asynchronous copy still reads an old state); the watermark makes it catch up.
        """
        r = self._get(req_id)
        if not r.inflight:
            raise StateCacheError(f"commit: {req_id!r} has no step in flight")
        step = r.inflight[0]
        check_count("accepted", accepted)
        if accepted > step.num_drafts:
            raise ValueError(f"accepted={accepted} exceeds the step's {step.num_drafts} drafts")
        if self.check_initialised:
            bad = self.pool.uninitialised((*step.fresh, step.read))
            if bad:
                raise StateCacheError(
                    f"commit: block(s) {sorted(set(bad))} of {req_id!r}'s step were handed out "
                    "fresh and never zeroed (zero_fresh_blocks) or copied into (fork) before "
                    "the forward"
                )
        r.inflight.popleft()
        prev, end = r.computed, step.end
        c = end + accepted
        if accepted:
            self._place_accepted(r, end, accepted)
        r.computed = c
        if step.num_drafts:
            r.scheduled = c
        bs = self.block_size
        boundary: tuple[tuple[int, int], ...] = ()
        if self.mode is CacheMode.ALL:
            first = (prev // bs + 1) * bs
            boundary = tuple((b, r.table[b // bs - 1]) for b in range(first, c + 1, bs))
        elif self.mode is CacheMode.ALIGN and c % bs == 0:
            boundary = ((c, r.table[self.slot(c)]),)
        retired = _NOTHING
        if retire and self.mode.traits.retires:
            retired = self._retire(r, r.watermark, self.slot(c))
        self.stats.committed += 1
        return Commit(req_id, c, accepted, boundary, retired)

    def retire(self, req_id: Hashable, start: int, stop: int) -> Released:
        """Retire slots ``[start, stop)``: walk back from ``stop - 1``, skip null holes, give
        up every other block (release if shared, else free) and null its slot.

        ``commit`` does this after every step; calling it again is a no-op. The request's
        watermark (slots already retired) is skipped. A range past the table, or reaching the
        committed state or in-flight writes (``stop > slot(computed)``), is an error.
        """
        r = self._get(req_id)
        check_count("start", start)
        check_count("stop", stop)
        if start > stop:
            raise ValueError(f"retire: start={start} > stop={stop}")
        if stop > len(r.table):
            raise StateCacheError(
                f"retire: range [{start}, {stop}) is outside {req_id!r}'s table of "
                f"{len(r.table)} slot(s)"
            )
        keep = self.slot(r.computed)
        if stop > keep:
            raise StateCacheError(
                f"retire: slot {keep} and above hold {req_id!r}'s committed state or in-flight "
                f"writes; stop={stop} must be <= {keep}"
            )
        if start < stop and not self.mode.traits.retires:
            raise StateCacheError(f"retire: mode {self.mode.value!r} keeps every state it holds")
        return self._retire(r, start, stop)

    # ---- internals -----------------------------------------------------------------------

    def _get(self, req_id: Hashable) -> _Request:
        r = self._reqs.get(req_id)
        if r is None:
            raise StateCacheError(f"unknown request {req_id!r} (never added, or already freed)")
        return r

    def _retire(self, r: _Request, start: int, stop: int) -> Released:
        first = max(start, r.watermark)
        if first >= stop:
            return _NOTHING
        table = r.table
        gone = []
        for i in range(stop - 1, first - 1, -1):  # holes are skipped, never a reason to stop
            b = table[i]
            if b != NULL_BLOCK:
                gone.append(b)
                table[i] = NULL_BLOCK
        self.stats.slots_visited += stop - first
        if start <= r.watermark:  # the retired prefix is contiguous: never rescan it
            r.watermark = stop
        if not gone:
            return _NOTHING
        r.live -= len(gone)
        return self._release(gone)

    def _release(self, blocks: list[int]) -> Released:
        if not blocks:
            return _NOTHING
        freed = self.pool.release(blocks)
        if len(freed) == len(blocks):
            return Released(tuple(freed), ())
        gone = set(freed)  # a request holds a block at most once
        return Released(tuple(freed), tuple(b for b in blocks if b not in gone))

    def _place_accepted(self, r: _Request, end: int, accepted: int) -> None:
        """Move the draft blocks holding states the table keeps into their slots.

        The block a draft state displaces (stale, private) takes its place among the spec
        blocks; a draft block moved into an empty slot leaves a gap that the next draft step
        refills from the pool.
        """
        spec, table, bs = r.spec, r.table, self.block_size
        c = end + accepted
        moves = []  # (slot, draft index)
        if self.mode is CacheMode.ALL:
            first = (end // bs + 1) * bs
            moves = [(b // bs - 1, b - end - 1) for b in range(first, c + 1, bs)]
        if not moves or moves[-1][0] != self.slot(c):
            moves.append((self.slot(c), accepted - 1))
        gap = False
        for t, j in moves:
            if t >= len(table):
                self.stats.slots_visited += t + 1 - len(table)
                table.extend([NULL_BLOCK] * (t + 1 - len(table)))
            old = table[t]
            assert old == NULL_BLOCK or self.pool.refcount(old) == 1, "displaced a shared block"
            table[t], spec[j] = spec[j], old
            gap = gap or old == NULL_BLOCK
        if gap:
            r.spec = [b for b in spec if b != NULL_BLOCK]

    def _check_hit(self, hit: PrefixHit) -> None:
        if not isinstance(hit, PrefixHit):
            raise TypeError(f"hit must be a PrefixHit, got {type(hit).__name__}")
        if not self.mode.traits.boundary_states:
            raise StateCacheError(f"mode {self.mode.value!r} cannot start from cached states")
        n, bs = hit.num_tokens, self.block_size
        check_count("hit.num_tokens", n, 1)
        if n % bs or len(hit.blocks) != n // bs:
            raise StateCacheError(
                f"hit covers {n} tokens with {len(hit.blocks)} block(s); block_size={bs} "
                f"needs a multiple of {bs} tokens and one block per {bs}"
            )
        if hit.blocks[-1] == NULL_BLOCK:
            raise StateCacheError("hit: the last block (the state to resume from) is null")
        if self.mode.positionally_stable and NULL_BLOCK in hit.blocks:
            raise StateCacheError(f"hit: mode {self.mode.value!r} needs every boundary state")
        if not self.mode.positionally_stable and any(b != NULL_BLOCK for b in hit.blocks[:-1]):
            raise StateCacheError(f"hit: mode {self.mode.value!r} resumes from the last block only")
        for b in hit.blocks:
            if b != NULL_BLOCK and self.pool.refcount(b) == 0:
                raise StateCacheError(f"hit: block {b} is free (evicted after the lookup?)")

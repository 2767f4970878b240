"""Paged attention: the spec, per-step batch metadata, the implementation protocol, input checks,
and the host entry point ``Attention`` (plan once per batch, run per layer).

KV cache layout (every backend): ``[num_blocks, 2, num_kv_heads, block_size, head_size]``;
index 1 selects K (0) or V (1). The exact math is in docs/ops.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..contract import OpFamily
from ..contract.decision import Decision, ImplPath
from ..contract.graphs import GraphSupport
from ..contract.provenance import Provenance, note
from . import checks
from .huge_pages import advise_huge_pages

if TYPE_CHECKING:
    from ..backend import Backend
    from ..device_info import DeviceInfo

OP = "attention"
MODEL_DTYPES = frozenset({torch.bfloat16, torch.float16, torch.float32})
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
KV_DTYPES = MODEL_DTYPES | {FP8}
_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", FP8: "fp8"}


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """Everything about an attention layer that is fixed for the model's lifetime.

    ``dtype`` is the model dtype (K/V inputs and the output). ``query_dtype`` defaults to it.
    ``kv_cache_dtype`` defaults to it; ``torch.float8_e4m3fn`` stores K/V scaled by per-layer
    fp32 scales. ``kv_sharing``: the layer reads another layer's cache and is called with
    ``key=None, value=None``. ``scale`` defaults to ``1/sqrt(head_size)``.
    """

    num_heads: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype = torch.bfloat16
    kv_cache_dtype: torch.dtype | None = None
    block_size: int = 16
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    has_sinks: bool = False
    causal: bool = True
    kv_sharing: bool = False
    query_dtype: torch.dtype | None = None
    dcp_size: int = 1
    num_speculative_tokens: int = 0
    scale: float | None = None

    def __post_init__(self) -> None:
        op = "AttentionSpec"
        checks.positive_int(op, "num_heads", self.num_heads)
        checks.positive_int(op, "num_kv_heads", self.num_kv_heads)
        checks.positive_int(op, "head_size", self.head_size)
        checks.positive_int(op, "block_size", self.block_size)
        checks.positive_int(op, "dcp_size", self.dcp_size)
        checks.positive_int(op, "num_speculative_tokens", self.num_speculative_tokens, minimum=0)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{op}: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.dtype not in MODEL_DTYPES:
            raise TypeError(f"{op}: dtype={self.dtype} must be bf16, fp16 or fp32")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in KV_DTYPES:
            raise TypeError(f"{op}: kv_cache_dtype={self.kv_cache_dtype} is not supported")
        if self.query_dtype is not None and self.query_dtype not in KV_DTYPES:
            raise TypeError(f"{op}: query_dtype={self.query_dtype} is not supported")
        if self.sliding_window is not None:
            checks.positive_int(op, "sliding_window", self.sliding_window)
            if not self.causal:
                raise ValueError(f"{op}: non-causal attention with a sliding window is undefined")
        if self.logits_soft_cap is not None:
            cap = self.logits_soft_cap
            if isinstance(cap, bool) or not isinstance(cap, int | float):
                raise TypeError(f"{op}: logits_soft_cap={cap!r} must be a number or None")
            if not (cap > 0 and math.isfinite(cap)):
                # inf would make c * tanh(z / c) = inf * 0 = NaN; <= 0 or NaN has no meaning
                raise ValueError(
                    f"{op}: logits_soft_cap={cap} must be a positive finite number "
                    "(None for no soft cap)"
                )
        if self.scale is not None and not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"{op}: scale={self.scale} must be a positive finite number")

    @property
    def cache_dtype(self) -> torch.dtype:
        return self.kv_cache_dtype or self.dtype

    @property
    def q_dtype(self) -> torch.dtype:
        return self.query_dtype or self.dtype

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_size)

    @property
    def fp8_kv(self) -> bool:
        return self.cache_dtype == FP8

    def describe(self) -> str:
        parts = [f"h{self.num_heads}/kv{self.num_kv_heads}/d{self.head_size}", _SHORT[self.dtype]]
        if self.cache_dtype != self.dtype:
            parts.append(f"kv={_SHORT[self.cache_dtype]}")
        if self.q_dtype != self.dtype:
            parts.append(f"q={_SHORT[self.q_dtype]}")
        parts.append(f"block={self.block_size}")
        if self.sliding_window:
            parts.append(f"window={self.sliding_window}")
        if self.logits_soft_cap:
            parts.append(f"softcap={self.logits_soft_cap:g}")
        if self.has_sinks:
            parts.append("sinks")
        if not self.causal:
            parts.append("non-causal")
        if self.kv_sharing:
            parts.append("kv-sharing")
        if self.num_speculative_tokens:
            parts.append(f"spec={self.num_speculative_tokens}")
        if self.dcp_size > 1:
            parts.append(f"dcp={self.dcp_size}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class KVCache:
    """A layer's paged cache ``data`` ``[num_blocks, 2, num_kv_heads, block_size, head_size]``
    with the fp32 scales of an fp8 cache (1.0 otherwise)."""

    data: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0
    # whether allocate_kv_cache got the kernel to accept a huge-page request for ``data``
    huge_pages: bool = False

    @property
    def num_blocks(self) -> int:
        return int(self.data.shape[0])


def kv_cache_shape(spec: AttentionSpec, num_blocks: int) -> tuple[int, int, int, int, int]:
    return (num_blocks, 2, spec.num_kv_heads, spec.block_size, spec.head_size)


def allocate_kv_cache(
    spec: AttentionSpec,
    num_blocks: int,
    device: torch.device | str,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> KVCache:
    checks.positive_int("allocate_kv_cache", "num_blocks", num_blocks)
    data = torch.empty(kv_cache_shape(spec, num_blocks), dtype=spec.cache_dtype, device=device)
    # before the first write: blocks are read at random, see huge_pages.py
    huge = advise_huge_pages(data)
    data.zero_()
    return KVCache(data, k_scale, v_scale, huge)


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    """One step's metadata, as the scheduler produces it (CPU int tensors).

    - ``query_start_loc`` int32 ``[num_seqs + 1]``: cumulative query offsets, from 0.
    - ``seq_lens`` int32 ``[num_seqs]``: tokens in the cache per sequence after this step's write.
    - ``block_table`` int32 ``[num_seqs, max_blocks]``: physical block of each logical block.
    - ``slot_mapping`` int64 ``[num_tokens]``: cache slot of each new token, -1 to skip it.
    - ``num_decodes``: the first ``num_decodes`` sequences are decodes (query length at most
      ``1 + num_speculative_tokens``); the rest are prefills.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_decodes: int = 0

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def query_lens(self) -> torch.Tensor:
        return self.query_start_loc[1:] - self.query_start_loc[:-1]

    @classmethod
    def from_lists(
        cls,
        *,
        query_lens: list[int],
        seq_lens: list[int],
        block_table: list[list[int]],
        slot_mapping: list[int],
        num_decodes: int = 0,
    ) -> AttentionBatch:
        width = max((len(r) for r in block_table), default=0)
        table = torch.zeros((len(block_table), max(width, 1)), dtype=torch.int32)
        for i, row in enumerate(block_table):
            table[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
        qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
        return cls(
            query_start_loc=qsl,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_table=table,
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64),
            num_decodes=num_decodes,
        )


@dataclass(frozen=True, slots=True)
class DecodeLayout:
    """How decode queries are shaped this step: uniform (``q_len_per_req``) or ragged."""

    num_decodes: int
    num_decode_tokens: int
    uniform: bool
    q_len_per_req: int | None
    reason: str


def decode_layout(batch: AttentionBatch) -> DecodeLayout:
    """Uniform when every decode request has the same query length, else ragged. CPU only."""
    n = batch.num_decodes
    if n == 0:
        return _decode_layout(0, 0, 0, 0)
    starts = batch.query_start_loc[: n + 1]
    lo, hi = (int(v) for v in torch.aminmax(starts[1:] - starts[:-1]))
    return _decode_layout(n, int(starts[n]) - int(starts[0]), lo, hi)


def _decode_layout(n: int, tokens: int, lo: int, hi: int) -> DecodeLayout:
    """The layout of ``n`` decodes of ``tokens`` query tokens, ``lo..hi`` per request."""
    if n == 0:
        return DecodeLayout(0, 0, True, None, "no decode requests this step")
    if lo == hi:
        return DecodeLayout(n, tokens, True, lo, f"all {n} decodes have {lo} query token(s)")
    return DecodeLayout(
        n, tokens, False, None, f"decode query lengths vary ({lo}..{hi}): ragged offsets"
    )


def validate_batch(
    spec: AttentionSpec,
    batch: AttentionBatch,
    num_blocks: int | None = None,
    *,
    check_slots: bool = True,
) -> int:
    """Check ``batch`` against ``spec`` (and, given ``num_blocks``, against a KV cache of that
    many blocks); return the largest physical block id it uses. ``check_slots``: also check
    that every new token's slot is the one its block table gives it (``check_slot_mapping``)."""
    return _validate_batch(spec, batch, num_blocks, check_slots).max_block


def check_slot_mapping(spec: AttentionSpec, batch: AttentionBatch) -> None:
    """Check that ``batch.slot_mapping`` agrees with ``block_table`` and ``seq_lens``.

    Sequence ``i`` with query length ``q`` and length ``s`` writes positions ``s - q .. s - 1``;
    the token at position ``p`` must go to slot ``block_table[i, p // block_size] *
    block_size + p % block_size``, or be -1 (not written: padding, KV sharing). Raises
    ``ValueError`` naming the token, its sequence and position, and the slot the table gives.
    Runs the other checks of ``validate_batch`` too. Specs with ``dcp_size > 1`` keep only a
    part of each sequence per rank, with their own slot layout: they are not checked here.
    """
    _validate_batch(spec, batch, None, True)


# the first position of each block-table column, made once per (width, block size): a
# sequence reads column c iff c * block_size < its length (compared against, never written)
@functools.lru_cache(maxsize=64)
def _column_starts(width: int, block_size: int) -> torch.Tensor:
    return torch.arange(0, width * block_size, block_size, dtype=torch.int32)


@functools.lru_cache(maxsize=64)
def _rows(n: int) -> torch.Tensor:
    """``0..n-1`` (int64), made once per ``n``; read, never written."""
    return torch.arange(n)


@functools.lru_cache(maxsize=64)
def _row_starts(n: int, width: int) -> torch.Tensor:
    """Where each of ``n`` rows of a ``width``-column table starts in its flat index."""
    return torch.arange(0, n * width, width)


def _int(t: torch.Tensor) -> int:
    """A one-element tensor's value (``item()`` is the cheapest way out of a CPU tensor)."""
    return int(t.item())


@dataclass(frozen=True, slots=True)
class _CheckedBatch:
    """What checking a batch learns: its largest block id, the entry that holds it (for run()'s
    error against a smaller cache), its decode layout and its token count."""

    max_block: int
    source: str
    decode: DecodeLayout
    num_tokens: int


def _validate_batch(
    spec: AttentionSpec, batch: AttentionBatch, num_blocks: int | None, check_slots: bool
) -> _CheckedBatch:
    """``validate_batch``, also returning which batch entry holds the largest block id and the
    decode layout.

    Runs on every step (its plan serves every layer), so each check is a whole-tensor torch op
    (a few microseconds each on the CPU) and only a handful of scalars reach Python."""
    op = "attention.plan"
    if num_blocks is not None:
        checks.positive_int(op, "num_blocks", num_blocks)
    if not isinstance(batch, AttentionBatch):
        raise TypeError(f"{op}: batch must be an AttentionBatch, got {type(batch).__name__}")
    cpu = torch.device("cpu")
    i32 = {torch.int32}
    seq_lens = checks.tensor(op, "batch.seq_lens", batch.seq_lens, dtypes=i32, ndim=1, device=cpu)
    n = int(seq_lens.shape[0])
    qsl = checks.tensor(
        op, "batch.query_start_loc", batch.query_start_loc, dtypes=i32, shape=(n + 1,), device=cpu
    )
    table = checks.tensor(
        op, "batch.block_table", batch.block_table, dtypes=i32, ndim=2, device=cpu
    )
    if table.shape[0] != n:
        raise ValueError(f"{op}: batch.block_table has {table.shape[0]} rows for {n} sequences")
    slots = checks.tensor(
        op, "batch.slot_mapping", batch.slot_mapping, dtypes={torch.int64}, ndim=1, device=cpu
    )
    if not 0 <= batch.num_decodes <= n:
        raise ValueError(f"{op}: batch.num_decodes={batch.num_decodes} not in [0, {n}]")
    if n == 0:
        return _CheckedBatch(-1, "", _decode_layout(0, 0, 0, 0), 0)
    first_start, tokens = _int(qsl[0]), _int(qsl[n])
    if first_start != 0:
        raise ValueError(f"{op}: batch.query_start_loc[0]={first_start}, must be 0")
    qlens = torch.diff(qsl)
    first_pos = seq_lens - qlens  # the position of each sequence's first new token
    if _int(qlens.min()) < 1:
        bad = int((qlens < 1).nonzero()[0])
        raise ValueError(f"{op}: batch.query_start_loc gives sequence {bad} no query tokens")
    if _int(first_pos.min()) < 0:
        bad = int((first_pos < 0).nonzero()[0])
        raise ValueError(
            f"{op}: batch.seq_lens[{bad}]={int(seq_lens[bad])} is shorter than its query "
            f"length {int(qlens[bad])}"
        )
    if slots.shape[0] < tokens:
        raise ValueError(
            f"{op}: batch.slot_mapping has {slots.shape[0]} entries for {tokens} tokens"
        )
    limit = 1 + spec.num_speculative_tokens
    nd = batch.num_decodes
    lo_q, hi_q = (_int(v) for v in torch.aminmax(qlens[:nd])) if nd else (0, 0)
    if hi_q > limit:
        raise ValueError(
            f"{op}: a decode request has {hi_q} query tokens; "
            f"decodes carry at most 1 + num_speculative_tokens = {limit} (decodes come first)"
        )
    layout = _decode_layout(nd, _int(qsl[nd]), lo_q, hi_q)
    bs, width = spec.block_size, int(table.shape[1])
    longest = _int(seq_lens.max())
    if -(-longest // bs) > width:
        raise ValueError(
            f"{op}: batch.block_table has {width} columns; a sequence of "
            f"{longest} tokens needs {-(-longest // bs)} blocks of {bs}"
        )
    # the entries the sequences' lengths make us read
    read = _column_starts(width, bs) < seq_lens.unsqueeze(1)
    # unread entries become 0: never below a real id, and column 0 is always read, so the
    # first maximum is a read entry
    masked = torch.where(read, table, 0)  # contiguous, whatever the table's strides
    if _int(masked.min()) < 0:
        r, c = (int(v) for v in (masked < 0).nonzero()[0])
        raise ValueError(
            f"{op}: batch.block_table[{r}, {c}]={int(table[r, c])} is a negative block id, read "
            f"for batch.seq_lens[{r}]={int(seq_lens[r])}"
        )
    top, where = masked.view(-1).max(0)
    max_block = _int(top)
    r, c = divmod(_int(where), width)
    length = _int(seq_lens[r])
    table_source = (
        f"batch.block_table[{r}, {c}]={max_block} (read for batch.seq_lens[{r}]={length})"
    )
    if num_blocks is not None and max_block >= num_blocks:
        raise ValueError(
            f"{op}: {table_source} is past the KV cache's {num_blocks} blocks "
            f"(num_blocks={num_blocks})"
        )
    real = slots[:tokens]
    consistent = check_slots and spec.dcp_size == 1
    if consistent:
        # implies every slot is -1 or in a block this batch reads (so below max_block)
        _check_slots_follow_table(op, bs, qsl, seq_lens, table, real, first_pos, tokens)
    # sorted distinct slots: the smallest, the largest, and whether one is written twice
    values, counts = torch.unique(real, return_counts=True)
    lo, hi = _int(values[0]), _int(values[-1])
    if lo < -1:
        raise ValueError(f"{op}: batch.slot_mapping holds {lo}; slots are >= 0 or -1")
    written = counts[1:] if lo == -1 else counts
    if written.numel() and _int(written.max()) > 1:
        at = int(written.argmax()) + (lo == -1)
        slot = int(values[at])
        twice = (real == slot).nonzero().view(-1).tolist()
        raise ValueError(
            f"{op}: batch.slot_mapping writes slot {slot} for tokens {twice}; each slot takes "
            "at most one token per step"
        )
    slot_block = hi // bs if hi >= 0 else -1
    if consistent or slot_block < 0:
        return _CheckedBatch(max_block, table_source, layout, tokens)
    t = int(real.argmax())
    slot_source = f"batch.slot_mapping[{t}]={hi} (block {slot_block})"
    if num_blocks is not None and slot_block >= num_blocks:
        raise ValueError(
            f"{op}: {slot_source} is past the KV cache's {num_blocks} blocks "
            f"(num_blocks={num_blocks}, block_size={bs})"
        )
    if slot_block > max_block:
        return _CheckedBatch(slot_block, slot_source, layout, tokens)
    return _CheckedBatch(max_block, table_source, layout, tokens)


def _check_slots_follow_table(
    op: str,
    bs: int,
    qsl: torch.Tensor,
    seq_lens: torch.Tensor,
    table: torch.Tensor,
    real: torch.Tensor,
    first_pos: torch.Tensor,
    tokens: int,
) -> None:
    """``check_slot_mapping`` on checked tensors: lengths fit the table, query lengths >= 1."""
    n, width = int(seq_lens.shape[0]), int(table.shape[1])
    if tokens == n:  # one new token per sequence: token i is sequence i's, at first_pos[i]
        seq = _rows(n)
        pos = first_pos.long()
        row_start = _row_starts(n, width)
    else:
        tok = torch.arange(tokens, dtype=torch.int32)
        seq = torch.searchsorted(qsl[1:], tok, right=True)
        pos = (tok + (first_pos - qsl[:-1])[seq]).long()
        row_start = seq * width
    # int64 throughout: block * block_size may pass 2**31 on a large cache
    col = torch.div(pos, bs, rounding_mode="floor")
    expected = (pos % bs).add_(table.take(row_start + col), alpha=bs)
    if torch.equal(expected, real):
        return
    wrong = (real != expected) & (real != -1)  # -1: the token is not written (padding)
    if not bool(wrong.any()):
        return
    t = int(wrong.nonzero()[0])
    i, p = int(seq[t]), int(pos[t])
    c, s = p // bs, int(seq_lens[i])
    block = int(table[i, c])
    q = int(qsl[i + 1]) - int(qsl[i])
    raise ValueError(
        f"{op}: batch.slot_mapping[{t}]={int(real[t])} for sequence {i} position {p}; "
        f"batch.block_table[{i}, {c}]={block} and block_size {bs} give slot "
        f"{block * bs + p % bs} (batch.seq_lens[{i}]={s} with {q} query token(s): positions "
        f"{s - q}..{s - 1} are new)"
    )


class AttentionImplementation(Protocol):
    """What a backend implements for attention. The host has validated every input."""

    name: str
    path: ImplPath

    def supports(self, spec: AttentionSpec, info: DeviceInfo) -> Decision: ...

    def graph_support(self, spec: AttentionSpec, info: DeviceInfo) -> GraphSupport: ...

    def plan(
        self, spec: AttentionSpec, batch: AttentionBatch, device: torch.device, reuse: Any
    ) -> Any:
        """Build device-side metadata for one step (once per batch, shared by layers).

        ``reuse`` is an earlier plan of this implementation or None. An implementation whose
        ``graph_support`` is above NEVER must then write into ``reuse``'s buffers (a captured
        graph keeps reading them) and expose them as ``plan.buffers() -> dict[str, Tensor]``.
        """
        ...

    def write_kv(
        self,
        spec: AttentionSpec,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: KVCache,
        plan: Any,
    ) -> None:
        """Store this step's K/V ``[num_tokens, num_kv_heads, head_size]`` at the plan's slots."""
        ...

    def forward(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        kv_cache: KVCache,
        plan: Any,
        sinks: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """Attend ``query`` ``[num_tokens, num_heads, head_size]`` into ``out`` (same shape)."""
        ...


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """The host's handle for one step: the validated batch and the implementation's plan."""

    spec: AttentionSpec
    batch: AttentionBatch
    impl_plan: Any
    num_tokens: int
    max_block_id: int
    decode: DecodeLayout
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # the batch entry that holds ``max_block_id``, for run()'s error against a smaller cache
    max_block_source: str = ""
    # the implementation that made ``impl_plan``: only it can read it
    impl: Any = None


@dataclass(frozen=True, slots=True)
class _RunShape:
    """What ``Attention.run``'s combined check compares against, read off the spec once."""

    q_dtype: torch.dtype
    dtype: torch.dtype
    cache_dtype: torch.dtype
    q_tail: tuple[int, int]  # query.shape[1:]
    kv_tail: tuple[int, int]  # key/value.shape[1:]
    cache_tail: tuple[int, int, int, int]  # kv_cache.data.shape[1:]
    sinks_shape: tuple[int]
    kv_sharing: bool
    fp8_kv: bool
    has_sinks: bool

    @classmethod
    def of(cls, s: AttentionSpec) -> _RunShape:
        return cls(
            s.q_dtype,
            s.dtype,
            s.cache_dtype,
            (s.num_heads, s.head_size),
            (s.num_kv_heads, s.head_size),
            (2, s.num_kv_heads, s.block_size, s.head_size),
            (s.num_heads,),
            s.kv_sharing,
            s.fp8_kv,
            s.has_sinks,
        )


class Attention:
    """Attention for one ``AttentionSpec``, resolved on a backend.

    ``plan(batch)`` once per step, then ``run(...)`` per layer. ``provenance`` names the
    implementation that runs (and whether it is a fallback).
    """

    def __init__(self, spec: AttentionSpec, backend: Backend | None = None) -> None:
        from ..backend import process_backend

        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"attention: spec must be an AttentionSpec, got {type(spec).__name__}")
        self.spec = spec
        self.backend = backend or process_backend()
        impl, self.provenance = self.backend.implementation_for(OpFamily.ATTENTION, spec)
        self.impl: AttentionImplementation = impl
        settings = self.backend.selected.settings
        # plan() checks slot_mapping against the block table when asked, or under strict: the
        # check costs more than 2% of a small decode layer (docs/benchmarks.md), so it is opt-in
        self.checks_slot_mapping = settings.strict or settings.check_slot_mapping
        self._run_shape = _RunShape.of(spec)

    @property
    def device(self) -> torch.device:
        return self.backend.device

    def graph_support(self) -> GraphSupport:
        return self.impl.graph_support(self.spec, self.backend.info)

    def allocate_kv_cache(
        self, num_blocks: int, *, k_scale: float = 1.0, v_scale: float = 1.0
    ) -> KVCache:
        return allocate_kv_cache(
            self.spec, num_blocks, self.device, k_scale=k_scale, v_scale=v_scale
        )

    def plan(
        self,
        batch: AttentionBatch,
        *,
        reuse: AttentionPlan | None = None,
        num_blocks: int | None = None,
    ) -> AttentionPlan:
        """Validate ``batch`` and build this step's plan. ``reuse`` (an earlier plan of this
        op) lets graph-capable implementations refill the same buffers. ``num_blocks`` (the KV
        cache's) checks every block the batch reads or writes here, naming the batch entry;
        without it ``run()`` checks against the cache it is given. With
        ``PLUGIN_API_CHECK_SLOT_MAPPING=1`` or ``PLUGIN_API_STRICT=1`` the batch's
        ``slot_mapping`` is also checked against its block table (``check_slot_mapping``)."""
        checked = _validate_batch(self.spec, batch, num_blocks, self.checks_slot_mapping)
        if reuse is not None:
            if not isinstance(reuse, AttentionPlan) or reuse.spec != self.spec:
                raise TypeError("attention.plan: reuse must be a plan of this Attention")
            self._check_owner("attention.plan", "reuse", reuse)
        prior = reuse.impl_plan if reuse is not None else None
        impl_plan = self.impl.plan(self.spec, batch, self.device, prior)
        return AttentionPlan(
            self.spec,
            batch,
            impl_plan,
            checked.num_tokens,
            checked.max_block,
            checked.decode,
            self.device,
            max_block_source=checked.source,
            impl=self.impl,
        )

    def _check_owner(self, op: str, name: str, plan: AttentionPlan) -> None:
        """A plan's ``impl_plan`` is private to the implementation that made it: another
        backend's, even for an equal spec, would fail inside a kernel (after a cache write)."""
        theirs, mine = plan.impl, self.impl
        if theirs is mine or (type(theirs) is type(mine) and theirs.name == mine.name):
            return
        raise TypeError(
            f"{op}: {name} was made by implementation {_impl_name(theirs)}; this Attention "
            f"runs {_impl_name(mine)} (backend {self.backend.id!r}): make the plan with "
            "this Attention's plan()"
        )

    def run(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        kv_cache: KVCache,
        plan: AttentionPlan,
        *,
        sinks: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Write this step's K/V into ``kv_cache`` (unless KV-sharing) and attend.

        - ``query`` ``[T, num_heads, head_size]`` in ``spec.q_dtype``; ``T`` may exceed the
          batch's token count (padding rows, never read back).
        - ``key``/``value`` ``[T, num_kv_heads, head_size]`` in ``spec.dtype``, or both None
          for a KV-sharing layer (which then writes nothing).
        - ``query``, ``key`` and ``value`` need only a contiguous last dim: row and head
          strides are free, so the three may be views into one fused QKV projection output.
        - ``sinks`` ``[num_heads]`` fp32, required iff ``spec.has_sinks``.
        - ``out`` ``[T, num_heads, head_size]`` in ``spec.dtype``; allocated when None.
        """
        # one combined check of what every well-formed call satisfies; anything else takes the
        # argument-by-argument checks, which name the offending argument (eager decode steps
        # on a GPU are host-bound: issue 34 measured these checks at a sixth of the step)
        if not self._accepts_run(query, key, value, kv_cache, plan, sinks, out):
            self._check_run(query, key, value, kv_cache, plan, sinks, out)
        if out is None:
            out = torch.empty(query.shape, dtype=self.spec.dtype, device=query.device)
        written = checks.Outputs((("out", out), ("kv_cache.data", kv_cache.data)))
        if key is not None and value is not None:
            self.impl.write_kv(self.spec, key, value, kv_cache, plan.impl_plan)
        self.impl.forward(self.spec, query, kv_cache, plan.impl_plan, sinks, out)
        # once, after both kernels: a rebound output is reported whichever of them rebound it
        written.check("attention.run", self.impl)
        note(self.provenance)
        return out

    def _accepts_run(
        self,
        query: object,
        key: object,
        value: object,
        kv_cache: object,
        plan: object,
        sinks: object,
        out: object,
    ) -> bool:
        """True only where ``_check_run`` would pass: exact types, this plan's implementation
        and spec, expected dtypes, shapes and devices, contiguous outputs (so no internal
        overlap) whose byte ranges meet no other argument's. False sends the call to
        ``_check_run``, which raises with the argument named (or passes a rarer valid call,
        such as an output in the row gaps of a fused input)."""
        e = self._run_shape
        if type(plan) is not AttentionPlan or plan.impl is not self.impl:
            return False
        if plan.spec is not self.spec and plan.spec != self.spec:
            return False
        if type(kv_cache) is not KVCache or type(query) is not torch.Tensor:
            return False
        dev = query.device
        if dev != plan.device and not checks.same_device(dev, plan.device):
            return False
        qs = query.shape
        tokens = plan.num_tokens
        if query.dtype != e.q_dtype or qs[1:] != e.q_tail or qs[0] < tokens or query.stride(2) != 1:
            return False
        tensors: list[torch.Tensor] = [query]
        if e.kv_sharing:
            if key is not None or value is not None:
                return False
        else:
            for x in (key, value):
                if (
                    type(x) is not torch.Tensor
                    or x.dtype != e.dtype
                    or x.device != dev
                    or x.shape[1:] != e.kv_tail
                    or x.shape[0] < tokens
                    or x.stride(2) != 1
                ):
                    return False
                tensors.append(x)
        cache = kv_cache.data
        if (
            type(cache) is not torch.Tensor
            or cache.dtype != e.cache_dtype
            or cache.device != dev
            or cache.shape[1:] != e.cache_tail
            or plan.max_block_id >= cache.shape[0]
            or not cache.is_contiguous()
        ):
            return False
        for v in (kv_cache.k_scale, kv_cache.v_scale):
            if type(v) is not float or not (v > 0 and math.isfinite(v)):
                return False
            if not e.fp8_kv and v != 1.0:
                return False
        if e.has_sinks:
            if (
                type(sinks) is not torch.Tensor
                or sinks.dtype != torch.float32
                or sinks.device != dev
                or sinks.shape != e.sinks_shape
                or not sinks.is_contiguous()
            ):
                return False
            tensors.append(sinks)
        elif sinks is not None:
            return False
        outputs = [] if e.kv_sharing else [cache]
        if out is not None:
            if (
                type(out) is not torch.Tensor
                or out.dtype != e.dtype
                or out.device != dev
                or out.shape != qs
                or not out.is_contiguous()
            ):
                return False
            outputs.append(out)
        if e.kv_sharing:
            tensors.append(cache)
        return checks.apart(outputs, tensors)

    def _check_run(
        self,
        query: object,
        key: object,
        value: object,
        kv_cache: object,
        plan: object,
        sinks: object,
        out: object,
    ) -> None:
        op, s = "attention.run", self.spec
        if not isinstance(plan, AttentionPlan) or plan.spec != s:
            raise TypeError(f"{op}: plan must come from plan() of this Attention")
        self._check_owner(op, "plan", plan)
        if not isinstance(kv_cache, KVCache):
            raise TypeError(f"{op}: kv_cache must be a KVCache, got {type(kv_cache).__name__}")
        q = checks.tensor(op, "query", query, dtypes={s.q_dtype}, ndim=3)
        t, dev = q.shape[0], q.device
        checks.tensor(op, "query", q, shape=(None, s.num_heads, s.head_size))
        # rows and heads may be strided (the query part of a fused QKV output): kernels index
        # them by stride and read each head's vector as one dense run
        if q.stride(-1) != 1:
            raise ValueError(
                f"{op}: query must have a contiguous last dim (strides {tuple(q.stride())})"
            )
        if t < plan.num_tokens:
            raise ValueError(f"{op}: query has {t} rows, the plan has {plan.num_tokens} tokens")
        if not checks.same_device(dev, plan.device):
            raise ValueError(f"{op}: query is on {dev}, the backend runs on {plan.device}")
        if s.kv_sharing:
            if key is not None or value is not None:
                raise ValueError(
                    f"{op}: spec.kv_sharing is set, so key and value must be None "
                    "(the layer reads the shared cache and writes nothing)"
                )
        else:
            if key is None or value is None:
                which = "key" if key is None else "value"
                raise ValueError(
                    f"{op}: {which} is None but the spec is not a KV-sharing layer "
                    "(set AttentionSpec.kv_sharing=True for layers that reuse another cache)"
                )
            kv_shape = (None, s.num_kv_heads, s.head_size)
            for name, x in (("key", key), ("value", value)):
                xt = checks.tensor(op, name, x, dtypes={s.dtype}, shape=kv_shape, device=dev)
                if xt.shape[0] < plan.num_tokens:
                    raise ValueError(
                        f"{op}: {name} has {xt.shape[0]} rows, the plan has {plan.num_tokens}"
                    )
                if xt.stride(-1) != 1:
                    raise ValueError(f"{op}: {name} must have a contiguous last dim")
        cache = checks.tensor(
            op,
            "kv_cache.data",
            kv_cache.data,
            dtypes={s.cache_dtype},
            shape=(None, 2, s.num_kv_heads, s.block_size, s.head_size),
            device=dev,
            contiguous=True,
        )
        if plan.max_block_id >= cache.shape[0]:
            raise ValueError(
                f"{op}: the batch uses block {plan.max_block_id} ({plan.max_block_source}), "
                f"kv_cache has {cache.shape[0]} blocks (plan(batch, num_blocks=...) checks it "
                "before the step)"
            )
        for name, v in (
            ("kv_cache.k_scale", kv_cache.k_scale),
            ("kv_cache.v_scale", kv_cache.v_scale),
        ):
            if not (isinstance(v, float | int) and v > 0 and math.isfinite(v)):
                raise ValueError(f"{op}: {name}={v!r} must be a positive finite float")
            if not s.fp8_kv and v != 1.0:
                raise ValueError(
                    f"{op}: {name}={v} is set but the cache is not fp8 (would be unused)"
                )
        if s.has_sinks:
            if sinks is None:
                raise ValueError(f"{op}: spec.has_sinks is set, so sinks [num_heads] is required")
            checks.tensor(
                op,
                "sinks",
                sinks,
                dtypes={torch.float32},
                shape=(s.num_heads,),
                device=dev,
                contiguous=True,
            )
        elif sinks is not None:
            raise ValueError(f"{op}: sinks given but spec.has_sinks is False (would be ignored)")
        outputs: list[tuple[str, torch.Tensor]] = []
        if out is not None:
            o = checks.tensor(
                op, "out", out, dtypes={s.dtype}, shape=tuple(q.shape), device=dev, contiguous=True
            )
            outputs.append(("out", o))
        inputs: list[tuple[str, torch.Tensor | None]] = [("query", q)]
        if s.kv_sharing:  # read only
            inputs.append(("kv_cache.data", cache))
        else:
            outputs.append(("kv_cache.data", cache))
            inputs += [("key", key), ("value", value)]  # type: ignore[list-item]
        if sinks is not None:
            inputs.append(("sinks", sinks))  # type: ignore[arg-type]
        checks.no_overlap(op, outputs, inputs)


def _impl_name(impl: object) -> str:
    return repr(getattr(impl, "name", type(impl).__name__))


def attention(spec: AttentionSpec, backend: Backend | None = None) -> Attention:
    """Resolve attention for ``spec`` on ``backend`` (default: the selected backend)."""
    return Attention(spec, backend)


__all__ = [
    "Attention",
    "AttentionBatch",
    "AttentionImplementation",
    "AttentionPlan",
    "AttentionSpec",
    "DecodeLayout",
    "KVCache",
    "Provenance",
    "allocate_kv_cache",
    "attention",
    "check_slot_mapping",
    "decode_layout",
    "kv_cache_shape",
    "validate_batch",
]

"""Per-step attention metadata for the FlashInfer calls, built from the host's CPU
``AttentionBatch`` with no device-to-host synchronisation.

The plan holds device buffers sized by a ``Capacity`` so that a captured CUDA graph keeps
reading the same storage: ``build_plan(..., reuse=previous)`` refills them in place, and a batch
that does not fit is an error (a graph captured on the old buffers would read stale data).

Decode requests come first in the batch. Their query lengths are *uniform* (every decode has
``q_len_per_req`` tokens; a step of one-token decodes keeps the padding rows of a captured graph
as extra requests of length 0) or *ragged* (packed rows, cumulative offsets ``q_cu_seq_lens``).

Draft mask bit layout (what FlashInfer XQA reads, ``flashinfer.xqa.xqa(mask=...)``):

- one row per decode query token, in packed order (request by request; uniform batches are the
  same rows viewed as ``[batch, q_len_per_req, row_width]``);
- a row is ``W = ceil(Q / 32)`` little-endian 32-bit words, handed over as ``2 * W`` uint16
  values (low half first), where ``Q`` is the ``q_len_per_req`` passed to XQA (the common length,
  or the step's maximum when ragged);
- bit ``j`` of the row (word ``j // 32``, bit ``j % 32``; equally uint16 ``j // 16``, bit
  ``j % 16``) is 1 iff the row's query (draft ``i`` of request ``s``, ``n_s`` drafts) may see
  the request's draft token ``j``, the key at position ``L_s - n_s + j``: ``j <= i`` when causal,
  ``j < n_s`` when not; bits ``j >= n_s`` are 0. Keys before the draft block are always visible
  (the sliding window still applies to them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plugin_api.ops.attention import AttentionBatch, AttentionSpec, DecodeLayout, decode_layout

MIN_SEQS = 8
MIN_BLOCKS = 16
MIN_TOKENS = 16


def _pow2(n: int, floor: int) -> int:
    return max(floor, 1 << max(n - 1, 0).bit_length())


@dataclass(frozen=True, slots=True)
class Capacity:
    """Sizes of the plan buffers: decode requests, block-table columns, tokens, mask words."""

    seqs: int
    blocks_per_seq: int
    tokens: int
    mask_words: int

    @classmethod
    def for_batch(cls, spec: AttentionSpec, batch: AttentionBatch) -> Capacity:
        """Powers of two above what ``batch`` needs, so later steps usually fit."""
        need = _needs(spec, batch)
        return cls(
            seqs=_pow2(need.seqs, MIN_SEQS),
            blocks_per_seq=_pow2(need.blocks_per_seq, MIN_BLOCKS),
            tokens=_pow2(need.tokens, MIN_TOKENS),
            mask_words=need.mask_words,
        )

    def check_fits(self, need: Capacity) -> None:
        for name in ("seqs", "blocks_per_seq", "tokens", "mask_words"):
            if getattr(need, name) > getattr(self, name):
                raise ValueError(
                    f"attention.plan(reuse=...): this batch needs {name}={getattr(need, name)}, "
                    f"the reused plan's buffers hold {getattr(self, name)}; plan without reuse "
                    "to grow them (and capture graphs again)"
                )


def _needs(spec: AttentionSpec, batch: AttentionBatch) -> Capacity:
    return Capacity(
        seqs=max(batch.num_decodes, 1),
        blocks_per_seq=max(int(batch.block_table.shape[1]), 1),
        tokens=max(batch.num_tokens if batch.num_seqs else 0, 1),
        mask_words=mask_words(1 + spec.num_speculative_tokens),
    )


def mask_words(q_len: int) -> int:
    """32-bit words per draft-mask row for ``q_len`` query tokens per request."""
    return -(-q_len // 32)


def draft_mask(query_lens: Sequence[int], q_len_per_req: int, *, causal: bool) -> torch.Tensor:
    """The bit-packed draft mask (module docstring) as uint16 ``[sum(query_lens), 2*W]``."""
    width = mask_words(q_len_per_req)
    lens = torch.tensor(list(query_lens), dtype=torch.int64)
    n = torch.repeat_interleave(lens, lens)  # each row's request length
    starts = torch.cumsum(lens, 0) - lens
    i = torch.arange(int(lens.sum())) - torch.repeat_interleave(starts, lens)  # draft index
    visible = i + 1 if causal else n  # bits [0, visible) are set
    word0 = torch.arange(width, dtype=torch.int64) * 32
    count = (visible.unsqueeze(1) - word0).clamp(0, 32)
    words = (torch.ones_like(count) << count) - 1  # int64: 2**32 - 1 at most
    # two's-complement wrap into int32, then read the same bytes as little-endian uint16 pairs
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.view(torch.uint16).reshape(-1, 2 * width)


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """How this step's decode rows go to the decode kernel (plain host data)."""

    layout: DecodeLayout
    q_len_per_req: int  # uniform: the common length; ragged: the maximum
    single_token: bool  # every decode has one token and no prefill follows: pad rows allowed

    @property
    def ragged(self) -> bool:
        return not self.layout.uniform

    @property
    def needs_mask(self) -> bool:
        return self.q_len_per_req > 1


@dataclass(frozen=True, slots=True)
class PrefillStep:
    """The prefill sequences' FlashInfer page metadata (CPU int32; the wrapper copies it)."""

    first_row: int  # query row of the first prefill token
    num_rows: int
    qo_indptr: torch.Tensor  # [P + 1], relative to first_row
    kv_indptr: torch.Tensor  # [P + 1], into kv_indices
    kv_indices: torch.Tensor  # [kv_indptr[-1]] physical blocks
    kv_last_page_len: torch.Tensor  # [P], in 1..block_size


@dataclass(frozen=True, slots=True)
class Buffers:
    """Device buffers a captured graph reads; refilled in place by a reusing plan."""

    block_table: torch.Tensor  # int32 [seqs, blocks_per_seq]; decode requests' blocks
    seq_lens: torch.Tensor  # int32 [seqs]; 0 for padding requests
    q_cu_seq_lens: torch.Tensor  # int32 [seqs + 1]; ragged decode offsets
    mask: torch.Tensor  # int32 [tokens * mask_words]; draft-mask words, viewed per step
    write_rows: torch.Tensor  # int64 [tokens]; query row whose K/V is written
    write_blocks: torch.Tensor  # int64 [tokens]
    write_offsets: torch.Tensor  # int64 [tokens]
    write_valid: torch.Tensor  # bool [tokens]; False only when nothing is written this step

    @classmethod
    def allocate(cls, cap: Capacity, device: torch.device) -> Buffers:
        def z(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            block_table=z(cap.seqs, cap.blocks_per_seq),
            seq_lens=z(cap.seqs),
            q_cu_seq_lens=z(cap.seqs + 1),
            mask=z(cap.tokens * cap.mask_words),
            write_rows=z(cap.tokens, dtype=torch.int64),
            write_blocks=z(cap.tokens, dtype=torch.int64),
            write_offsets=z(cap.tokens, dtype=torch.int64),
            write_valid=z(cap.tokens, dtype=torch.bool),
        )

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass
class FlashInferPlan:
    """One step's plan: buffers, decode and prefill facts, and the prefill wrapper (set by the
    implementation once planned; kept across reusing plans)."""

    spec: AttentionSpec
    capacity: Capacity
    bufs: Buffers
    num_tokens: int
    decode: DecodeStep | None
    prefill: PrefillStep | None
    prefill_wrapper: Any = field(default=None)

    def buffers(self) -> dict[str, torch.Tensor]:
        return self.bufs.as_dict()

    def decode_rows(self, query_rows: int) -> int:
        """Query rows the decode kernel covers: padding rows join one-token decode steps."""
        d = self.decode
        if d is None:
            return 0
        if d.single_token and query_rows > d.layout.num_decode_tokens:
            if query_rows > self.capacity.seqs:
                raise ValueError(
                    f"attention.run: query has {query_rows} rows; the plan's one-token decode "
                    f"buffers hold {self.capacity.seqs} requests (plan a larger batch first)"
                )
            return query_rows
        return d.layout.num_decode_tokens

    def decode_requests(self, query_rows: int) -> int:
        d = self.decode
        if d is None:
            return 0
        if d.single_token:
            return self.decode_rows(query_rows)
        return d.layout.num_decodes


def _decode_step(spec: AttentionSpec, batch: AttentionBatch) -> DecodeStep | None:
    layout = decode_layout(batch)
    if layout.num_decodes == 0:
        return None
    lens = batch.query_lens[: layout.num_decodes]
    q_len = layout.q_len_per_req if layout.uniform else int(lens.max())
    single = layout.uniform and q_len == 1 and batch.num_decodes == batch.num_seqs
    return DecodeStep(layout, int(q_len or 1), single)


def _prefill_step(spec: AttentionSpec, batch: AttentionBatch) -> PrefillStep | None:
    nd, n = batch.num_decodes, batch.num_seqs
    if nd == n:
        return None
    qsl = batch.query_start_loc
    first = int(qsl[nd])
    seq_lens = batch.seq_lens[nd:].to(torch.int64)
    bs = spec.block_size
    blocks = (seq_lens + bs - 1) // bs
    kv_indptr = torch.zeros(n - nd + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(blocks, 0)
    cols = torch.arange(batch.block_table.shape[1]).unsqueeze(0)
    kv_indices = batch.block_table[nd:][cols < blocks.unsqueeze(1)].to(torch.int32)
    return PrefillStep(
        first_row=first,
        num_rows=int(qsl[-1]) - first,
        qo_indptr=(qsl[nd:] - first).to(torch.int32),
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        kv_last_page_len=(seq_lens - (blocks - 1) * bs).to(torch.int32),
    )


def _write_entries(spec: AttentionSpec, batch: AttentionBatch, cap: Capacity) -> torch.Tensor:
    """[4, tokens] int64: row, block, offset, valid of each K/V write, padded to capacity.

    Padding entries repeat entry 0 (an identical duplicate write is harmless); when nothing is
    written they rewrite slot 0 with its own value (valid=0).
    """
    tokens = batch.num_tokens if batch.num_seqs else 0
    slots = batch.slot_mapping[:tokens]
    rows = (slots >= 0).nonzero().flatten()  # CPU tensor: no device sync
    out = torch.zeros((4, cap.tokens), dtype=torch.int64)
    k = int(rows.numel())
    if k:
        s = slots[rows]
        out[0, :k], out[1, :k], out[2, :k] = rows, s // spec.block_size, s % spec.block_size
        out[3, :k] = 1
        out[:, k:] = out[:, :1]
    return out


def build_plan(
    spec: AttentionSpec,
    batch: AttentionBatch,
    device: torch.device,
    reuse: FlashInferPlan | None,
) -> FlashInferPlan:
    """Fill (or refill) the plan buffers for ``batch``; host data in, async copies out."""
    if reuse is not None:
        cap = reuse.capacity
        cap.check_fits(_needs(spec, batch))
        bufs = reuse.bufs
    else:
        cap = Capacity.for_batch(spec, batch)
        bufs = Buffers.allocate(cap, device)
    decode = _decode_step(spec, batch)
    nd = batch.num_decodes
    table = torch.zeros((cap.seqs, cap.blocks_per_seq), dtype=torch.int32)
    table[:nd, : batch.block_table.shape[1]] = batch.block_table[:nd]
    seq_lens = torch.zeros(cap.seqs, dtype=torch.int32)
    seq_lens[:nd] = batch.seq_lens[:nd]
    cu = torch.zeros(cap.seqs + 1, dtype=torch.int32)
    cu[1 : nd + 1] = torch.cumsum(batch.query_lens[:nd], 0)
    cu[nd + 1 :] = cu[nd]  # requests past the last decode own no rows
    mask = torch.zeros(cap.tokens * cap.mask_words, dtype=torch.int32)
    if decode is not None and decode.needs_mask:
        m = draft_mask(batch.query_lens[:nd].tolist(), decode.q_len_per_req, causal=spec.causal)
        flat = m.view(torch.int32).flatten()
        mask[: flat.numel()] = flat
    writes = _write_entries(spec, batch, cap)
    nb = dict(non_blocking=True)
    bufs.block_table.copy_(table, **nb)
    bufs.seq_lens.copy_(seq_lens, **nb)
    bufs.q_cu_seq_lens.copy_(cu, **nb)
    bufs.mask.copy_(mask, **nb)
    bufs.write_rows.copy_(writes[0], **nb)
    bufs.write_blocks.copy_(writes[1], **nb)
    bufs.write_offsets.copy_(writes[2], **nb)
    bufs.write_valid.copy_(writes[3].bool(), **nb)
    return FlashInferPlan(
        spec=spec,
        capacity=cap,
        bufs=bufs,
        num_tokens=batch.num_tokens if batch.num_seqs else 0,
        decode=decode,
        prefill=_prefill_step(spec, batch),
        prefill_wrapper=reuse.prefill_wrapper if reuse is not None else None,
    )


def write_kv(
    spec: AttentionSpec,
    key: torch.Tensor,
    value: torch.Tensor,
    cache: torch.Tensor,
    k_scale: float,
    v_scale: float,
    bufs: Buffers,
) -> None:
    """Store K/V rows at the plan's slots in ``cache`` ``[blocks, 2, kv_heads, block, head]``.

    Fixed shapes and no host reads, so it can be captured: every capacity entry is written,
    padding entries duplicate a real write or rewrite a value in place.
    """
    rows, blk, off = bufs.write_rows, bufs.write_blocks, bufs.write_offsets
    valid = bufs.write_valid.view(-1, 1, 1)
    # fp8 goes through its bytes: the quantised value is the reference's, bit for bit
    target = cache.view(torch.uint8) if spec.fp8_kv else cache
    for kv, src, scale in ((0, key, k_scale), (1, value, v_scale)):
        new = src.index_select(0, rows)  # [tokens, kv_heads, head]
        if spec.fp8_kv:
            new = (new.float() / scale).clamp(-448.0, 448.0).to(cache.dtype).view(torch.uint8)
        old = target[blk, kv, :, off, :]  # gathered before the write below
        target[blk, kv, :, off, :] = torch.where(valid, new.to(target.dtype), old)

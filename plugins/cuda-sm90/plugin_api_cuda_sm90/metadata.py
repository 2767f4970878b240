"""Per-step attention metadata for the FlashInfer calls, built from the host's CPU
``AttentionBatch`` with no device-to-host synchronisation.

The plan holds device buffers sized by a ``Capacity`` so that a captured CUDA graph keeps
reading the same storage: ``build_plan(..., reuse=previous)`` refills them in place, and a batch
that does not fit is an error (a graph captured on the old buffers would read stale data). The
buffers are named views of one device storage; a plan chain fills a host copy of it in place
(pinned on CUDA) and sends it with one asynchronous copy per step.

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

import functools
import math
from collections.abc import Callable, Sequence
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


BUFFER_NAMES = ("slots", "block_table", "seq_lens", "q_cu_seq_lens", "mask")


def _layout(cap: Capacity) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
    """Each named buffer's dtype and shape, in storage order (the int64 one first, so every
    view starts at a multiple of its element size)."""
    return (
        ("slots", torch.int64, (cap.tokens,)),
        ("block_table", torch.int32, (cap.seqs, cap.blocks_per_seq)),
        ("seq_lens", torch.int32, (cap.seqs,)),
        ("q_cu_seq_lens", torch.int32, (cap.seqs + 1,)),
        ("mask", torch.int32, (cap.tokens * cap.mask_words,)),
    )


@dataclass(frozen=True, slots=True)
class Buffers:
    """Named views of one storage: on the device, what a captured graph reads (refilled in
    place by a reusing plan); on the host, the staging copy they are sent from."""

    storage: torch.Tensor  # uint8; holds every buffer below, in ``_layout`` order
    slots: torch.Tensor  # int64 [tokens]; cache slot of each query row's K/V, -1: none
    block_table: torch.Tensor  # int32 [seqs, blocks_per_seq]; decode requests' blocks
    seq_lens: torch.Tensor  # int32 [seqs]; 0 for padding requests
    q_cu_seq_lens: torch.Tensor  # int32 [seqs + 1]; ragged decode offsets
    mask: torch.Tensor  # int32 [tokens * mask_words]; draft-mask words, viewed per step

    @classmethod
    def allocate(cls, cap: Capacity, device: torch.device, *, pin: bool = False) -> Buffers:
        layout = _layout(cap)
        sizes = [math.prod(shape) * dtype.itemsize for _, dtype, shape in layout]
        storage = torch.zeros(sum(sizes), dtype=torch.uint8, device=device, pin_memory=pin)
        views: dict[str, torch.Tensor] = {}
        at = 0
        for (name, dtype, shape), size in zip(layout, sizes, strict=True):
            views[name] = storage[at : at + size].view(dtype).view(shape)
            at += size
        bufs = cls(storage=storage, **views)
        bufs.slots.fill_(-1)
        return bufs

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The named views (the storage they share is not listed)."""
        return {name: getattr(self, name) for name in BUFFER_NAMES}


def _event() -> torch.cuda.Event:
    return torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves __init__ untyped


class HostStaging:
    """The host side of a plan chain's ``Buffers``: two copies (pinned when the device is
    CUDA), filled in turn, each sent to the device by one asynchronous copy."""

    def __init__(self, cap: Capacity, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.copies = tuple(Buffers.allocate(cap, torch.device("cpu"), pin=cuda) for _ in range(2))
        self._sent = tuple(_event() for _ in range(2)) if cuda else None
        self._turn = 0

    def take(self) -> Buffers:
        """The next host copy to fill (the other one may still be in flight)."""
        if self._sent is not None:
            # a DMA may still read this pinned copy (sent two plans ago): refilling it before
            # the copy completes would send the new step's data to the old one
            self._sent[self._turn].synchronize()
        return self.copies[self._turn]

    def send(self, device_bufs: Buffers) -> None:
        """Copy the copy last taken to ``device_bufs`` on the current stream, without waiting."""
        device_bufs.storage.copy_(self.copies[self._turn].storage, non_blocking=True)
        if self._sent is not None:
            self._sent[self._turn].record(torch.cuda.current_stream(device_bufs.storage.device))
        self._turn ^= 1


@dataclass
class FlashInferPlan:
    """One step's plan: buffers, decode and prefill facts, and the prefill wrapper (set by the
    implementation once planned; kept across reusing plans, as are the host staging and the
    decode workspace)."""

    spec: AttentionSpec
    capacity: Capacity
    bufs: Buffers
    staging: HostStaging
    num_tokens: int
    decode: DecodeStep | None
    prefill: PrefillStep | None
    prefill_wrapper: Any = field(default=None)
    decode_workspace: torch.Tensor | None = None
    # what the decode call takes that is the same for every layer of this step, per
    # (architecture, query rows): filled by ``calls.decode_call`` on the step's first layer
    decode_fixed: dict[tuple[Any, int], Any] = field(default_factory=dict)

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


def _decode_step(
    spec: AttentionSpec, batch: AttentionBatch, decodes_in_prefill: bool
) -> DecodeStep | None:
    layout = decode_layout(batch)
    if layout.num_decodes == 0 or decodes_in_prefill:
        return None
    lens = batch.query_lens[: layout.num_decodes]
    q_len = layout.q_len_per_req if layout.uniform else int(lens.max())
    single = layout.uniform and q_len == 1 and batch.num_decodes == batch.num_seqs
    return DecodeStep(layout, int(q_len or 1), single)


def _prefill_step(
    spec: AttentionSpec, batch: AttentionBatch, decodes_in_prefill: bool
) -> PrefillStep | None:
    """The FA2 paged prefill's rows: the prefill sequences, or with ``decodes_in_prefill``
    every sequence from row 0 (an fp8 cache on SM90/SM12x, ``rules.decode_kernel``).

    A decode is then a prefill of its query length, and FlashInfer's masks give the draft
    semantics of the module docstring: causal keeps key ``j`` for query ``i`` iff
    ``j <= kv_len - qo_len + i`` (bottom-right aligned: draft ``i`` sees drafts ``0..i``),
    non-causal keeps every key, ``window_left`` drops keys before
    ``kv_len - qo_len + i - window_left``.
    """
    n = batch.num_seqs
    nd = 0 if decodes_in_prefill else batch.num_decodes
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


def _fill(
    host: Buffers, spec: AttentionSpec, batch: AttentionBatch, decode: DecodeStep | None
) -> None:
    """Write ``batch``'s metadata into the host copy, every entry of it (a smaller batch after
    a larger one leaves nothing behind)."""
    tokens = batch.num_tokens if batch.num_seqs else 0
    nd = batch.num_decodes
    host.storage.zero_()
    host.slots.fill_(-1)  # padding rows write nothing
    host.slots[:tokens] = batch.slot_mapping[:tokens]
    if nd:
        host.block_table[:nd, : batch.block_table.shape[1]] = batch.block_table[:nd]
        host.seq_lens[:nd] = batch.seq_lens[:nd]
        qsl = batch.query_start_loc  # from 0, decodes first: their offsets as they are
        host.q_cu_seq_lens[: nd + 1] = qsl[: nd + 1]
        host.q_cu_seq_lens[nd + 1 :] = qsl[nd]  # requests past the last decode own no rows
    if decode is not None and decode.needs_mask:
        m = draft_mask(batch.query_lens[:nd].tolist(), decode.q_len_per_req, causal=spec.causal)
        flat = m.view(torch.int32).flatten()
        host.mask[: flat.numel()] = flat


def build_plan(
    spec: AttentionSpec,
    batch: AttentionBatch,
    device: torch.device,
    reuse: FlashInferPlan | None,
    *,
    decodes_in_prefill: bool = False,
) -> FlashInferPlan:
    """Fill (or refill) the plan buffers for ``batch``: the chain's host staging filled in
    place, then one asynchronous copy to the device buffers."""
    if reuse is not None:
        cap = reuse.capacity
        cap.check_fits(_needs(spec, batch))
        bufs, staging = reuse.bufs, reuse.staging
    else:
        cap = Capacity.for_batch(spec, batch)
        bufs, staging = Buffers.allocate(cap, device), HostStaging(cap, device)
    decode = _decode_step(spec, batch, decodes_in_prefill)
    _fill(staging.take(), spec, batch, decode)
    staging.send(bufs)
    return FlashInferPlan(
        spec=spec,
        capacity=cap,
        bufs=bufs,
        staging=staging,
        num_tokens=batch.num_tokens if batch.num_seqs else 0,
        decode=decode,
        prefill=_prefill_step(spec, batch, decodes_in_prefill),
        prefill_wrapper=reuse.prefill_wrapper if reuse is not None else None,
        decode_workspace=reuse.decode_workspace if reuse is not None else None,
    )


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    cache: torch.Tensor,
    k_scale: float,
    v_scale: float,
    bufs: Buffers,
) -> None:
    """Store K/V rows at the plan's slots in ``cache`` ``[blocks, 2, kv_heads, block, head]``:
    one launch of the host's Triton kernel over every capacity entry (slot -1 writes and reads
    nothing), no host reads, so it can be captured. An fp8 cache gets the reference's bits."""
    _triton_write()(key, value, cache, bufs.slots, float(k_scale), float(v_scale))


@functools.cache
def _triton_write() -> Callable[..., None]:
    # imported on first use: the module loads triton, which a machine without it lacks (there
    # the attention decision refuses every spec, so no write is ever made)
    from plugin_api.triton.cache_write import write_kv as triton_write_kv

    return triton_write_kv

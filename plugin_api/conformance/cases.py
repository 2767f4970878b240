"""Builders for paged-attention test cases: a random batch, its cache, and its expected output.

Used by the conformance kit, the host's tests and the benchmarks. The expected output comes from
``oracle.dense_attention`` over contiguous per-sequence K/V, never from a backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ..ops.attention import AttentionBatch, AttentionSpec, KVCache, allocate_kv_cache
from . import oracle


@dataclass(frozen=True)
class PagedCase:
    """One step of a paged batch, ready to run.

    ``k_full``/``v_full`` hold each sequence's K/V (model dtype) for every position after the
    step, as the oracle sees them; ``written`` lists the cache slots this step must write.
    """

    spec: AttentionSpec
    batch: AttentionBatch
    query: torch.Tensor
    key: torch.Tensor | None
    value: torch.Tensor | None
    cache: KVCache
    sinks: torch.Tensor | None
    k_full: tuple[torch.Tensor, ...]
    v_full: tuple[torch.Tensor, ...]
    written: torch.Tensor  # slots this step writes (int64, on CPU)
    num_tokens: int
    # the buffer ``query`` is a view into (with ``key``/``value`` when it has the model dtype;
    # ``with_query_layout``), or None
    qkv: torch.Tensor | None = None

    def expected(self) -> torch.Tensor:
        """fp32 ``[num_tokens, num_heads, head_size]`` from the dense oracle."""
        s = self.spec
        rows = []
        qsl = self.batch.query_start_loc.tolist()
        for i in range(self.batch.num_seqs):
            k, v = self.k_full[i], self.v_full[i]
            if s.fp8_kv:
                k = oracle.fp8_roundtrip(k, self.cache.k_scale)
                v = oracle.fp8_roundtrip(v, self.cache.v_scale)
            rows.append(
                oracle.dense_attention(
                    self.query[qsl[i] : qsl[i + 1]].cpu(),
                    k.cpu(),
                    v.cpu(),
                    scale=s.softmax_scale,
                    causal=s.causal,
                    window=s.sliding_window,
                    soft_cap=s.logits_soft_cap,
                    sinks=None if self.sinks is None else self.sinks.cpu(),
                )
            )
        if not rows:
            return torch.zeros((0, s.num_heads, s.head_size))
        return torch.cat(rows)


def _store(spec: AttentionSpec, cache: KVCache, x: torch.Tensor, scale: float) -> torch.Tensor:
    if spec.fp8_kv:
        return (x.float() / scale).clamp(-448.0, 448.0).to(cache.data.dtype)
    return x.to(cache.data.dtype)


def make_case(
    spec: AttentionSpec,
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    *,
    num_decodes: int,
    device: torch.device | str,
    seed: int = 0,
    pad_rows: int = 0,
    skip_tokens: Sequence[int] = (),
    spare_blocks: int = 3,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    value_scale: float = 1.0,
) -> PagedCase:
    """A random step: sequences with ``query_lens`` new tokens ending at ``seq_lens``.

    Blocks are assigned in a shuffled order (paging is exercised), history is written into the
    cache directly, and the tokens listed in ``skip_tokens`` get slot -1 (their cache position
    then holds stale values that the oracle must see). ``pad_rows`` adds query rows past the
    last token, filled with NaN, which no kernel may let leak into real rows.
    """
    if len(query_lens) != len(seq_lens):
        raise ValueError("make_case: query_lens and seq_lens differ in length")
    g = torch.Generator().manual_seed(seed)
    dev = torch.device(device)
    bs, kh, d = spec.block_size, spec.num_kv_heads, spec.head_size
    blocks_per_seq = [-(-length // bs) for length in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=g).tolist()
    table: list[list[int]] = []
    at = 0
    for nb in blocks_per_seq:
        table.append(order[at : at + nb])
        at += nb
    cache = allocate_kv_cache(spec, num_blocks, dev, k_scale=k_scale, v_scale=v_scale)
    # Unused blocks hold garbage, so that a kernel reading past a sequence's end is caught.
    garbage = torch.randn(cache.data.shape, generator=g) * 100
    cache.data.copy_(garbage.to(cache.data.dtype))

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * value_scale).to(spec.dtype)

    k_full, v_full, slots, queries, keys, values = [], [], [], [], [], []
    written = []
    token = 0
    for s, (n, length) in enumerate(zip(query_lens, seq_lens, strict=True)):
        k, v = rand(length, kh, d), rand(length, kh, d)
        for pos in range(length):
            blk, off = table[s][pos // bs], pos % bs
            new = pos >= length - n
            if new and token in skip_tokens:
                # slot -1: the cache keeps its stale value, which is what attention reads
                slots.append(-1)
                k[pos] = _readback(spec, cache, cache.data[blk, 0, :, off, :])
                v[pos] = _readback(spec, cache, cache.data[blk, 1, :, off, :], value=True)
            elif new and not spec.kv_sharing:
                slots.append(blk * bs + off)
                written.append(blk * bs + off)
            else:
                cache.data[blk, 0, :, off, :] = _store(spec, cache, k[pos], k_scale).to(dev)
                cache.data[blk, 1, :, off, :] = _store(spec, cache, v[pos], v_scale).to(dev)
                if new:
                    slots.append(blk * bs + off)
            if new:
                token += 1
        k_full.append(k)
        v_full.append(v)
        queries.append(torch.randn(n, spec.num_heads, d, generator=g))
        keys.append(k[length - n :])
        values.append(v[length - n :])
    num_tokens = sum(query_lens)
    q = torch.cat(queries) if queries else torch.zeros((0, spec.num_heads, d))
    if pad_rows:
        q = torch.cat([q, torch.full((pad_rows, spec.num_heads, d), float("nan"))])
    key = value = None
    if not spec.kv_sharing:
        key = _pad(torch.cat(keys) if keys else torch.zeros((0, kh, d)), pad_rows).to(spec.dtype)
        value = _pad(torch.cat(values) if values else torch.zeros((0, kh, d)), pad_rows).to(
            spec.dtype
        )
        key, value = key.to(dev), value.to(dev)
    sinks = None
    if spec.has_sinks:
        sinks = (torch.randn(spec.num_heads, generator=g) * 2).to(dev)
    batch = AttentionBatch.from_lists(
        query_lens=list(query_lens),
        seq_lens=list(seq_lens),
        block_table=table,
        slot_mapping=slots + [-1] * pad_rows,
        num_decodes=num_decodes,
    )
    return PagedCase(
        spec=spec,
        batch=batch,
        query=q.to(spec.q_dtype).to(dev),
        key=key,
        value=value,
        cache=cache,
        sinks=sinks,
        k_full=tuple(k_full),
        v_full=tuple(v_full),
        written=torch.tensor(written, dtype=torch.int64),
        num_tokens=num_tokens,
    )


def _readback(
    spec: AttentionSpec, cache: KVCache, stored: torch.Tensor, value: bool = False
) -> torch.Tensor:
    scale = cache.v_scale if value else cache.k_scale
    if spec.fp8_kv:
        # keep the stored fp8 value; dividing by the scale makes the oracle's roundtrip exact
        return (stored.float().cpu() * scale).to(spec.dtype)
    return stored.cpu().to(spec.dtype)


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    if not rows:
        return x
    return torch.cat([x, torch.zeros((rows, *x.shape[1:]), dtype=x.dtype)])


# How ``with_query_layout`` lays a step's query, key and value out in memory.
QUERY_LAYOUTS = ("fused-qkv", "padded-heads", "head-major")
# elements between heads past ``head_size`` in the padded-heads layout: keeps every head vector
# 16-byte aligned for every dtype, as a kernel reading vectors may require
HEAD_PAD = 16


def with_query_layout(case: PagedCase, layout: str) -> PagedCase:
    """``case`` with the same values, ``query``/``key``/``value`` as strided views into one
    buffer (``PagedCase.qkv``); every element of it outside the views is NaN, so a kernel that
    reads or writes past a view shows it. ``H``/``KH`` heads of ``D``, ``T`` rows:

    - ``fused-qkv``: an engine's fused projection output ``[T, (H + 2 * KH) * D]`` split into
      ``[T, H, D]``, ``[T, KH, D]``, ``[T, KH, D]`` (row stride ``(H + 2 * KH) * D``).
    - ``padded-heads``: as fused, with ``HEAD_PAD`` unused elements after each head (head
      stride ``D + HEAD_PAD``).
    - ``head-major``: ``[H + 2 * KH, T, D]`` memory seen as ``[T, heads, D]`` (row stride
      ``D``, head stride ``T * D``).

    A query dtype other than the model dtype gets a buffer of its own, of the same layout.
    """
    if layout not in QUERY_LAYOUTS:
        raise ValueError(f"with_query_layout: layout={layout!r} is not one of {QUERY_LAYOUTS}")
    s = case.spec
    t, h, kh, d = case.query.shape[0], s.num_heads, s.num_kv_heads, s.head_size
    dev = case.query.device
    if layout == "head-major":
        full = torch.full((h + 2 * kh, t, d), float("nan"), device=dev)
    else:
        pd = d + HEAD_PAD if layout == "padded-heads" else d
        full = torch.full((t, h + 2 * kh, pd), float("nan"), device=dev)
    qbuf = full.to(s.q_dtype)
    buf = qbuf if s.q_dtype == s.dtype else full.to(s.dtype)

    def heads(b: torch.Tensor, first: int, n: int) -> torch.Tensor:
        if layout == "head-major":
            return b[first : first + n].transpose(0, 1)
        return b[:, first : first + n, :d]

    query, key, value = heads(qbuf, 0, h), heads(buf, h, kh), heads(buf, h + kh, kh)
    query.copy_(case.query)
    if case.key is None or case.value is None:  # KV-sharing: the K/V lanes stay NaN
        return replace(case, query=query, qkv=qbuf)
    key.copy_(case.key)
    value.copy_(case.value)
    return replace(case, query=query, key=key, value=value, qkv=qbuf)

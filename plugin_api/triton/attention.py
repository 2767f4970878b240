"""Triton kernel: paged attention for a whole mixed batch in one launch.

Prefill and decode rows, uniform or ragged multi-token decode, sinks, sliding window, logits
soft cap, non-causal, GQA/MQA and an fp8 cache with per-layer scales all go through the same
kernel. The cache layout is the host's ``[num_blocks, 2, num_kv_heads, block_size, head_size]``.

Work split: a program owns one KV head and a tile of ``BLOCK_Q`` consecutive query tokens of one
sequence, i.e. ``BLOCK_Q * GROUP`` query rows (every query head that reads this KV head), and
streams that sequence's keys ``BLOCK_N`` at a time with an online softmax in fp32. Keys are
gathered per token through the block table, so any ``block_size`` works. The tile -> (sequence,
first token) map is built by the plan on the host (``tile_map``); its length is bounded by
``tokens // BLOCK_Q + num_seqs``, so a plan sized for a capacity keeps a fixed grid.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def _non_finite_terms(
    pv: tl.tensor,
    p: tl.tensor,
    v: tl.tensor,
    visible: tl.tensor,
    nan_v: tl.tensor,
    inf_v: tl.tensor,
) -> tl.tensor:
    """``pv`` (the finite values' products) plus the non-finite values of the keys each row
    sees: NaN stays NaN, ``p * inf`` is inf for ``p > 0`` and NaN for ``p == 0``, opposite
    infinities make NaN. Counts of 0/1 indicators, as fp16 dots (exact)."""
    seen = visible.to(tl.float16)
    live = (p > 0).to(tl.float16)  # only visible keys have p > 0
    dead = (visible & (p == 0)).to(tl.float16)
    nan = (tl.dot(seen, nan_v.to(tl.float16)) > 0) | (tl.dot(dead, inf_v.to(tl.float16)) > 0)
    pos = tl.dot(live, (inf_v & (v > 0)).to(tl.float16)) > 0
    neg = tl.dot(live, (inf_v & (v < 0)).to(tl.float16)) > 0
    pv = pv + tl.where(pos, float("inf"), 0.0) + tl.where(neg, float("-inf"), 0.0)
    return tl.where(nan, float("nan"), pv)


@triton.jit  # type: ignore[untyped-decorator]  # triton has no py.typed: jit is untyped
def _paged_attention_kernel(
    q_ptr: tl.tensor,
    o_ptr: tl.tensor,
    cache_ptr: tl.tensor,
    sinks_ptr: tl.tensor,
    tile_seq_ptr: tl.tensor,
    tile_q0_ptr: tl.tensor,
    qsl_ptr: tl.tensor,
    seq_lens_ptr: tl.tensor,
    block_table_ptr: tl.tensor,
    stride_qt: tl.tensor,
    stride_qh: tl.tensor,
    stride_ot: tl.tensor,
    stride_oh: tl.tensor,
    stride_cb: tl.tensor,
    stride_ckv: tl.tensor,
    stride_ch: tl.tensor,
    stride_cs: tl.tensor,
    stride_bt: tl.tensor,
    scale: tl.tensor,
    k_scale: tl.tensor,
    v_scale: tl.tensor,
    soft_cap: tl.tensor,
    window: tl.tensor,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    SINKS: tl.constexpr,
    QK_DTYPE: tl.constexpr,
    P_DTYPE: tl.constexpr,
    PV_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
) -> None:
    tile = tl.program_id(0)
    kh = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    if seq < 0:  # spare tile of a plan sized for a larger batch
        return
    q0 = tl.load(tile_q0_ptr + tile)
    q_start = tl.load(qsl_ptr + seq)
    n = tl.load(qsl_ptr + seq + 1) - q_start
    length = tl.load(seq_lens_ptr + seq)

    r = tl.arange(0, BLOCK_M)
    tok = q0 + r // GROUP  # query token within the sequence
    head = kh * GROUP + r % GROUP
    row_ok = (r < BLOCK_Q * GROUP) & (tok < n)
    pos = length - n + tok  # its position in the sequence
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_SIZE
    q_rows = (q_start + tok).to(tl.int64)
    io_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=io_mask,
        other=0.0,
    ).to(QK_DTYPE)

    if SINKS:  # the sink logit starts the running max and adds e^(sink - max) to the sum
        m_i = tl.load(sinks_ptr + head).to(tl.float32)
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # keys any row of this tile can see: [lo, hi)
    hi = length - n + tl.minimum(q0 + BLOCK_Q, n) if CAUSAL else length
    lo = 0
    if WINDOW:
        lo = tl.maximum(length - n + q0 - window + 1, 0)
    lo = (lo // BLOCK_N) * BLOCK_N

    qk_scale = scale * k_scale  # fp8: dot the stored values, scale the logits
    table = block_table_ptr + seq.to(tl.int64) * stride_bt
    head_base = kh.to(tl.int64) * stride_ch
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        j_ok = j < hi
        page = tl.load(table + j // PAGE, mask=j_ok, other=0).to(tl.int64)
        kv = page * stride_cb + head_base + (j % PAGE).to(tl.int64) * stride_cs
        kv_mask = j_ok[:, None] & d_ok[None, :]
        k = tl.load(cache_ptr + kv[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(QK_DTYPE)), input_precision=PRECISION) * qk_scale
        if SOFT_CAP:  # c * tanh(s / c), from exp(-2|x|): no libdevice, no overflow
            e = tl.exp(-2.0 * tl.abs(s / soft_cap))
            t = soft_cap * (1.0 - e) / (1.0 + e)
            s = tl.where(s < 0, -t, t)
        visible = row_ok[:, None] & j_ok[None, :]
        if CAUSAL:
            visible = visible & (j[None, :] <= pos[:, None])
        if WINDOW:
            visible = visible & (j[None, :] > pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(cache_ptr + stride_ckv + kv[:, None] + d[None, :], mask=kv_mask, other=0.0)
        p_op = p.to(P_DTYPE).to(PV_DTYPE)
        v_op = v.to(PV_DTYPE)
        # A masked key has p == 0, but a product adds 0 * inf = NaN for it: a tile holding a
        # non-finite value sums the finite ones as a product and adds each non-finite value of
        # a visible key by the IEEE rules of a plain sum (see _non_finite_terms).
        nan_v = v_op != v_op
        inf_v = tl.abs(v_op) == float("inf")
        if tl.max((nan_v | inf_v).to(tl.int32)) > 0:
            pv = tl.dot(
                p_op, tl.where(nan_v | inf_v, 0.0, v_op).to(PV_DTYPE), input_precision=PRECISION
            )
            pv = _non_finite_terms(pv, p_op, v_op, visible, nan_v, inf_v)
        else:
            pv = tl.dot(p_op, v_op, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    # no visible key and no sink: l_i == 0 and acc == 0, the row is zeros (docs/ops.md)
    out = acc * (v_scale / tl.where(l_i == 0.0, 1.0, l_i))[:, None]
    tl.store(
        o_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=io_mask,
    )


_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def _dot_types(
    dtype: torch.dtype, cache_dtype: torch.dtype, device: torch.device
) -> dict[str, tl.dtype | str | None]:
    """Operand types of the two dots (accumulation is always fp32).

    - QK: the query's dtype; an fp8 key converts to it exactly.
    - PV: p is rounded to the model dtype, except with an fp8 cache: then both p and v go to
      fp16, which holds every e4m3 value exactly and rounds p 8x finer than bf16 (fp8 caches
      hold large values scaled down, where bf16 p errors would show).
    - fp32 operands use IEEE products (tf32 is outside the fp32 tolerance); other operand
      types leave the choice to the backend (not every backend accepts "tf32").
    - On the CPU (only ever the interpreter) bf16 operands widen to fp32 after rounding: the
      3.9 interpreter multiplies a bf16 dot's raw bits. The products stay the same.
    """
    model = _TL[dtype]
    p = tl.float16 if cache_dtype == torch.float8_e4m3fn and dtype != torch.float32 else model
    qk, pv = model, p
    if device.type == "cpu":
        qk = tl.float32 if qk == tl.bfloat16 else qk
        pv = tl.float32 if pv == tl.bfloat16 else pv
    precision = "ieee" if tl.float32 in (qk, pv) else None  # None: the backend's default
    return dict(QK_DTYPE=qk, P_DTYPE=p, PV_DTYPE=pv, PRECISION=precision)


def tile_map(
    query_start_loc: torch.Tensor, block_q: int, capacity: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Host side: for each program, its sequence (-1 for spare programs) and first query token.

    ``query_start_loc`` int32 ``[num_seqs + 1]`` on the CPU; returns two int32 ``[capacity]``.
    """
    qlens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    tiles = (qlens + block_q - 1) // block_q
    total = int(tiles.sum())
    if total > capacity:
        raise ValueError(f"tile_map: the batch needs {total} tiles, capacity is {capacity}")
    seq = torch.full((capacity,), -1, dtype=torch.int32)
    q0 = torch.zeros((capacity,), dtype=torch.int32)
    ids = torch.repeat_interleave(torch.arange(len(qlens)), tiles)
    first = torch.repeat_interleave(torch.cumsum(tiles, 0) - tiles, tiles)
    seq[:total] = ids.to(torch.int32)
    q0[:total] = ((torch.arange(total) - first) * block_q).to(torch.int32)
    return seq, q0


def paged_attention(
    query: torch.Tensor,
    out: torch.Tensor,
    cache: torch.Tensor,
    sinks: torch.Tensor | None,
    tile_seq: torch.Tensor,
    tile_q0: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    scale: float,
    k_scale: float,
    v_scale: float,
    soft_cap: float | None,
    window: int | None,
    causal: bool,
    block_m: int,
    block_q: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
) -> None:
    """Attend ``query`` ``[T, num_heads, head_size]`` into ``out`` (same shape, contiguous).

    ``query`` needs only a contiguous last dim: rows and heads are read by stride (a view into
    a fused QKV output reads in place).

    ``cache`` ``[num_blocks, 2, num_kv_heads, block_size, head_size]`` contiguous (fp8 or the
    query's dtype); ``sinks`` fp32 ``[num_heads]`` or None; metadata int32 on the device:
    ``tile_seq``/``tile_q0`` from ``tile_map``, ``query_start_loc`` ``[S + 1]``, ``seq_lens``
    ``[S]``, ``block_table`` ``[S, max_blocks]``. Rows of ``query`` no sequence covers are
    neither read nor written. The caller has validated every argument.
    """
    num_heads, head_size = query.shape[1], query.shape[2]
    kv_heads, page = cache.shape[2], cache.shape[3]
    grid = (tile_seq.numel(), kv_heads)
    if grid[0] == 0:
        return
    _paged_attention_kernel[grid](
        query,
        out,
        cache,
        query if sinks is None else sinks,  # never read without SINKS
        tile_seq,
        tile_q0,
        query_start_loc,
        seq_lens,
        block_table,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        *cache.stride()[:4],
        block_table.stride(0),
        scale,
        k_scale,
        v_scale,
        soft_cap or 1.0,
        window or 0,
        GROUP=num_heads // kv_heads,
        HEAD_SIZE=head_size,
        PAGE=page,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_size)),
        CAUSAL=causal,
        WINDOW=window is not None,
        SOFT_CAP=soft_cap is not None,
        SINKS=sinks is not None,
        **_dot_types(query.dtype, cache.dtype, query.device),
        num_warps=num_warps,
        num_stages=num_stages,
    )

"""Tensors for each case, allocated once, and the calls that get timed.

The backend's call goes through the public ops (``prepare``/``mm``/``scaled_mm``,
``per_token_group_quant``, ``attention(...).plan``/``run``, ``copy_state_blocks``) on the chosen
backend, with every output preallocated, so every plugin is measured the same way. Large
weights are shared by neighbouring cases (see ``Fixtures``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backend import Backend
from ..ops.attention import AttentionBatch, AttentionSpec, attention
from ..ops.gemm import mm, prepare, scaled_mm
from ..ops.quant import per_token_group_quant, scales_like
from ..ops.state import copy_state_blocks
from . import baselines as bl
from .cases import AttentionCase, Case, GemmCase, QuantCase, StateCase

TILE = 1 << 20  # elements of random data that fill any tensor (see ``filled``)


@dataclass
class Fixtures:
    """Holds the latest value per slot; asking for a new key drops the old value first, so that
    at most one large weight of each kind is alive."""

    held: dict[str, tuple[Hashable, Any]] = field(default_factory=dict)

    def get(self, slot: str, key: Hashable, make: Callable[[], Any]) -> Any:
        current = self.held.get(slot)
        if current is not None and current[0] == key:
            return current[1]
        self.held.pop(slot, None)
        value = make()
        self.held[slot] = (key, value)
        return value

    def clear(self) -> None:
        self.held.clear()


@dataclass
class Context:
    backend: Backend
    device: torch.device
    fixtures: Fixtures = field(default_factory=Fixtures)
    seed: int = 0

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed)


@dataclass(frozen=True, slots=True)
class Workload:
    run: Callable[[], object]  # the backend's op, through the public API
    baselines: tuple[bl.Baseline, ...] = ()


def fill_(t: torch.Tensor, ctx: Context, *, scale: float = 1.0) -> torch.Tensor:
    """Fill ``t`` in place with random-looking values: one random tile repeated (generating a
    billion random numbers would cost more than the benchmark, and no kernel measured here
    depends on the values)."""
    flat = t.view(-1)
    n = flat.numel()
    if n == 0:
        return t
    g = ctx.generator()
    if t.dtype == torch.int8:
        tile = torch.randint(-127, 128, (min(n, TILE),), generator=g, dtype=torch.int8)
    else:
        tile = (torch.randn(min(n, TILE), generator=g) * scale).to(t.dtype)
    tile = tile.to(t.device)
    whole = n // tile.numel() * tile.numel()
    flat[:whole].view(-1, tile.numel()).copy_(tile.expand(n // tile.numel(), -1))  # one op
    flat[whole:].copy_(tile[: n - whole])
    return t


def filled(
    shape: tuple[int, ...], dtype: torch.dtype, ctx: Context, *, scale: float = 1.0
) -> torch.Tensor:
    return fill_(torch.empty(shape, dtype=dtype, device=ctx.device), ctx, scale=scale)


@functools.singledispatch
def setup(case: Case, ctx: Context) -> Workload:
    raise TypeError(f"bench: no setup for case type {type(case).__name__}")


@setup.register
def _gemm(case: GemmCase, ctx: Context) -> Workload:
    n, k, m, be = case.n, case.k, case.m, ctx.backend
    w = ctx.fixtures.get("weight", (n, k), lambda: filled((n, k), torch.bfloat16, ctx))
    out = torch.empty((m, n), dtype=case.out_dtype, device=ctx.device)
    x = filled((m, k), torch.bfloat16, ctx)
    if not case.scaled:
        packed = ctx.fixtures.get(
            "packed",
            (n, k, case.out_dtype, case.usage),
            lambda: prepare(w, out_dtype=case.out_dtype, usage=case.usage, backend=be),
        )
        w32 = ctx.fixtures.get("upcast", (n, k), lambda: w.float())
        return Workload(
            lambda: mm(x, packed, out=out),
            (
                bl.linear_bf16(x, w, case.out_dtype),
                bl.upcast_fp32(x, w32, out.clone()),
                *([bl.upcast_per_call(x, w)] if case.out_dtype == torch.float32 else []),
            ),
        )
    w_q = ctx.fixtures.get("weight_q", (n, k), lambda: filled((n, k), torch.int8, ctx))
    w_scale = filled((n,), torch.float32, ctx, scale=1e-3).abs_().add_(1e-4)
    packed = ctx.fixtures.get(
        "packed",
        (n, k, "int8", case.out_dtype),
        lambda: prepare(w_q, out_dtype=case.out_dtype, weight_scale=w_scale, backend=be),
    )
    # The timed call starts from the bf16 activation, as a W8A8 layer does: per-token int8
    # quantization (one group of K) into preallocated buffers, then the scaled GEMM.
    x_q = torch.empty((m, k), dtype=torch.int8, device=ctx.device)
    x_scale = torch.empty((m, 1), dtype=torch.float32, device=ctx.device)

    def quant_then_mm() -> object:
        per_token_group_quant(x, k, torch.int8, out=x_q, out_scales=x_scale, backend=be)
        return scaled_mm(x_q, x_scale, packed, out=out)

    def quant_into(q: torch.Tensor, s: torch.Tensor) -> object:
        return per_token_group_quant(x, k, torch.int8, out=q, out_scales=s, backend=be)

    quant_then_mm()  # fills x_q/x_scale with real values for the upcast baseline below
    wq32 = ctx.fixtures.get("upcast", (n, k, "int8"), lambda: w_q.float())
    return Workload(
        quant_then_mm,
        (
            bl.linear_bf16(x, w, case.out_dtype),
            bl.scaled_upcast_fp32(x_q, x_scale, wq32, w_scale, out.clone()),
            bl.int_mm_scaled(quant_into, m, w_q, w_scale, out.clone()),
        ),
    )


@setup.register
def _quant(case: QuantCase, ctx: Context) -> Workload:
    x = filled((case.m, case.k), case.in_dtype, ctx, scale=4.0)
    q = torch.empty((case.m, case.k), dtype=case.dtype, device=ctx.device)
    s = scales_like(case.m, case.groups, case.column_major, ctx.device)
    eps = 1e-10

    def run() -> object:
        return per_token_group_quant(
            x,
            case.group,
            case.dtype,
            eps,
            case.column_major,
            out=q,
            out_scales=s,
            backend=ctx.backend,
        )

    q_ref = torch.empty_like(q)
    s_ref = scales_like(case.m, case.groups, case.column_major, ctx.device)
    return Workload(run, (bl.quant_eager(x, case.group, case.dtype, eps, q_ref, s_ref),))


def attention_spec(case: AttentionCase) -> AttentionSpec:
    return AttentionSpec(
        case.num_heads,
        case.num_kv_heads,
        case.head_size,
        case.dtype,
        kv_cache_dtype=case.cache_dtype,
        block_size=case.block_size,
        num_speculative_tokens=case.q_len - 1 if case.kind == "spec-decode" else 0,
    )


def attention_batch(case: AttentionCase, ctx: Context) -> tuple[AttentionBatch, int]:
    """The case's step (every sequence ``context`` long, its last ``q_len`` tokens new) over
    a cache of the returned number of blocks."""
    b, length, n, bs = case.batch, case.context, case.q_len, case.block_size
    per_seq = -(-length // bs)
    # blocks in shuffled order, so the kernel really follows the block table
    order = torch.randperm(b * per_seq + 1, generator=ctx.generator())[: b * per_seq]
    table = order.view(b, per_seq).to(torch.int32)
    pos = torch.arange(length - n, length)
    slots = (table[:, pos // bs].long() * bs + pos % bs).reshape(-1)
    batch = AttentionBatch(
        query_start_loc=torch.arange(b + 1, dtype=torch.int32) * n,
        seq_lens=torch.full((b,), length, dtype=torch.int32),
        block_table=table,
        slot_mapping=slots,
        num_decodes=0 if case.kind == "prefill" else b,
    )
    return batch, b * per_seq + 1


@setup.register
def _attention(case: AttentionCase, ctx: Context) -> Workload:
    b, length, n = case.batch, case.context, case.q_len
    op = attention(attention_spec(case), ctx.backend)
    batch, num_blocks = attention_batch(case, ctx)
    cache = op.allocate_kv_cache(num_blocks)
    fill_(cache.data, ctx)
    plan = op.plan(batch)
    d, h, kh = case.head_size, case.num_heads, case.num_kv_heads
    query = filled((b * n, h, d), case.dtype, ctx)
    key = filled((b * n, kh, d), case.dtype, ctx)
    value = filled((b * n, kh, d), case.dtype, ctx)
    out = torch.empty_like(query)
    q4 = filled((b, h, n, d), case.dtype, ctx)
    k4 = filled((b, kh, length, d), case.dtype, ctx)
    v4 = filled((b, kh, length, d), case.dtype, ctx)
    offset = None if n == 1 else length - n
    return Workload(
        lambda: op.run(query, key, value, cache, plan, out=out),
        (bl.sdpa(q4, k4, v4, causal_offset=offset),),
    )


@setup.register
def _state(case: StateCase, ctx: Context) -> Workload:
    pool = case.pool_blocks
    states = [
        filled((pool, *case.conv), case.conv_dtype, ctx),
        filled((pool, *case.ssm), case.ssm_dtype, ctx),
    ]
    ids = torch.randperm(pool, generator=ctx.generator())
    src, dst = ids[: case.blocks], ids[case.blocks :]

    def run() -> None:
        copy_state_blocks(states, src, dst, backend=ctx.backend)

    return Workload(run)

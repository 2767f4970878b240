"""Paged attention through the Triton kernels (``plugin_api.triton.attention`` and
``cache_write``): one launch writes the step's K/V, one attends the whole mixed batch.

Graph capture: the plan's device buffers are sized once, by the first plan's batch (its
sequences, block-table columns and slot-mapping length), and ``plan(reuse=...)`` refills them in
place; the kernel grid depends only on those capacities. A runtime that captures graphs makes
its first plan from a batch of its largest shape, as it does for the capture itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...contract.decision import Decision, ImplPath
from ...contract.graphs import GraphLevel, GraphSupport, unless_refused
from ...device_info import DeviceInfo
from ...gpu.triton_target import TritonTarget
from ...ops.attention import AttentionBatch, AttentionSpec, KVCache
from ..launch import AttentionLaunch, table_for

MAX_HEAD_SIZE = 256  # one [BLOCK_M, head_size] fp32 accumulator per program stays in registers
FEATURES = (
    "one Triton launch for mixed prefill/decode (ragged or uniform), GQA, sinks, sliding "
    "window, soft cap, non-causal, fp8 KV, KV sharing"
)


@dataclass(frozen=True, slots=True)
class TritonAttentionPlan:
    """Device metadata for one step (int32 unless noted), in buffers of fixed capacity.

    - ``tile_seq``/``tile_q0`` ``[tokens_cap // block_q + seqs_cap]``: each program's sequence
      (-1: spare) and first query token.
    - ``query_start_loc`` ``[seqs_cap + 1]`` (padded with the token count), ``seq_lens``
      ``[seqs_cap]`` (padded with 0), ``block_table`` ``[seqs_cap, blocks_cap]``.
    - ``slot_mapping`` int64 ``[tokens_cap]`` (padded with -1).
    """

    tile_seq: torch.Tensor
    tile_q0: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_tokens: int
    block_m: int
    block_q: int
    launch: AttentionLaunch

    def buffers(self) -> dict[str, torch.Tensor]:
        return {
            "tile_seq": self.tile_seq,
            "tile_q0": self.tile_q0,
            "query_start_loc": self.query_start_loc,
            "seq_lens": self.seq_lens,
            "block_table": self.block_table,
            "slot_mapping": self.slot_mapping,
        }


class TritonAttention:
    name = "triton"
    path = ImplPath.TRITON

    def __init__(self, target: TritonTarget) -> None:
        self.target = target

    def supports(self, spec: AttentionSpec, info: DeviceInfo) -> Decision:
        reasons = []
        if spec.dcp_size > 1:
            reasons.append(
                f"dcp_size={spec.dcp_size}: the kernel attends one rank's whole cache "
                "(no decode-context-parallel merge)"
            )
        if spec.q_dtype != spec.dtype:
            reasons.append(
                f"query_dtype={spec.q_dtype} differs from dtype={spec.dtype}: no fp8-query path"
            )
        if spec.head_size > MAX_HEAD_SIZE:
            reasons.append(
                f"head_size={spec.head_size} exceeds {MAX_HEAD_SIZE} (the per-program fp32 "
                "accumulator would spill registers)"
            )
        own = Decision.reject(*reasons) if reasons else Decision.accept(FEATURES)
        return Decision.all_of(self.target.triton(info), own)

    def graph_support(self, spec: AttentionSpec, info: DeviceInfo) -> GraphSupport:
        return unless_refused(self.supports(spec, info), lambda: self._graph_level(info))

    def _graph_level(self, info: DeviceInfo) -> GraphSupport:
        if self.target.graph_capture is None:
            return GraphSupport(
                GraphLevel.NEVER,
                f"no graph capture is declared for the Triton kernels on {self.target.device_type}",
            )
        capture = self.target.graph_capture(info)
        if not capture.ok:
            return GraphSupport(GraphLevel.NEVER, capture.because())
        return GraphSupport(
            GraphLevel.ALWAYS,
            f"{capture.because()}; one kernel for mixed batches, grid and metadata buffers "
            "sized by the plan's capacity and refilled in place by plan(reuse=...)",
        )

    def plan(
        self,
        spec: AttentionSpec,
        batch: AttentionBatch,
        device: torch.device,
        reuse: TritonAttentionPlan | None,
    ) -> TritonAttentionPlan:
        from ..attention import tile_map

        group = spec.num_heads // spec.num_kv_heads
        cfg = table_for(device).attention
        block_m = max(cfg.block_m, _next_pow2(group))
        block_q = block_m // group
        n, tokens = batch.num_seqs, (batch.num_tokens if batch.num_seqs else 0)
        bs = spec.block_size
        cols = int(((batch.seq_lens.max() + bs - 1) // bs).item()) if n else 0  # columns read
        if reuse is None:
            seqs_cap, blocks_cap = n, int(batch.block_table.shape[1])
            tokens_cap = max(tokens, int(batch.slot_mapping.shape[0]))
        else:
            seqs_cap = int(reuse.seq_lens.shape[0])
            blocks_cap = int(reuse.block_table.shape[1])
            tokens_cap = int(reuse.slot_mapping.shape[0])
            _check_capacity(n, cols, tokens, seqs_cap, blocks_cap, tokens_cap)
        qsl = torch.full((seqs_cap + 1,), tokens, dtype=torch.int32)
        qsl[: n + 1] = batch.query_start_loc
        seq_lens = torch.zeros((seqs_cap,), dtype=torch.int32)
        seq_lens[:n] = batch.seq_lens
        table = torch.zeros((seqs_cap, blocks_cap), dtype=torch.int32)
        table[:n, :cols] = batch.block_table[:, :cols]
        slots = torch.full((tokens_cap,), -1, dtype=torch.int64)
        slots[:tokens] = batch.slot_mapping[:tokens]
        tile_seq, tile_q0 = tile_map(qsl, block_q, tokens_cap // block_q + seqs_cap)
        host = (tile_seq, tile_q0, qsl, seq_lens, table, slots)
        if reuse is None:
            bufs = tuple(t.to(device) for t in host)
        else:
            bufs = tuple(reuse.buffers().values())
            for buf, t in zip(bufs, host, strict=True):
                buf.copy_(t)
        tile_seq_b, tile_q0_b, qsl_b, seq_lens_b, table_b, slots_b = bufs
        return TritonAttentionPlan(
            tile_seq_b,
            tile_q0_b,
            qsl_b,
            seq_lens_b,
            table_b,
            slots_b,
            tokens,
            block_m,
            block_q,
            cfg,
        )

    def write_kv(
        self,
        spec: AttentionSpec,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: KVCache,
        plan: TritonAttentionPlan,
    ) -> None:
        from ..cache_write import write_kv

        write_kv(
            key,
            value,
            kv_cache.data,
            plan.slot_mapping,
            float(kv_cache.k_scale),
            float(kv_cache.v_scale),
        )

    def forward(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        kv_cache: KVCache,
        plan: TritonAttentionPlan,
        sinks: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        from ..attention import paged_attention

        cfg = plan.launch
        paged_attention(
            query,
            out,
            kv_cache.data,
            sinks,
            plan.tile_seq,
            plan.tile_q0,
            plan.query_start_loc,
            plan.seq_lens,
            plan.block_table,
            scale=spec.softmax_scale,
            k_scale=float(kv_cache.k_scale) if spec.fp8_kv else 1.0,
            v_scale=float(kv_cache.v_scale) if spec.fp8_kv else 1.0,
            soft_cap=spec.logits_soft_cap,
            window=spec.sliding_window,
            causal=spec.causal,
            block_m=plan.block_m,
            block_q=plan.block_q,
            block_n=cfg.block_n,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )


def _next_pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


def _check_capacity(
    seqs: int, cols: int, tokens: int, seqs_cap: int, blocks_cap: int, tokens_cap: int
) -> None:
    over = []
    if seqs > seqs_cap:
        over.append(f"{seqs} sequences > {seqs_cap}")
    if cols > blocks_cap:
        over.append(f"{cols} blocks per sequence > {blocks_cap}")
    if tokens > tokens_cap:
        over.append(f"{tokens} tokens > {tokens_cap} slots")
    if over:
        raise ValueError(
            "attention.plan: the batch does not fit the reused plan's buffers ("
            + ", ".join(over)
            + "); plan without reuse (a captured graph must then be captured again)"
        )

"""Paged attention on the CPU: native kernels over torch's ``at::vec`` (``csrc/attention_*``).

The ISA variant (AVX-512, AVX2+FMA, NEON) is chosen from ``DeviceInfo.cpu_flags``; the decision
reason names it, so ``plugin-api doctor`` shows which path runs. Where the CPU has AMX, prefill
tiles of bf16 specs (bf16 or fp8 caches) run as bf16 GEMMs through torch's ``cpublas::brgemm``
(``matrix_path``; the ``PLUGIN_API_ONEDNN_ATTENTION_MATRIX`` setting). ``plan`` splits the step
into work items once (shared by every layer); ``forward`` allocates nothing. The kernels are
torch ops (``_attention_ext``), called by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.contract.graphs import GraphLevel, GraphSupport, unless_refused
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.attention import AttentionBatch, AttentionSpec, KVCache

from . import _attention_ext as ext
from . import cpu_family, settings
from ._attention_ext import BLOCK_MULTIPLE, HEAD_MULTIPLE, MAX_BLOCK_SIZE, MAX_HEAD_SIZE
from .isa import amx
from .settings import ATTENTION_MATRIX, ATTENTION_PREFETCH, MATRIX_MODES, PREFETCH_MODES

# Query rows (tokens x heads per KV head) one work item takes: enough to amortise converting a
# K/V block to fp32, small enough that its scratch stays in L2.
TILE_ROWS = 64
# Query rows per item in the matrix layout: an item gathers and packs the K/V panels of its key
# range itself, so more rows per item share each pack. 256 was fastest of 64-1024 on a Xeon with
# AMX (a 2048-token prefill 1.27-1.45x faster than 64; 2026-12-05-xeon-amx.md).
MATRIX_TILE_ROWS = 256
# A key range is split for parallelism only into parts of at least this many keys.
MIN_SPLIT_KEYS = 512
# KV-cache dtypes of the matrix layout (its query is bf16)
MATRIX_CACHES = (torch.bfloat16, torch.float8_e4m3fn)


@dataclass(frozen=True, slots=True)
class MatrixPath:
    """Whether prefill tiles (items of ``Limits.rows_layout_min`` or more query rows per KV
    head) run as bf16 GEMMs through torch's ``cpublas::brgemm``, and why. ``engine``: the CPU
    has AMX, so oneDNN's AMX kernels run them (without it, torch's gemm: only ``on`` asks for
    that)."""

    used: bool
    engine: bool
    reason: str


def matrix_path(spec: AttentionSpec, info: DeviceInfo, mode: str) -> MatrixPath:
    if mode not in MATRIX_MODES:
        raise ValueError(f"matrix mode {mode!r} must be one of {MATRIX_MODES}")
    engine = amx(info)
    if mode == "off":
        return MatrixPath(False, engine, f"matrix-engine path off ({ATTENTION_MATRIX}=off)")
    if spec.dtype != torch.bfloat16 or spec.cache_dtype not in MATRIX_CACHES:
        why = "no matrix-engine path for this spec (it takes a bf16 query, a bf16 or fp8 KV cache)"
        return MatrixPath(False, engine, why)
    # an fp8 cache is widened to bf16 per chunk of keys, exactly (every e4m3 value is a bf16),
    # and its P.V takes p as two bf16 terms (attention_matrix.cpp says why)
    how = (
        "p rounded to bf16"
        if spec.cache_dtype == torch.bfloat16
        else "the fp8 cache widened to bf16, p as two bf16 terms"
    )
    if engine:
        return MatrixPath(
            True,
            True,
            "prefill tiles (items of many query rows per KV head) as bf16 GEMMs by "
            f"torch's cpublas::brgemm on AMX (oneDNN), {how}",
        )
    if mode == "on":
        return MatrixPath(
            True,
            False,
            f"prefill tiles as bf16 GEMMs by torch's cpublas::brgemm forced on "
            f"({ATTENTION_MATRIX}=on) without AMX: torch's gemm runs them, {how}",
        )
    return MatrixPath(False, False, "no matrix-engine path: no AMX (amx_tile, amx_bf16) here")


def tile_scores(spec: AttentionSpec, info: DeviceInfo, variant: str) -> str:
    """The decode (dot layout) scores' clause of the decision: on AMX tiles where the
    ``avx512bf16`` variant runs on a CPU with AMX over a bf16 cache with a head size of whole 32s
    (csrc/attention_tiles.h: up to 16 rows per KV head; blocks are whole 16s by admission), else
    nothing."""
    if not (variant == "avx512bf16" and amx(info) and spec.cache_dtype == torch.bfloat16):
        return ""
    if spec.head_size % 32:
        return ""
    return "; decode scores on AMX tiles (S^T = K . Q^T, K rows straight from the cache)"


@dataclass(frozen=True, slots=True)
class PrefetchTarget:
    """The cache level the decode kernels prefetch a request's next KV block into, and why."""

    l1: bool
    reason: str


# (vendor, first family) where "auto" prefetches into L1: measured faster there
# (docs/measurements/cpu-arm-acl/2026-12-04-zen5.md); other CPUs keep L2.
L1_PREFETCH_FROM = ("AuthenticAMD", 26)


def prefetch_target(info: DeviceInfo, mode: str) -> PrefetchTarget:
    if mode not in PREFETCH_MODES:
        raise ValueError(f"prefetch mode {mode!r} must be one of {PREFETCH_MODES}")
    if mode != "auto":
        return PrefetchTarget(
            mode == "l1",
            f"next KV block prefetched into {mode.upper()} ({ATTENTION_PREFETCH}={mode})",
        )
    cpu = cpu_family.of(info)
    vendor, first = L1_PREFETCH_FROM
    if cpu is not None and cpu[0] == vendor and cpu[1] >= first:
        return PrefetchTarget(
            True, f"next KV block prefetched into L1 ({vendor} family {cpu[1]}: measured faster)"
        )
    seen = f"{cpu[0]} family {cpu[1]}" if cpu else "CPU family unknown"
    return PrefetchTarget(False, f"next KV block prefetched into L2 ({seen})")


@dataclass(frozen=True, slots=True)
class CpuAttentionPlan:
    """One step's work items and split-reduction buffers (CPU tensors).

    ``items`` int32 ``[U, Limits.item_fields]``: (sequence, first KV head, KV heads, first query
    token, query tokens, position of the first query, key begin, key end, partial row or -1).
    ``reduce`` int32 ``[E, Limits.reduce_fields]``: first query token, query tokens, first KV
    head, KV heads, first partial row and split count of each split tile. ``partial_acc`` fp32
    ``[P, head_size]`` and ``partial_ml`` fp32 ``[P, 2]`` hold unnormalised split results.
    """

    items: torch.Tensor
    reduce: torch.Tensor
    partial_acc: torch.Tensor
    partial_ml: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor
    num_tokens: int
    matrix: bool  # prefill tiles take the matrix layout (MatrixPath.used)
    ahead_l1: bool  # decode prefetches go to L1 (PrefetchTarget.l1)


def _machine_isa() -> ext.IsaPath | None:
    return ext.isa_path(cpu_family.host())


def _extension() -> ext.Kernels:
    isa = _machine_isa()
    if isa is None:  # supports() rejected this machine already; reaching here is a host bug
        raise RuntimeError("cpu-arm-acl attention: no ISA path fits this CPU")
    return ext.load(isa.name)


class CpuPagedAttention:
    """``matrix``: the ``PLUGIN_API_ONEDNN_ATTENTION_MATRIX`` mode (see ``matrix_path``);
    ``prefetch``: the ``PLUGIN_API_ONEDNN_ATTENTION_PREFETCH`` mode (see ``prefetch_target``)."""

    name = "cpu-paged-attention"
    path = ImplPath.NATIVE

    def __init__(self, matrix: str = "auto", prefetch: str = "auto") -> None:
        if matrix not in MATRIX_MODES:
            raise ValueError(f"CpuPagedAttention(matrix={matrix!r}): one of {MATRIX_MODES}")
        if prefetch not in PREFETCH_MODES:
            raise ValueError(f"CpuPagedAttention(prefetch={prefetch!r}): one of {PREFETCH_MODES}")
        self.matrix = matrix
        self.prefetch = prefetch

    def supports(self, spec: AttentionSpec, info: DeviceInfo) -> Decision:
        reasons = []
        isa = ext.isa_path(info)
        if isa is None:
            wanted = "; ".join(f"{i.name}: {' '.join(sorted(i.needs))}" for i in ext.ISA_PATHS)
            reasons.append(f"{info.machine} CPU without a supported vector ISA (needs {wanted})")
        if spec.dcp_size > 1:
            reasons.append(
                f"dcp_size={spec.dcp_size}: decode context parallelism spans ranks; these "
                "kernels attend over one process's cache"
            )
        if spec.q_dtype != spec.dtype:
            reasons.append(
                f"query_dtype={spec.q_dtype} differs from dtype={spec.dtype}: no fp8-query path"
            )
        if spec.head_size % HEAD_MULTIPLE or spec.head_size > MAX_HEAD_SIZE:
            reasons.append(
                f"head_size={spec.head_size}: the kernels take multiples of {HEAD_MULTIPLE} up "
                f"to {MAX_HEAD_SIZE} (whole vectors on every ISA path)"
            )
        if spec.block_size % BLOCK_MULTIPLE or spec.block_size > MAX_BLOCK_SIZE:
            reasons.append(
                f"block_size={spec.block_size}: the kernels take multiples of {BLOCK_MULTIPLE} "
                f"up to {MAX_BLOCK_SIZE}"
            )
        if reasons:
            return Decision.reject(*reasons)
        assert isa is not None
        return Decision.accept(
            f"native {isa.name} path: {isa.summary}, online softmax over blocks, "
            f"split by (request, KV head, context); "
            f"{prefetch_target(info, self.prefetch).reason}; "
            f"{matrix_path(spec, info, self.matrix).reason}" + tile_scores(spec, info, isa.name)
        )

    def graph_support(self, spec: AttentionSpec, info: DeviceInfo) -> GraphSupport:
        return unless_refused(
            self.supports(spec, info),
            lambda: GraphSupport(
                GraphLevel.NEVER,
                "CPU kernels: there is no CUDA graph to capture, every step runs eagerly",
            ),
        )

    def plan(
        self, spec: AttentionSpec, batch: AttentionBatch, device: torch.device, reuse: object
    ) -> CpuAttentionPlan:
        ops = _extension().ops
        matrix = matrix_path(spec, cpu_family.host(), self.matrix)
        if matrix.used and matrix.engine and not ops.matrix_engine():
            # the CPU flags show AMX, yet torch's oneDNN will not pack for it (oneDNN disabled in
            # torch.backends.mkldnn, or its ISA capped by ONEDNN_MAX_CPU_ISA): the GEMMs would
            # quietly run on torch's slow gemm instead
            raise RuntimeError(
                "cpu-arm-acl attention: this CPU has AMX but torch's oneDNN ukernel does not pack "
                "for it (torch.backends.mkldnn disabled, or ONEDNN_MAX_CPU_ISA below AMX?); set "
                f"{ATTENTION_MATRIX}=off to run the vector kernels, or =on to accept torch's gemm"
            )
        n = batch.num_seqs
        tokens = int(batch.query_start_loc[n].item()) if n else 0
        # The plan owns copies of the tables its kernels trust (the host checked these values
        # against the cache): a caller refilling its batch tensors before run() cannot send
        # the kernels out of bounds. Only the block-table columns the sequences reach.
        seq_lens = batch.seq_lens.clone(memory_format=torch.contiguous_format)
        bs = spec.block_size
        cols = -(-int(seq_lens.max().item()) // bs) if n else 0
        block_table = batch.block_table[:, : max(cols, 1)].clone(
            memory_format=torch.contiguous_format
        )
        items, reduce, rows = ops.plan(
            query_start_loc=batch.query_start_loc.contiguous(),
            seq_lens=seq_lens,
            num_seqs=n,
            group=spec.num_heads // spec.num_kv_heads,
            kv_heads=spec.num_kv_heads,
            block_size=spec.block_size,
            causal=spec.causal,
            window=spec.sliding_window or 0,
            num_threads=torch.get_num_threads(),
            tile_rows=MATRIX_TILE_ROWS if matrix.used else TILE_ROWS,
            min_split_keys=MIN_SPLIT_KEYS,
        )
        return CpuAttentionPlan(
            items=items,
            reduce=reduce,
            partial_acc=torch.empty((rows, spec.head_size), dtype=torch.float32),
            partial_ml=torch.empty((rows, 2), dtype=torch.float32),
            block_table=block_table,
            seq_lens=seq_lens,
            slot_mapping=batch.slot_mapping[:tokens].clone(memory_format=torch.contiguous_format),
            num_tokens=tokens,
            matrix=matrix.used,
            ahead_l1=prefetch_target(cpu_family.host(), self.prefetch).l1,
        )

    def write_kv(
        self,
        spec: AttentionSpec,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: KVCache,
        plan: CpuAttentionPlan,
    ) -> None:
        _extension().ops.write_kv(
            key=key,
            value=value,
            kv_cache=kv_cache.data,
            slot_mapping=plan.slot_mapping,
            num_tokens=plan.num_tokens,
            k_scale=float(kv_cache.k_scale),
            v_scale=float(kv_cache.v_scale),
        )

    def forward(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        kv_cache: KVCache,
        plan: CpuAttentionPlan,
        sinks: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """The kernels read ``query`` where it is, rows and heads by stride: the split of a
        fused QKV output needs no copy (the op checks the last dim is contiguous)."""
        _extension().ops.forward(
            query=query,
            kv_cache=kv_cache.data,
            block_table=plan.block_table,
            seq_lens=plan.seq_lens,
            items=plan.items,
            reduce=plan.reduce,
            partial_acc=plan.partial_acc,
            partial_ml=plan.partial_ml,
            sinks=sinks,
            out=out,
            scale=spec.softmax_scale,
            k_scale=float(kv_cache.k_scale),
            v_scale=float(kv_cache.v_scale),
            causal=spec.causal,
            window=spec.sliding_window or 0,
            soft_cap=spec.logits_soft_cap or 0.0,
            matrix=plan.matrix,
            ahead_l1=plan.ahead_l1,
        )


def implementations() -> tuple[CpuPagedAttention]:
    s = settings.read()
    return (CpuPagedAttention(matrix=s.attention_matrix, prefetch=s.attention_prefetch),)

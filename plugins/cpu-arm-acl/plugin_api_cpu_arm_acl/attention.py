"""Paged attention on the CPU: native kernels over torch's ``at::vec`` (``csrc/attention.cpp``).

The ISA variant (AVX-512, AVX2+FMA, NEON) is chosen from ``DeviceInfo.cpu_flags``; the decision
reason names it, so ``plugin-api doctor`` shows which path runs. Where the CPU has AMX, prefill
tiles of bf16 specs run as bf16 GEMMs through torch's ``cpublas::brgemm`` (``matrix_path``; the
``PLUGIN_API_ONEDNN_ATTENTION_MATRIX`` setting). ``plan`` splits the step into work items once
(shared by every layer); ``forward`` allocates nothing.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.contract.graphs import GraphLevel, GraphSupport
from plugin_api.device_info import DeviceInfo, read_device_info
from plugin_api.ops.attention import FP8, AttentionBatch, AttentionSpec, KVCache

from . import _attention_ext as ext
from . import cpu_family, settings
from .settings import ATTENTION_MATRIX, ATTENTION_PREFETCH, MATRIX_MODES, PREFETCH_MODES

BLOCK_MULTIPLE = 16  # one vector of 16 lanes, two of 8, four of 4: every ISA path
MAX_BLOCK_SIZE = 256
HEAD_MULTIPLE = 16
MAX_HEAD_SIZE = 512
# Query rows (tokens x heads per KV head) one work item takes: enough to amortise converting a
# K/V block to fp32, small enough that its scratch stays in L2.
TILE_ROWS = 64
# A key range is split for parallelism only into parts of at least this many keys.
MIN_SPLIT_KEYS = 512
# dtype codes of the C entry points
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, FP8: 3}
ITEM_FIELDS, REDUCE_FIELDS = 9, 6
# Query rows per KV head from which an item takes the rows layout, or the matrix layout
# (attention.cpp's kRowsLayoutMin).
MATRIX_MIN_ROWS = 16
AMX_FLAGS = frozenset({"amx_tile", "amx_bf16"})


@dataclass(frozen=True, slots=True)
class MatrixPath:
    """Whether prefill tiles (``MATRIX_MIN_ROWS`` or more query rows per KV head) run as bf16
    GEMMs through torch's ``cpublas::brgemm``, and why. ``engine``: the CPU has AMX, so oneDNN's
    AMX kernels run them (without it, torch's gemm: only ``on`` asks for that)."""

    used: bool
    engine: bool
    reason: str


def matrix_path(spec: AttentionSpec, info: DeviceInfo, mode: str) -> MatrixPath:
    if mode not in MATRIX_MODES:
        raise ValueError(f"matrix mode {mode!r} must be one of {MATRIX_MODES}")
    engine = info.cpu_flags >= AMX_FLAGS
    if mode == "off":
        return MatrixPath(False, engine, f"matrix-engine path off ({ATTENTION_MATRIX}=off)")
    if not (spec.dtype == spec.cache_dtype == torch.bfloat16):
        why = "no matrix-engine path for this spec (it takes a bf16 query and bf16 KV cache)"
        return MatrixPath(False, engine, why)
    if engine:
        return MatrixPath(
            True,
            True,
            f"prefill tiles ({MATRIX_MIN_ROWS}+ query rows per KV head) as bf16 GEMMs by "
            "torch's cpublas::brgemm on AMX (oneDNN), p rounded to bf16",
        )
    if mode == "on":
        return MatrixPath(
            True,
            False,
            f"prefill tiles as bf16 GEMMs by torch's cpublas::brgemm forced on "
            f"({ATTENTION_MATRIX}=on) without AMX: torch's gemm runs them",
        )
    return MatrixPath(False, False, "no matrix-engine path: no AMX (amx_tile, amx_bf16) here")


@dataclass(frozen=True, slots=True)
class PrefetchTarget:
    """The cache level the decode kernels prefetch a request's next KV block into, and why."""

    l1: bool
    reason: str


# (vendor, first family) where "auto" prefetches into L1, from cold decodes at batch 8-16 x 4k
# with 8 KV heads (A/B in one process): Zen 5 (AMD family 26) took 0.82-0.85x the time of L2.
# The Zen 4 (family 25) took 1.08-1.38x with L1 (an earlier kernel); other CPUs are unmeasured
# and keep L2.
L1_PREFETCH_FROM = ("AuthenticAMD", 26)


def prefetch_target(info: DeviceInfo, mode: str) -> PrefetchTarget:
    if mode not in PREFETCH_MODES:
        raise ValueError(f"prefetch mode {mode!r} must be one of {PREFETCH_MODES}")
    if mode != "auto":
        return PrefetchTarget(
            mode == "l1",
            f"next KV block prefetched into {mode.upper()} ({ATTENTION_PREFETCH}={mode})",
        )
    cpu = cpu_family.parse(info.fact(cpu_family.FACT))
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

    ``items`` int32 ``[U, 8]``: (sequence, KV head, first query row, query rows, position of the
    first query, key begin, key end, partial row or -1). ``reduce`` int32 ``[E, 5]``: query rows,
    KV head, first partial row and split count of each split tile. ``partial_acc`` fp32
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


@functools.cache
def _machine() -> DeviceInfo:
    # reads /proc/cpuinfo and package metadata: once, not per step
    return read_device_info().with_facts(cpu_family.facts())


def _machine_isa() -> ext.IsaPath | None:
    return ext.isa_path(_machine())


def _extension() -> ctypes.CDLL:
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
            f"{matrix_path(spec, info, self.matrix).reason}"
        )

    def graph_support(self, spec: AttentionSpec, info: DeviceInfo) -> GraphSupport:
        return GraphSupport(
            GraphLevel.NEVER,
            "CPU kernels: there is no CUDA graph to capture, every step runs eagerly",
        )

    def plan(
        self, spec: AttentionSpec, batch: AttentionBatch, device: torch.device, reuse: object
    ) -> CpuAttentionPlan:
        lib = _extension()
        matrix = matrix_path(spec, _machine(), self.matrix)
        if matrix.used and matrix.engine and not lib.pa_attn_matrix_engine():
            # the CPU flags show AMX, yet torch's oneDNN will not pack for it (oneDNN disabled in
            # torch.backends.mkldnn, or its ISA capped by ONEDNN_MAX_CPU_ISA): the GEMMs would
            # quietly run on torch's slow gemm instead
            raise RuntimeError(
                "cpu-arm-acl attention: this CPU has AMX but torch's oneDNN ukernel does not pack "
                "for it (torch.backends.mkldnn disabled, or ONEDNN_MAX_CPU_ISA below AMX?); set "
                f"{ATTENTION_MATRIX}=off to run the vector kernels, or =on to accept torch's gemm"
            )
        tokens = batch.num_tokens if batch.num_seqs else 0
        qsl = batch.query_start_loc.contiguous()
        seq_lens = batch.seq_lens.contiguous()
        args = (
            qsl.data_ptr(),
            seq_lens.data_ptr(),
            batch.num_seqs,
            spec.num_heads // spec.num_kv_heads,
            spec.num_kv_heads,
            spec.block_size,
            int(spec.causal),
            spec.sliding_window or 0,
            torch.get_num_threads(),
            TILE_ROWS,
            MIN_SPLIT_KEYS,
        )
        counts = torch.zeros(3, dtype=torch.int64)
        lib.pa_attn_plan(*args, counts.data_ptr(), None, None)  # sizes first
        n_items, n_reduce, rows = counts.tolist()
        items = torch.empty((n_items, ITEM_FIELDS), dtype=torch.int32)
        reduce = torch.empty((n_reduce, REDUCE_FIELDS), dtype=torch.int32)
        lib.pa_attn_plan(*args, counts.data_ptr(), items.data_ptr(), reduce.data_ptr())
        return CpuAttentionPlan(
            items=items,
            reduce=reduce,
            partial_acc=torch.empty((rows, spec.head_size), dtype=torch.float32),
            partial_ml=torch.empty((rows, 2), dtype=torch.float32),
            block_table=batch.block_table.contiguous(),
            seq_lens=seq_lens,
            slot_mapping=batch.slot_mapping.contiguous(),
            num_tokens=tokens,
            matrix=matrix.used,
            ahead_l1=prefetch_target(_machine(), self.prefetch).l1,
        )

    def write_kv(
        self,
        spec: AttentionSpec,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: KVCache,
        plan: CpuAttentionPlan,
    ) -> None:
        rc = _extension().pa_attn_write_kv(
            key.data_ptr(),
            value.data_ptr(),
            DTYPE_CODES[spec.dtype],
            key.stride(0),
            key.stride(1),
            value.stride(0),
            value.stride(1),
            kv_cache.data.data_ptr(),
            DTYPE_CODES[spec.cache_dtype],
            plan.slot_mapping.data_ptr(),
            plan.num_tokens,
            spec.num_kv_heads,
            spec.head_size,
            spec.block_size,
            float(kv_cache.k_scale),
            float(kv_cache.v_scale),
        )
        _check(rc, "write_kv")

    def forward(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        kv_cache: KVCache,
        plan: CpuAttentionPlan,
        sinks: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        rc = _extension().pa_attn_forward(
            query.data_ptr(),
            kv_cache.data.data_ptr(),
            DTYPE_CODES[spec.dtype],
            DTYPE_CODES[spec.cache_dtype],
            plan.block_table.data_ptr(),
            plan.block_table.stride(0),
            plan.seq_lens.data_ptr(),
            plan.items.data_ptr(),
            plan.items.shape[0],
            plan.reduce.data_ptr(),
            plan.reduce.shape[0],
            plan.partial_acc.data_ptr(),
            plan.partial_ml.data_ptr(),
            None if sinks is None else sinks.data_ptr(),
            out.data_ptr(),
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_size,
            spec.block_size,
            spec.softmax_scale,
            float(kv_cache.k_scale),
            float(kv_cache.v_scale),
            int(spec.causal),
            spec.sliding_window or 0,
            spec.logits_soft_cap or 0.0,
            int(plan.matrix),
            int(plan.ahead_l1),
        )
        _check(rc, "forward")


def _check(rc: int, what: str) -> None:
    if rc == -2:  # torch's brgemm or pack raised inside the kernels
        error = _extension().pa_attn_last_error().decode(errors="replace")
        raise RuntimeError(f"cpu-arm-acl attention {what}: {error}")
    if rc != 0:  # the host validated dtypes, so this is a bug, not bad input
        raise RuntimeError(f"cpu-arm-acl attention {what}: the kernel rejected a dtype code")


def implementations() -> tuple[CpuPagedAttention]:
    s = settings.read()
    return (CpuPagedAttention(matrix=s.attention_matrix, prefetch=s.attention_prefetch),)

"""Paged attention through FlashInfer: decode rows by XQA (SM90/SM12x) or trtllm-gen (SM100),
prefill rows by the FA2 paged prefill (its sink-aware variant when the spec has sinks). With an
fp8 cache on SM90/SM12x every row goes through the FA2 prefill (``rules.decode_kernel``). The
K/V write is one launch of the host's Triton kernel over the plan's slots.

``plan`` runs once per step on the host batch (no device sync); ``forward`` per layer only
launches kernels on plan buffers, so decode steps can be captured in CUDA graphs at the level
``cudagraph_support`` states.

A strided query (the split of a fused QKV output) goes to the FA2 prefill as it is: it reads
rows and heads by stride. The decode kernels read the query as dense ``[rows, H, D]`` (XQA
takes a bare pointer; trtllm-gen is given the same dense rows), so ``forward`` copies the decode
rows to a dense tensor when they are not, and names the copy (``note_kernel``,
``DENSE_DECODE_QUERY``). KV-sharing layers arrive with ``key=None, value=None``: the host
skips ``write_kv`` and nothing here reads K/V, so no placeholder is ever made.

FlashInfer keeps a prefill plan inside its wrapper object, so each plan chain owns one wrapper:
``plan(reuse=previous)`` re-plans the previous wrapper, a plan without ``reuse`` makes a new one
(two live plans never share planning state).
"""

from __future__ import annotations

import threading

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.contract.graphs import GraphSupport
from plugin_api.contract.provenance import note_kernel
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.attention import AttentionBatch, AttentionSpec, KVCache

from . import calls, metadata
from .cudagraph import cudagraph_support
from .metadata import FlashInferPlan
from .rules import ARCH_OF_MAJOR, Arch, attention_decision, decodes_in_prefill

# FlashInfer scratch: XQA takes 8 MiB of semaphores (zeroed once, kernels reset them) plus
# split-KV scratch; the FA2 prefill its split-KV partial outputs. Shared by layers and specs.
DECODE_WORKSPACE_BYTES = 256 << 20
PREFILL_WORKSPACE_BYTES = 256 << 20


class _Workspaces:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bufs: dict[tuple[str, str], torch.Tensor] = {}

    def get(self, kind: str, device: torch.device, nbytes: int) -> torch.Tensor:
        key = (kind, str(device))
        with self._lock:
            if key not in self._bufs:
                self._bufs[key] = torch.zeros(nbytes, dtype=torch.uint8, device=device)
            return self._bufs[key]


WORKSPACES = _Workspaces()

# what ``note_kernel`` records when the decode rows of a strided query are copied to dense rows
DENSE_DECODE_QUERY = "cuda-sm90 attention: a strided query's decode rows copied to dense rows"


def dense_decode_rows(query: torch.Tensor, rows: int) -> torch.Tensor:
    """``query[:rows]`` as the decode kernels read it: dense ``[rows, H, D]`` (a copy, noted
    with ``note_kernel``, only when the rows are strided)."""
    q = query if query.shape[0] == rows else query[:rows]
    if q.is_contiguous():
        return q
    note_kernel(DENSE_DECODE_QUERY)
    return q.contiguous()


class FlashInferAttention:
    name = "flashinfer"
    path = ImplPath.NATIVE

    def __init__(self) -> None:
        self._arch: dict[torch.device, Arch] = {}

    def supports(self, spec: AttentionSpec, info: DeviceInfo) -> Decision:
        return attention_decision(spec, info)

    def graph_support(self, spec: AttentionSpec, info: DeviceInfo) -> GraphSupport:
        return cudagraph_support(spec, info)

    def _arch_of(self, device: torch.device) -> Arch:
        arch = self._arch.get(device)  # per layer: keyed by the device itself, no str()
        if arch is None:
            major = torch.cuda.get_device_capability(device)[0]
            arch = ARCH_OF_MAJOR.get(major)
            if arch is None:
                raise RuntimeError(f"cuda-sm90: {device} has compute capability {major}.x")
            self._arch[device] = arch
        return arch

    def plan(
        self,
        spec: AttentionSpec,
        batch: AttentionBatch,
        device: torch.device,
        reuse: FlashInferPlan | None,
    ) -> FlashInferPlan:
        in_prefill = decodes_in_prefill(spec, self._arch_of(device))
        plan = metadata.build_plan(spec, batch, device, reuse, decodes_in_prefill=in_prefill)
        if plan.prefill is not None:
            if plan.prefill_wrapper is None:
                ws = WORKSPACES.get("prefill", device, PREFILL_WORKSPACE_BYTES)
                plan.prefill_wrapper = calls.prefill_wrapper_call(spec, ws).invoke()
            calls.prefill_plan_call(spec, plan.prefill, plan.prefill_wrapper).invoke()
        if plan.decode is not None and plan.decode_workspace is None:
            plan.decode_workspace = WORKSPACES.get("decode", device, DECODE_WORKSPACE_BYTES)
        return plan

    def write_kv(
        self,
        spec: AttentionSpec,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: KVCache,
        plan: FlashInferPlan,
    ) -> None:
        metadata.write_kv(key, value, kv_cache.data, kv_cache.k_scale, kv_cache.v_scale, plan.bufs)

    def forward(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        kv_cache: KVCache,
        plan: FlashInferPlan,
        sinks: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        if plan.decode is not None:
            ws = plan.decode_workspace
            if ws is None:  # a plan made by metadata.build_plan alone
                ws = WORKSPACES.get("decode", query.device, DECODE_WORKSPACE_BYTES)
            arch = self._arch_of(query.device)
            # the decode call covers the first decode_rows rows of whatever query it is given
            q = dense_decode_rows(query, plan.decode_rows(query.shape[0]))
            calls.decode_call(spec, arch, plan, q, kv_cache, sinks, out, ws).invoke()
        if plan.prefill is not None:
            calls.prefill_run_call(
                spec, plan.prefill, plan.prefill_wrapper, query, kv_cache, sinks, out
            ).invoke()


def implementations() -> tuple[FlashInferAttention]:
    return (FlashInferAttention(),)

"""Every FlashInfer call this plugin makes, as data: the target's dotted name and the exact
arguments. The attention implementation invokes these; the tests bind the same objects to
the installed FlashInfer's ``inspect.signature``, so an API drift fails a test, not a GPU run.

Only ``import_target`` imports flashinfer, and only when a call is made or checked.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from plugin_api.ops.attention import AttentionSpec, KVCache

from .metadata import FlashInferPlan, PrefillStep
from .rules import Arch

XQA_DECODE = "flashinfer.decode.xqa_batch_decode_with_kv_cache"
TRTLLM_DECODE = "flashinfer.decode.trtllm_batch_decode_with_kv_cache"
PREFILL = "flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper"
SINK_PREFILL = "flashinfer.attention.BatchAttentionWithAttentionSinkWrapper"
KV_LAYOUT = "HND"  # the host cache is [blocks, 2, kv_heads, block_size, head_size]
PREFILL_BACKEND = "fa2"  # the FA2 kernels (and their sink variant) are the validated prefill


@dataclass(frozen=True)
class Call:
    """``target(*args, **kwargs)``; a ``method`` is called on ``receiver`` (a wrapper)."""

    target: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    method: str | None = None
    receiver: Any = None

    def function(self) -> Callable[..., Any]:
        obj = import_target(self.target)
        fn: Callable[..., Any] = getattr(obj, self.method) if self.method else obj
        return fn

    def invoke(self) -> Any:
        if self.method is None:
            return import_target(self.target)(*self.args, **self.kwargs)
        if self.receiver is None:
            raise RuntimeError(f"{self.target}.{self.method}: no wrapper to call it on")
        return getattr(self.receiver, self.method)(*self.args, **self.kwargs)


def import_target(target: str) -> Any:
    """Import ``a.b.C`` or ``a.b.f`` from its module."""
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def window_left(spec: AttentionSpec) -> int:
    """FlashInfer's inclusive left window: a window of W tokens (itself included) is W - 1."""
    return -1 if spec.sliding_window is None else spec.sliding_window - 1


def decode_call(
    spec: AttentionSpec,
    arch: Arch,
    plan: FlashInferPlan,
    query: torch.Tensor,
    kv_cache: KVCache,
    sinks: torch.Tensor | None,
    out: torch.Tensor,
    workspace: torch.Tensor,
) -> Call:
    """The decode kernel call for the plan's decode rows (XQA, or trtllm-gen on SM100).

    What depends only on the spec and the plan (buffer views, lengths, mask, window) is made
    once per step and query row count, on the first layer (``plan.decode_fixed``); each call
    adds the layer's query, cache, scales, output, sinks and the workspace."""
    rows = plan.decode_rows(query.shape[0])
    fixed = plan.decode_fixed.get((arch, rows))
    if fixed is None:
        fixed = plan.decode_fixed[(arch, rows)] = _decode_fixed(spec, arch, plan, rows)
    target, kwargs = fixed
    return Call(
        target,
        kwargs=dict(
            kwargs,
            query=query if query.shape[0] == rows else query[:rows],
            kv_cache=kv_cache.data,
            workspace_buffer=workspace,
            bmm1_scale=spec.softmax_scale * kv_cache.k_scale,
            bmm2_scale=kv_cache.v_scale,
            out=out if out.shape[0] == rows else out[:rows],
            sinks=sinks,
        ),
    )


def _decode_fixed(
    spec: AttentionSpec, arch: Arch, plan: FlashInferPlan, rows: int
) -> tuple[str, dict[str, Any]]:
    """The decode call's target and the arguments every layer of the step shares."""
    d = plan.decode
    assert d is not None
    batch = plan.decode_requests(rows)
    b = plan.bufs
    kwargs: dict[str, Any] = dict(
        block_tables=b.block_table[:batch],
        seq_lens=b.seq_lens[:batch],
        max_seq_len=plan.capacity.blocks_per_seq * spec.block_size,
        window_left=window_left(spec),
        kv_layout=KV_LAYOUT,
        q_len_per_req=d.q_len_per_req,
    )
    if arch is Arch.SM100:
        kwargs["backend"] = "trtllm-gen"
        if d.ragged:
            kwargs.update(max_q_len=d.q_len_per_req, cum_seq_lens_q=b.q_cu_seq_lens[: batch + 1])
            kwargs["q_len_per_req"] = None
        return TRTLLM_DECODE, kwargs
    if d.needs_mask:
        width = 2 * -(-d.q_len_per_req // 32)
        mask = b.mask[: rows * width // 2].view(torch.uint16).view(rows, width)
        kwargs["mask"] = mask if d.ragged else mask.view(batch, d.q_len_per_req, width)
    if d.ragged:
        kwargs["q_cu_seq_lens"] = b.q_cu_seq_lens[: batch + 1]
    return XQA_DECODE, kwargs


def prefill_wrapper_call(spec: AttentionSpec, workspace: torch.Tensor) -> Call:
    """The prefill wrapper's constructor: the sink-aware variant iff the spec has sinks (the
    plain wrapper accepts ``sinks`` at run time and drops them on FA2/FA3). With an fp8 cache
    on SM90/SM12x it runs every row of the step (``rules.decode_kernel``)."""
    kwargs: dict[str, Any] = dict(
        float_workspace_buffer=workspace, kv_layout=KV_LAYOUT, backend=PREFILL_BACKEND
    )
    if not spec.has_sinks:
        return Call(PREFILL, kwargs=kwargs)
    kwargs.update(
        q_data_type=spec.q_dtype,
        kv_data_type=spec.cache_dtype,
        head_dim_qk=spec.head_size,
        head_dim_vo=spec.head_size,
        window_left=window_left(spec),
    )
    return Call(SINK_PREFILL, kwargs=kwargs)


def prefill_plan_call(spec: AttentionSpec, step: PrefillStep, wrapper: Any) -> Call:
    """``wrapper.plan(...)`` with CPU page metadata (FlashInfer copies it, no sync); the query
    and output in the model dtype, the cache's dtype for K/V (the FA2 kernel casts an fp8 K/V
    tile to the query's dtype before its fp16/bf16 MMAs)."""
    return Call(
        SINK_PREFILL if spec.has_sinks else PREFILL,
        method="plan",
        receiver=wrapper,
        kwargs=dict(
            qo_indptr=step.qo_indptr,
            paged_kv_indptr=step.kv_indptr,
            paged_kv_indices=step.kv_indices,
            paged_kv_last_page_len=step.kv_last_page_len,
            num_qo_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim_qk=spec.head_size,
            page_size=spec.block_size,
            causal=spec.causal,
            sm_scale=spec.softmax_scale,
            window_left=window_left(spec),
            q_data_type=spec.q_dtype,
            kv_data_type=spec.cache_dtype,
            o_data_type=spec.dtype,
        ),
    )


def prefill_run_call(
    spec: AttentionSpec,
    step: PrefillStep,
    wrapper: Any,
    query: torch.Tensor,
    kv_cache: KVCache,
    sinks: torch.Tensor | None,
    out: torch.Tensor,
) -> Call:
    """``wrapper.run(...)`` over the prefill rows; the sink variant takes ``sinks, sm_scale``
    positionally (its JIT module's extra tensor and scalar).

    An fp8 cache passes ``k_scale`` (FlashInfer folds it into sm_scale, the sink variant into
    its positional one) and ``v_scale`` (FlashInfer multiplies ``out`` by it in place, so the
    caller's output view keeps the result)."""
    rows = slice(step.first_row, step.first_row + step.num_rows)
    kwargs: dict[str, Any] = dict(out=out[rows])
    if spec.fp8_kv:
        kwargs.update(k_scale=kv_cache.k_scale, v_scale=kv_cache.v_scale)
    args: tuple[Any, ...] = (query[rows], kv_cache.data)
    if spec.has_sinks:
        args += (sinks, spec.softmax_scale)
    return Call(
        SINK_PREFILL if spec.has_sinks else PREFILL,
        args=args,
        kwargs=kwargs,
        method="run",
        receiver=wrapper,
    )

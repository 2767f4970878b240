"""Which plugin-api implementation serves each layer of a loaded model, and how often it ran.

Read in the worker process (``Worker.plugin_api_report``, reachable through vLLM's
``collective_rpc``) and logged once when the model is loaded.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from vllm.model_executor.layers.attention import Attention as VllmAttentionLayer
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

from .attention import PluginApiAttentionImpl, graph_plans, host_time, step_shapes
from .linear import registered, served


def _entry(kind: str, prov: Any, calls: int) -> dict[str, Any]:
    return {
        "kind": kind,
        "family": prov.family,
        "impl": prov.impl,
        "path": str(prov.path),
        "backend": prov.backend,
        "fallback": bool(prov.fallback),
        "calls": calls,
    }


def collect(model: torch.nn.Module) -> dict[str, Any]:
    """Every attention, linear and LM-head layer of ``model`` with what serves it.

    ``engine_layers`` lists linear layers left on vLLM's own kernels (none is expected);
    ``fallbacks`` lists layers whose plugin-api implementation is a fallback; ``outside`` lists
    layers of a kind plugin-api has no op family for (mixtures of experts), which vLLM runs.
    """
    from plugin_api.selection import process_selection

    layers: dict[str, dict[str, Any]] = {}
    engine: list[str] = []
    outside: list[str] = []
    routes: set[tuple[str, int]] = set()
    for name, module in model.named_modules():
        if isinstance(module, RoutedExperts):
            outside.append(f"{name} (mixture of experts)")
        elif isinstance(module, VllmAttentionLayer):
            impl = module.impl
            if isinstance(impl, PluginApiAttentionImpl):
                entry = _entry("attention", impl.attention.provenance, impl.calls)
                entry["spec"] = impl.spec.describe()
                layers[name] = entry
            else:
                engine.append(f"{name} ({type(impl).__name__})")
        elif (route := served(module)) is not None:
            if route in routes:
                # a wrapper and the layer it wraps (vLLM's LoRA layers: qkv_proj, then
                # qkv_proj.base_layer) reach the same weight: listed once, by the outer name
                continue
            routes.add(route)
            kind, index = route
            w = registered(index)
            if w.packed is None:
                continue  # an embedding never used as the LM head: no GEMM ran on it
            layers[name] = _entry(kind, w.packed.provenance, w.calls)
            layers[name]["spec"] = w.packed.spec.describe()
        elif isinstance(module, LinearBase | VocabParallelEmbedding):
            engine.append(f"{name} ({type(getattr(module, 'quant_method', None)).__name__})")
    resolved = process_selection()
    sel = resolved.selection
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return {
        "backend": sel.backend,
        # a worker takes the first process's selection (PLUGIN_API_SELECTION), never probes
        "selection_reused": resolved.reused,
        "rank": rank,
        "distribution": f"{sel.distribution} {sel.version}",
        "status": str(sel.status),
        "layers": layers,
        "engine_layers": engine,
        "fallbacks": sorted(n for n, e in layers.items() if e["fallback"]),
        "host": host_time(),
        "steps": step_shapes(),
        # plans kept for vLLM's full CUDA graphs of decode steps (none before the KV cache exists)
        "graph_plans": graph_plans(),
        "outside": outside,
    }


def summary(report: dict[str, Any]) -> str:
    """A few lines: per layer kind, the implementations and how many layers each serves."""
    groups: dict[tuple[str, str], int] = collections.Counter()
    for entry in report["layers"].values():
        fb = " (fallback)" if entry["fallback"] else ""
        groups[(entry["kind"], f"{entry['backend']}:{entry['impl']} [{entry['path']}]{fb}")] += 1
    lines = [
        f"plugin-api backend {report['backend']} ({report['distribution']}, {report['status']})"
    ]
    for (kind, impl), count in sorted(groups.items()):
        lines.append(f"  {kind:<9} {impl}: {count} layer(s)")
    if report["engine_layers"]:
        lines.append("  on vLLM's own kernels: " + ", ".join(report["engine_layers"]))
    if report["outside"]:
        lines.append(
            f"  not a plugin-api op family, run by vLLM: {len(report['outside'])} layer(s), "
            + ", ".join(report["outside"][:3])
            + (" ..." if len(report["outside"]) > 3 else "")
        )
    graphs = report["graph_plans"]
    if graphs["full_decode_graph_tokens"]:
        lines.append(
            "  full CUDA graphs of decode steps (up to "
            f"{graphs['full_decode_graph_tokens']} tokens): {graphs['kept']} plan(s) kept, "
            "refilled in place every step"
        )
    if report["fallbacks"]:
        lines.append("  fallbacks: " + ", ".join(report["fallbacks"]))
    else:
        lines.append("  no fallback")
    return "\n".join(lines)

"""The op-level part of the selection report: per example model and layer, the chosen
implementation with every rejected candidate, and the resolved CUDA-graph level (a level above
NEVER on a device without graphs is flagged as a meaningless claim: ``graph.problem``)."""

from __future__ import annotations

from typing import Any

from ..backend import Backend, describe
from ..conformance.graph_claims import meaningless_graph_claim
from ..contract import OpFamily
from ..contract.graphs import CAPTURES, GraphSupport, resolve_model_graph_level
from .model_specs import MODELS, ModelExample


def model_report(backend: Backend, model: ModelExample) -> dict[str, Any]:
    layers = []
    graph_layers: list[tuple[str, GraphSupport]] = []
    for layer in model.layers:
        r = backend.explain(layer.family, layer.spec)
        entry: dict[str, Any] = {
            "name": layer.name,
            "family": str(layer.family),
            "spec": describe(layer.spec),
            "chosen": None,
            "trace": [
                {
                    "impl": c.impl,
                    "backend": c.backend,
                    "fallback": c.fallback,
                    "accepted": c.accepted,
                    "chosen": c.chosen,
                    "reason": c.reason,
                }
                for c in r.trace
            ],
        }
        if r.provenance is not None:
            p = r.provenance
            entry["chosen"] = {
                "impl": p.impl,
                "path": str(p.path),
                "backend": p.backend,
                "fallback": p.fallback,
            }
            if layer.family is OpFamily.ATTENTION and r.chosen is not None:
                g = r.chosen.graph_support(layer.spec, backend.info)
                entry["graph"] = {"level": str(g.level), "reason": g.reason}
                problem = meaningless_graph_claim(backend.device_type, g)
                if problem is not None:
                    entry["graph"]["problem"] = problem
                graph_layers.append((layer.name, g))
        layers.append(entry)
    out: dict[str, Any] = {"model": model.name, "layers": layers}
    if graph_layers:
        m = resolve_model_graph_level(
            graph_layers, num_speculative_tokens=model.num_speculative_tokens
        )
        out["graph"] = {
            "level": str(m.level),
            "limited_by": m.limited_by,
            "reason": m.reason,
            "captures": CAPTURES[m.level],
            "downgrades": list(m.downgrades),
        }
    return out


def ops_report(backend: Backend) -> list[dict[str, Any]]:
    return [model_report(backend, m) for m in MODELS]


def ops_text(backend: Backend, report: list[dict[str, Any]]) -> str:
    lines = [f"ops on {backend.id} ({backend.device_type}), for example models:"]
    for m in report:
        lines.append(f"  {m['model']}")
        for layer in m["layers"]:
            lines.append(f"    {layer['name']:<26} {layer['spec']}")
            for c in layer["trace"]:
                mark = "+" if c["chosen"] else "-"
                fb = " (fallback)" if c["fallback"] else ""
                lines.append(f"      {mark} {c['impl']:<22}{fb} {c['reason']}")
            if "graph" in layer:
                lines.append(f"      graph: {layer['graph']['level']} ({layer['graph']['reason']})")
                if "problem" in layer["graph"]:
                    lines.append(f"      ! {layer['graph']['problem']}")
            if layer["chosen"] is None:
                lines.append("      ! no implementation accepts this layer")
        if "graph" in m:
            g = m["graph"]
            lines.append(f"    CUDA graphs for the model: {g['level']}: {g['captures']}")
            lines.extend(f"      downgrade: {d}" for d in g["downgrades"])
    return "\n".join(lines)

"""Engine integrations installed beside the host (entry-point group ``plugin_api.integrations``).

An integration sits above the host and is never imported by it: its entry point names a light
``status() -> dict[str, str]`` that reports the engine it bridges (``plugin-api doctor`` shows
it). A status hook that fails is reported with its error, not dropped.
"""

from __future__ import annotations

from typing import Any

import importlib_metadata

from .device_info import dist_name_version

GROUP = "plugin_api.integrations"


def integrations() -> list[dict[str, Any]]:
    """One entry per installed integration: its status, or the error its hook raised."""
    out: list[dict[str, Any]] = []
    for ep in sorted(importlib_metadata.entry_points(group=GROUP), key=lambda e: e.name):
        name, version = dist_name_version(ep.dist)
        entry: dict[str, Any] = {"name": ep.name, "distribution": f"{name} {version}"}
        try:
            status = ep.load()()
            entry |= {str(k): str(v) for k, v in dict(status).items()}
        except Exception as e:  # shown in the report with its type, never swallowed
            entry["state"] = f"failed: {type(e).__name__}: {e}"
        out.append(entry)
    return out


def integrations_text(entries: list[dict[str, Any]]) -> str:
    if not entries:
        return "Integrations: none installed (plugin-api-vllm runs vLLM on the selected backend)"
    lines = ["Integrations:"]
    for e in entries:
        detail = "; ".join(
            f"{k.replace('_', ' ')}: {e[k]}"
            for k in ("built_against", "engine", "activates")
            if e.get(k)
        )
        lines.append(f"  {e['name']:<8} {e['distribution']}: {e.get('state', '?')}")
        if detail:
            lines.append(f"           {detail}")
    return "\n".join(lines)

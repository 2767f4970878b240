"""What ``plugin-api doctor`` shows about the bridge (entry point ``plugin_api.integrations``).

Light on purpose: reads package metadata only, never imports vLLM.
"""

from __future__ import annotations

from importlib import metadata

from .versions import BUILT_AGAINST, UnsupportedVllm, check_vllm, supported_range


def status() -> dict[str, str]:
    try:
        bridge = metadata.version("plugin-api-vllm")
    except metadata.PackageNotFoundError:
        bridge = "unknown"
    out = {
        "integration": "vllm",
        "distribution": f"plugin-api-vllm {bridge}",
        "built_against": f"vLLM {BUILT_AGAINST} (supports {supported_range()})",
        "activates": "when PLUGIN_API_BACKEND is set (auto included)",
    }
    try:
        dist, version = check_vllm()
        out["engine"] = f"{dist} {version}"
        out["state"] = "ready"
    except UnsupportedVllm as e:
        out["engine"] = "-"
        out["state"] = f"refused: {e}"
    return out

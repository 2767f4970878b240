"""The ``vllm.platform_plugins`` entry point: decide whether vLLM runs on plugin-api, and on what.

vLLM calls ``activate()`` in every process it starts and swallows what it raises (it logs at
debug level and goes on with its own platform). So ``activate`` never raises: a failure returns
the path of ``RefusedPlatform``, whose construction raises the real error, and vLLM stops with it.
"""

from __future__ import annotations

import logging
import os

from .versions import check_vllm

log = logging.getLogger("vllm.plugin_api")  # vLLM's handlers and level apply

OPT_IN = "PLUGIN_API_BACKEND"
SELECTION = "PLUGIN_API_SELECTION"

# The vLLM platform class each device type runs on (a subclass of vLLM's own for that device).
PLATFORMS = {
    "cpu": "plugin_api_vllm.platforms.cpu.CpuPlatform",
    "cuda": "plugin_api_vllm.platforms.cuda.CudaPlatform",
    "rocm": "plugin_api_vllm.platforms.rocm.RocmPlatform",
    "xpu": "plugin_api_vllm.platforms.xpu.XpuPlatform",
}
REFUSED = "plugin_api_vllm.platforms.refused.RefusedPlatform"

_failure: str | None = None


def failure() -> str | None:
    """Why activation failed in this process, or None."""
    return _failure


def platform_for(backend: str, device_type: str) -> str:
    """The platform class path for a selected backend (ROCm runs on torch's "cuda" device)."""
    key = "rocm" if backend == "rocm" else device_type
    if key not in PLATFORMS:
        raise ValueError(
            f"plugin-api backend {backend!r} runs on device type {device_type!r}; the vLLM "
            f"bridge has platforms for {', '.join(sorted(PLATFORMS))}"
        )
    return PLATFORMS[key]


def activate() -> str | None:
    """vLLM's platform-plugin hook: a platform class path, or None when the user did not opt in.

    Opting in means setting ``PLUGIN_API_BACKEND`` (``auto`` included). The host's selection is
    made once, in the first process, and handed to vLLM's worker processes through
    ``PLUGIN_API_SELECTION`` so that they do not probe again.
    """
    global _failure
    if OPT_IN not in os.environ:
        return None
    try:
        check_vllm()
        from plugin_api import select_backend

        selection = select_backend()
        os.environ[SELECTION] = selection.to_json()
        path = platform_for(selection.backend, selection.device_type)
    except Exception as e:  # every failure is re-raised by RefusedPlatform, never dropped
        _failure = f"{type(e).__name__}: {e}"
        log.error("plugin-api: the vLLM bridge cannot activate: %s", _failure)
        return REFUSED
    log.info(
        "plugin-api: vLLM runs on backend %r (%s %s): %s",
        selection.backend,
        selection.distribution,
        selection.version,
        selection.reason,
    )
    return path

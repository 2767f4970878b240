"""State-block copies on NVIDIA GPUs: the host's portable Triton kernel."""

from __future__ import annotations

from plugin_api.triton.impl import TritonState

from .probe import TRITON


def implementations() -> tuple[TritonState]:
    return (TritonState(TRITON),)

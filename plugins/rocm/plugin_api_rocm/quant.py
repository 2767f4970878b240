"""Per-token-group quantization on AMD GPUs: the host's portable Triton kernel."""

from __future__ import annotations

from plugin_api.triton.impl import TritonQuant

from .probe import TRITON


def implementations() -> tuple[TritonQuant]:
    return (TritonQuant(TRITON),)

"""Attention on Intel GPUs: the host's portable Triton kernels (one launch per mixed batch)."""

from __future__ import annotations

from plugin_api.triton.impl import TritonAttention

from .probe import TRITON


def implementations() -> tuple[TritonAttention]:
    return (TritonAttention(TRITON),)

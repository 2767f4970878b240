"""Attention on AMD GPUs: the host's portable Triton kernels (one launch per mixed batch).

Graph level per spec (``TritonAttention.graph_support``): ``ALWAYS`` where the spec is served and
the ``rocm.graph_capture`` fact shows HIP graphs captured and replayed by the installed torch
(the plan's buffers are fixed and refilled in place); ``NEVER`` with the reason otherwise.
"""

from __future__ import annotations

from plugin_api.triton.impl import TritonAttention

from .probe import TRITON


def implementations() -> tuple[TritonAttention]:
    return (TritonAttention(TRITON),)

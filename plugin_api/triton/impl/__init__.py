"""Implementation objects of the portable Triton kernels, following the host's op protocols.

Light to import (no triton): a plugin builds them with its ``TritonTarget`` and returns them from
``plugin_api_implementations``; the kernel modules load when a kernel first runs.
"""

from ...gpu.triton_target import MIN_TRITON, TritonTarget
from .attention import TritonAttention, TritonAttentionPlan
from .gemm import TritonScaledMm
from .quant import TritonQuant
from .state import TritonState

__all__ = [
    "MIN_TRITON",
    "TritonAttention",
    "TritonAttentionPlan",
    "TritonQuant",
    "TritonScaledMm",
    "TritonState",
    "TritonTarget",
]

"""The accelerator platforms the GPU plugins reach through torch, as data named once.

A platform says which torch device type reaches it, which ``TorchBuild`` field marks a torch
built for it, what its graphs are called, and which distributions bring Triton for it. Plugins
name theirs (``cuda-sm90``: ``CUDA``, ``rocm``: ``ROCM``, ``xpu``: ``XPU``) instead of repeating
these facts. Light: no torch import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..contract.decision import Decision
from ..device_info import DeviceInfo, TorchBuild
from .triton_target import TritonTarget


@dataclass(frozen=True, slots=True)
class Platform:
    name: str  # in reasons: "CUDA", "ROCm", "XPU"
    device_type: str  # the torch device type: "cuda" (also on ROCm), "xpu"
    build_field: str  # the TorchBuild field set in a torch built for it: "cuda", "hip", "xpu"
    graph_name: str  # what a captured graph is called here: "CUDA graph", "HIP graph"
    tritons: tuple[str, ...]  # distributions that provide the ``triton`` module, preferred first

    def built_into(self, build: TorchBuild | None) -> bool:
        """Is ``build`` a torch built for this platform?"""
        return build is not None and bool(getattr(build, self.build_field))

    def triton_target(
        self, graph_capture: Callable[[DeviceInfo], Decision] | None = None
    ) -> TritonTarget:
        """Where the host's Triton kernels run on this platform (see ``TritonTarget``)."""
        return TritonTarget(self.device_type, self.tritons, graph_capture)


# CUDA wheels of torch depend on ``triton``; nightlies on ``pytorch-triton``.
CUDA = Platform("CUDA", "cuda", "cuda", "CUDA graph", ("triton", "pytorch-triton"))
# ROCm wheels depend on ``pytorch-triton-rocm``; AMD's rocm/pytorch images build ``triton``.
# torch reaches HIP devices as "cuda", and torch.cuda.CUDAGraph captures HIP graphs there.
ROCM = Platform("ROCm", "cuda", "hip", "HIP graph", ("pytorch-triton-rocm", "triton"))
XPU = Platform("XPU", "xpu", "xpu", "XPU graph", ("pytorch-triton-xpu", "triton"))

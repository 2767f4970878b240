"""Capturing work in a device graph, the same way on every torch device type that has graphs.

``torch.cuda`` (CUDA and ROCm, where ``CUDAGraph`` captures HIP graphs) and ``torch.xpu`` share
the shape ``Stream``/``stream``/``synchronize``/``graph``; only the graph class differs. Used by
the capture trial that feeds the ``graph_capture`` fact and by the GPU plugins' GPU tests.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

GRAPH_CLASSES = {"cuda": "CUDAGraph", "xpu": "XPUGraph"}


def graph_module(device_type: str) -> ModuleType:
    """``torch.cuda`` or ``torch.xpu``; a ``ValueError`` for device types without graphs."""
    if device_type not in GRAPH_CLASSES:
        raise ValueError(
            f"device_type={device_type!r} has no graph API in torch; "
            f"graphs exist for {sorted(GRAPH_CLASSES)}"
        )
    mod: ModuleType = getattr(torch, device_type)
    return mod


def new_graph(device_type: str) -> Any:
    return getattr(graph_module(device_type), GRAPH_CLASSES[device_type])()


def synchronize(device_type: str) -> None:
    graph_module(device_type).synchronize()


def capture(step: Callable[[], None], device_type: str) -> Any:
    """Run ``step`` once on a side stream (kernel compilation, allocator warm-up), then capture
    it into a new graph and return the graph; ``graph.replay()`` repeats the captured work."""
    mod = graph_module(device_type)
    with mod.stream(mod.Stream()):
        step()
    mod.synchronize()
    graph = new_graph(device_type)
    with mod.graph(graph):
        step()
    return graph

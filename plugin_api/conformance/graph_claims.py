"""Whether a declared CUDA-graph level means anything on the device it is declared for.

A level above ``NEVER`` promises that a captured device graph may replay the step. On a device
type without a graph mechanism in torch (a CPU, for one) nothing is ever captured, so such a
level is a meaningless claim: a runtime that trusted it would plan graph capture where there is
none. ``plugin-api doctor`` reports it per layer and the kit fails on it.
"""

from __future__ import annotations

from ..contract.graphs import GraphLevel, GraphSupport


def graph_device_types() -> tuple[str, ...]:
    """The torch device types that can capture and replay a graph (``gpu.device_graphs``)."""
    from ..gpu.device_graphs import GRAPH_CLASSES

    return tuple(sorted(GRAPH_CLASSES))


def meaningless_graph_claim(device_type: str, support: GraphSupport) -> str | None:
    """Why ``support`` is a meaningless claim on ``device_type``; ``None`` when it is not."""
    if support.level == GraphLevel.NEVER:
        return None
    kinds = graph_device_types()
    if device_type in kinds:
        return None
    return (
        f"meaningless claim: {support.level} on a {device_type} device, which has no graph "
        f"mechanism (torch captures graphs on {', '.join(kinds)} only); declare NEVER there"
    )

"""CUDA-graph support levels, per (device, spec), and the model-wide resolution over layers."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .decision import Decision


class GraphLevel(enum.IntEnum):
    """What batches a captured graph may replay; ordered, a model takes the minimum."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1  # only batches of one-token decodes
    UNIFORM_BATCH = 2  # every request has the same query length (1 + speculative tokens)
    ALWAYS = 3  # any batch, mixed prefill and decode

    def __str__(self) -> str:
        return self.name


# What each level lets a runtime capture, for the report.
CAPTURES = {
    GraphLevel.NEVER: "no full graphs: every step runs eagerly",
    GraphLevel.UNIFORM_SINGLE_TOKEN_DECODE: "full graphs for one-token decode batches only",
    GraphLevel.UNIFORM_BATCH: "full graphs for uniform decode batches, speculative included",
    GraphLevel.ALWAYS: "full graphs for every batch, mixed prefill and decode included",
}


@dataclass(frozen=True, slots=True)
class GraphSupport:
    level: GraphLevel
    reason: str

    def __post_init__(self) -> None:
        if not self.reason:
            raise ValueError("GraphSupport needs a reason")


def unless_refused(served: Decision, level: Callable[[], GraphSupport]) -> GraphSupport:
    """The one rule of every attention implementation's ``graph_support``: a spec its own
    ``supports`` refuses (``served``) is NEVER captured, with the refusal as the reason, since a
    higher level would promise a graph of code that never runs; a served spec gets ``level()``,
    the implementation's own declaration."""
    if not served.ok:
        return GraphSupport(GraphLevel.NEVER, f"not served here: {served.because()}")
    return level()


@dataclass(frozen=True, slots=True)
class ModelGraphSupport:
    """The minimum over a model's layers, which layer forced it, and what that costs."""

    level: GraphLevel
    limited_by: str | None  # layer name, None when every layer allows ALWAYS
    reason: str
    downgrades: tuple[str, ...]


def resolve_model_graph_level(
    layers: Sequence[tuple[str, GraphSupport]], *, num_speculative_tokens: int = 0
) -> ModelGraphSupport:
    """Take the minimum level over ``layers`` (name, support) and explain the downgrade."""
    if not layers:
        raise ValueError("resolve_model_graph_level: layers is empty")
    name, lowest = min(layers, key=lambda item: item[1].level)
    downgrades: list[str] = []
    if lowest.level < GraphLevel.ALWAYS:
        downgrades.append(
            f"mixed prefill/decode batches run without a full graph ({name}: {lowest.reason})"
        )
    if num_speculative_tokens > 0 and lowest.level < GraphLevel.UNIFORM_BATCH:
        downgrades.append(
            f"speculative decode ({num_speculative_tokens} draft tokens) cannot be captured: "
            f"{name} allows only {lowest.level}"
        )
    if lowest.level == GraphLevel.NEVER:
        downgrades.append("decode batches run eagerly too")
    limited = None if lowest.level == GraphLevel.ALWAYS else name
    return ModelGraphSupport(lowest.level, limited, f"{name}: {lowest.reason}", tuple(downgrades))

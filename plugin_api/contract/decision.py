"""Decisions as data: an implementation accepts a spec or rejects it with reasons."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ImplPath(str, enum.Enum):
    """Which kind of code an implementation runs, for provenance and coverage summaries."""

    NATIVE = "native"  # the plugin's own kernel or a vendor library (oneDNN, FlashInfer)
    TRITON = "triton"  # the host's portable Triton kernels
    TORCH = "torch"  # eager torch ops inside a plugin
    REFERENCE = "reference"  # the reference backend (the oracle)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Decision:
    """``ok`` plus the reasons for it. Rejections always carry at least one reason."""

    ok: bool
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.ok and not self.reasons:
            raise ValueError("a rejecting Decision must say why")

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def accept(cls, *reasons: str) -> Decision:
        return cls(True, reasons)

    @classmethod
    def reject(cls, *reasons: str) -> Decision:
        return cls(False, reasons)

    @classmethod
    def all_of(cls, *decisions: Decision) -> Decision:
        """Accept when every part accepts; otherwise reject with every failing reason."""
        failing = tuple(r for d in decisions if not d.ok for r in d.reasons)
        if failing:
            return cls(False, failing)
        return cls(True, tuple(r for d in decisions for r in d.reasons))

    def because(self) -> str:
        return "; ".join(self.reasons)

"""The three cache modes and the properties each one declares.

Callers that depend on a property (an offload connector reading blocks by table position,
prefix registration) check the declaration instead of the mode's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, slots=True)
class ModeTraits:
    """What a mode promises about a request's block table.

    ``positionally_stable``: once a slot is complete (the request's committed tokens reach the
    slot's end) its block never changes and is never nulled while the request lives, so
    ``table[i]`` is the state after ``(i + 1) * block_size`` tokens.
    ``boundary_states``: states at block-aligned token counts can be handed to a prefix cache.
    ``retires``: slots below the committed state are retired after each step.
    """

    positionally_stable: bool
    boundary_states: bool
    retires: bool
    summary: str


class CacheMode(str, Enum):
    ALL = "all"
    ALIGN = "align"
    NONE = "none"

    @property
    def traits(self) -> ModeTraits:
        return _TRAITS[self]

    @property
    def positionally_stable(self) -> bool:
        return _TRAITS[self].positionally_stable


_TRAITS = {
    CacheMode.ALL: ModeTraits(
        positionally_stable=True,
        boundary_states=True,
        retires=False,
        summary="a state per block boundary, kept for the request's life (prefix caching)",
    ),
    CacheMode.ALIGN: ModeTraits(
        positionally_stable=False,  # retired slots are nulled, accepted drafts relocate blocks
        boundary_states=True,
        retires=True,
        summary="only the committed state and in-flight writes; aligned states can be cached",
    ),
    CacheMode.NONE: ModeTraits(
        positionally_stable=False,  # one slot, rewritten in place and swapped on acceptance
        boundary_states=False,
        retires=False,
        summary="one running state per request (plus speculative blocks)",
    ),
}


def parse_mode(value: object) -> CacheMode:
    """``value`` as a ``CacheMode``; the error lists the valid names."""
    if isinstance(value, CacheMode):
        return value
    if not isinstance(value, str):
        raise TypeError(f"mode must be a CacheMode or str, got {type(value).__name__}")
    try:
        return CacheMode(value)
    except ValueError:
        valid = ", ".join(m.value for m in CacheMode)
        raise ValueError(f"mode={value!r} is not a cache mode; valid: {valid}") from None

"""Which implementation actually ran: every op call is recorded here when a recorder is active."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

from .decision import ImplPath


@dataclass(frozen=True, slots=True)
class Provenance:
    """The implementation behind a resolved op: its name, kind of code, and whether it is a
    fallback (an implementation outside the selected backend)."""

    family: str
    impl: str
    path: ImplPath
    backend: str
    fallback: bool = False

    def __str__(self) -> str:
        fb = " (fallback)" if self.fallback else ""
        return f"{self.family}: {self.impl} [{self.path}]{fb}"


_recorders: contextvars.ContextVar[tuple[list[Provenance], ...]] = contextvars.ContextVar(
    "plugin_api_recorders", default=()
)


def note(p: Provenance) -> None:
    """Record one op call on every active recorder (cheap when none is active)."""
    for calls in _recorders.get():
        calls.append(p)


@contextlib.contextmanager
def record_ops() -> Iterator[list[Provenance]]:
    """Collect the provenance of every op call made inside the block.

    >>> with record_ops() as calls:
    ...     per_token_group_quant(x, 128)
    >>> calls[0].path
    """
    calls: list[Provenance] = []
    token = _recorders.set((*_recorders.get(), calls))
    try:
        yield calls
    finally:
        _recorders.reset(token)

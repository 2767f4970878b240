"""Which implementation actually ran: every op call is recorded here when a recorder is active."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

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


T = TypeVar("T")

_recorders: contextvars.ContextVar[tuple[list[Provenance], ...]] = contextvars.ContextVar(
    "plugin_api_recorders", default=()
)


def note(p: Provenance) -> None:
    """Record one op call on every active recorder (cheap when none is active)."""
    for calls in _recorders.get():
        calls.append(p)


def record_ops() -> contextlib.AbstractContextManager[list[Provenance]]:
    """Collect the provenance of every op call made inside the block.

    >>> with record_ops() as calls:
    ...     per_token_group_quant(x, 128)
    >>> calls[0].path
    """
    return _recording(_recorders)


_kernel_recorders: contextvars.ContextVar[tuple[list[str], ...]] = contextvars.ContextVar(
    "plugin_api_kernel_recorders", default=()
)


def note_kernel(name: str) -> None:
    """An implementation names the library kernel a call ran (e.g. the oneDNN implementation a
    primitive got), for whoever records (cheap when no one does)."""
    for names in _kernel_recorders.get():
        names.append(name)


def record_kernels() -> contextlib.AbstractContextManager[list[str]]:
    """Collect the kernel names implementations note (``note_kernel``) inside the block."""
    return _recording(_kernel_recorders)


@contextlib.contextmanager
def _recording(recorders: contextvars.ContextVar[tuple[list[T], ...]]) -> Iterator[list[T]]:
    """A new list on ``recorders`` for the block (nested blocks each get every item)."""
    items: list[T] = []
    token = recorders.set((*recorders.get(), items))
    try:
        yield items
    finally:
        recorders.reset(token)

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


_kernel_recorders: contextvars.ContextVar[tuple[list[str], ...]] = contextvars.ContextVar(
    "plugin_api_kernel_recorders", default=()
)


def note_kernel(name: str) -> None:
    """An implementation names the library kernel a call ran (e.g. the oneDNN implementation a
    primitive got), for whoever records (cheap when no one does)."""
    for names in _kernel_recorders.get():
        names.append(name)


@contextlib.contextmanager
def record_kernels() -> Iterator[list[str]]:
    """Collect the kernel names implementations note (``note_kernel``) inside the block."""
    names: list[str] = []
    token = _kernel_recorders.set((*_kernel_recorders.get(), names))
    try:
        yield names
    finally:
        _kernel_recorders.reset(token)

"""The selected backend at run time: its implementations per op family, and op-level resolution.

For each op family and concrete configuration (a spec), the backend's own implementations are
asked in order; the first that accepts wins. If none does, the reference backend may serve it as
a *fallback*: recorded in the resolution, warned once, and an error under ``PLUGIN_API_STRICT=1``.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .contract import OpFamily
from .contract.decision import Decision
from .contract.provenance import Provenance
from .device_info import DeviceInfo
from .errors import FallbackRefused, UnsupportedSpec
from .registry import REFERENCE_ID
from .selection import LoadedSelection, PluginApiWarning, load_and_select, process_selection
from .settings import Settings, read_settings

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class ImplCandidate:
    impl: Any  # an implementation object: has .name, .path and .supports(spec, info)
    backend: str
    fallback: bool


@dataclass(frozen=True, slots=True)
class ImplVerdict:
    """One line of an op-level trace."""

    impl: str
    backend: str
    fallback: bool
    accepted: bool
    chosen: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Resolution:
    family: OpFamily
    spec: Hashable
    chosen: Any | None
    provenance: Provenance | None
    trace: tuple[ImplVerdict, ...]

    def trace_text(self) -> str:
        lines = []
        for c in self.trace:
            mark = "+" if c.chosen else "-"
            fb = " (fallback)" if c.fallback else ""
            lines.append(f"  {mark} {c.impl:<24}{fb} {c.reason}")
        return "\n".join(lines)


def resolve_op(
    family: OpFamily, spec: Hashable, candidates: Sequence[ImplCandidate], info: DeviceInfo
) -> Resolution:
    """Pure: ask every candidate about ``spec``; the first own acceptance wins, else the first
    accepting fallback. Every candidate appears in the trace with its reason."""
    decisions: list[tuple[ImplCandidate, Decision]] = []
    for c in candidates:
        d = c.impl.supports(spec, info)
        if not isinstance(d, Decision):
            raise TypeError(f"{c.impl.name}.supports returned {type(d).__name__}, not Decision")
        decisions.append((c, d))
    accepted = [c for c, d in decisions if d.ok]
    own = [c for c in accepted if not c.fallback]
    chosen = own[0] if own else (accepted[0] if accepted else None)
    trace = []
    for c, d in decisions:
        if c is chosen:
            why = d.because() or "accepts"
            reason = f"chosen: {why}"
        elif d.ok:
            reason = f"also accepts, lower preference than {chosen.impl.name if chosen else '?'}"
        else:
            reason = d.because()
        trace.append(ImplVerdict(c.impl.name, c.backend, c.fallback, d.ok, c is chosen, reason))
    prov = None
    if chosen is not None:
        prov = Provenance(
            str(family), chosen.impl.name, chosen.impl.path, chosen.backend, chosen.fallback
        )
    return Resolution(family, spec, chosen.impl if chosen else None, prov, tuple(trace))


@dataclass
class Backend:
    """A selected backend, live: resolves ops for specs and caches the answers."""

    selected: LoadedSelection
    _candidates: dict[OpFamily, tuple[ImplCandidate, ...]] = field(default_factory=dict)
    _resolutions: dict[tuple[OpFamily, Hashable], Resolution] = field(default_factory=dict)
    _warned: set[tuple[OpFamily, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def id(self) -> str:
        return self.selected.selection.backend

    @property
    def device_type(self) -> str:
        return self.selected.selection.device_type

    @functools.cached_property
    def device(self) -> torch.device:
        """The torch device the ops run on (made once: building one costs microseconds on
        every call otherwise)."""
        import torch  # not at module level: selecting a backend stays free of torch

        return torch.device(self.device_type)

    @property
    def info(self) -> DeviceInfo:
        return self.selected.registry.info

    @property
    def strict(self) -> bool:
        return self.selected.settings.strict

    def candidates(self, family: OpFamily) -> tuple[ImplCandidate, ...]:
        if family not in self._candidates:
            reg = self.selected.registry
            own = [ImplCandidate(i, self.id, False) for i in reg.implementations(self.id, family)]
            if self.id != REFERENCE_ID and REFERENCE_ID in reg.managers:
                own += [
                    ImplCandidate(i, REFERENCE_ID, True)
                    for i in reg.implementations(REFERENCE_ID, family)
                ]
            self._candidates[family] = tuple(own)
        return self._candidates[family]

    def explain(self, family: OpFamily, spec: Hashable) -> Resolution:
        """The resolution for ``spec`` without raising (for reports)."""
        key = (family, spec)
        # the hit path takes no lock: a dict read is atomic, and entries are never replaced
        hit = self._resolutions.get(key)
        if hit is not None:
            return hit
        with self._lock:
            if key not in self._resolutions:
                self._resolutions[key] = resolve_op(
                    family, spec, self.candidates(family), self.info
                )
            return self._resolutions[key]

    def implementation_for(self, family: OpFamily, spec: Hashable) -> tuple[Any, Provenance]:
        """The implementation to run for ``spec``, or a clear error.

        A fallback is warned once per (family, implementation) and refused when strict.
        """
        r = self.explain(family, spec)
        if r.chosen is None or r.provenance is None:
            raise UnsupportedSpec(
                f"{family}: no implementation of backend {self.id!r} accepts {describe(spec)}:\n"
                + r.trace_text(),
                backend=self.id,
                reasons=tuple(c.reason for c in r.trace),
            )
        if r.provenance.fallback:
            p = r.provenance
            if self.strict:  # nothing fell back: say what was refused
                raise FallbackRefused(
                    f"{family}: backend {self.id!r} does not support {describe(spec)}; "
                    f"refused the fallback to {p.impl} ({p.path}) of backend {p.backend!r}: "
                    f"PLUGIN_API_STRICT=1 forbids fallbacks.\n{r.trace_text()}",
                    backend=self.id,
                )
            msg = (
                f"{family}: backend {self.id!r} does not support {describe(spec)}; falling back "
                f"to {p.impl} ({p.path}).\n{r.trace_text()}"
            )
            key = (family, p.impl)
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(msg, PluginApiWarning, stacklevel=3)
        return r.chosen, r.provenance


def describe(spec: object) -> str:
    d = getattr(spec, "describe", None)
    return d() if callable(d) else repr(spec)


_lock = threading.Lock()
_process_backend: Backend | None = None


def process_backend() -> Backend:
    """The process's backend (``select_backend()``'s choice), created once."""
    global _process_backend
    with _lock:
        if _process_backend is None:
            _process_backend = Backend(process_selection())
        return _process_backend


def backend_for(
    backend_id: str, *, settings: Settings | None = None, info: DeviceInfo | None = None
) -> Backend:
    """A backend chosen explicitly (tests, the conformance kit, what-if reports).

    Raises like ``PLUGIN_API_BACKEND=<id>`` would when it cannot run here.
    """
    base = read_settings() if settings is None else settings
    s = Settings(
        backend=backend_id,
        strict=base.strict,
        plugins=base.plugins,
        probe_timeout=base.probe_timeout,
        check_slot_mapping=base.check_slot_mapping,
    )
    return Backend(load_and_select(s, info))


__all__ = ["Backend", "ImplCandidate", "Resolution", "backend_for", "process_backend", "resolve_op"]

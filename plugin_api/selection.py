"""Choosing the backend: a pure function over plugin records, and the once-per-process shell.

``select(records, settings, info)`` applies DESIGN.md section 3 and returns a ``Selection`` whose
``trace`` has one line per discovered plugin, accepted or rejected with its reason. Errors carry
the same trace, so "no backend" never arrives without the why.
"""

from __future__ import annotations

import difflib
import json
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ._version import HOST_API_VERSION, __version__
from .contract import Status
from .device_info import DeviceInfo, Vendor, installed_version
from .errors import (
    AmbiguousSelection,
    BackendNotInstalled,
    BackendUnavailable,
    SelectionError,
    StaleSelection,
)
from .registry import REFERENCE_ID, PluginRecord, Registry, load_plugins
from .settings import Settings, check_names, read_settings


class PluginApiWarning(UserWarning):
    """Something the user should know once per process: experimental backend, op fallback."""


@dataclass(frozen=True, slots=True)
class PluginVerdict:
    """One line of the selection trace."""

    id: str
    state: str  # validated / experimental / unavailable / failed / excluded
    chosen: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Selection:
    """The chosen backend and why. Serialisable, so workers reuse it instead of re-probing."""

    backend: str
    distribution: str
    version: str
    status: Status
    device_type: str
    reason: str
    trace: tuple[PluginVerdict, ...]
    notes: tuple[str, ...] = ()
    strict: bool = False
    host_version: str = __version__
    host_api: str = HOST_API_VERSION
    # the machine the choice was made for (DeviceInfo.to_dict(), plugin facts included):
    # processes reusing the selection decide ops on the same facts without probing again
    device: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Selection:
        try:
            d = json.loads(text)
            d["status"] = Status(d["status"])
            d["trace"] = tuple(PluginVerdict(**c) for c in d["trace"])
            d["notes"] = tuple(d.get("notes", ()))
            return cls(**d)
        except (ValueError, KeyError, TypeError) as e:
            raise StaleSelection(f"PLUGIN_API_SELECTION is not a serialised selection: {e}") from e


# ---- the pure rules ----------------------------------------------------------------------------


def _line(r: PluginRecord) -> str:
    return "; ".join(r.reasons) or r.state


def _trace(
    records: Sequence[PluginRecord], chosen: str | None, why: dict[str, str]
) -> tuple[PluginVerdict, ...]:
    return tuple(
        PluginVerdict(r.id, r.state, r.id == chosen, why.get(r.id, _line(r))) for r in records
    )


def _fmt_trace(trace: Sequence[PluginVerdict]) -> str:
    return "\n".join(
        f"  {'+' if c.chosen else '-'} {c.id:<14} {c.state:<12} {c.reason}" for c in trace
    )


_TARGETS: tuple[tuple[Vendor, str], ...] = (  # (what the machine has, the plugin for it)
    ("nvidia", "cuda-sm90"),
    ("amd", "rocm"),
    ("intel", "xpu"),
)


def _install_hint(info: DeviceInfo, records: Sequence[PluginRecord]) -> str:
    """What would serve this machine better than the reference, and why it is not in use."""
    target = next((pid for vendor, pid in _TARGETS if info.accelerators_of(vendor)), None)
    if target is None and info.machine in ("aarch64", "arm64"):
        target = "cpu-arm-acl"
    if target is None:
        return f"no plugin targets this machine ({info.machine} CPU, no accelerator) as validated"
    rec = next((r for r in records if r.id == target), None)
    if rec is None:
        return f"this machine suits {target}: pip install plugin-api-{target}"
    return f"{target} is installed but {rec.state} here: {_line(rec)}"


def select(records: Sequence[PluginRecord], settings: Settings, info: DeviceInfo) -> Selection:
    """Apply the selection table to ``records``. Raises a ``SelectionError`` with the trace."""
    by_id = {r.id: r for r in records}
    if settings.backend is not None:
        return _select_named(records, by_id, settings)
    plugins = [r for r in records if r.id != REFERENCE_ID]
    validated = [r for r in plugins if r.state == Status.VALIDATED.value]
    experimental = [r.id for r in plugins if r.state == Status.EXPERIMENTAL.value]
    notes: list[str] = [
        f"{e} is experimental here; PLUGIN_API_BACKEND={e} selects it" for e in experimental
    ]
    if validated:
        top = max(r.descriptor.priority for r in validated if r.descriptor)
        best = [r for r in validated if r.descriptor and r.descriptor.priority == top]
        if len(best) > 1:
            names = ", ".join(r.id for r in best)
            raise AmbiguousSelection(
                f"several validated backends share the top priority {top}: {names}. "
                f"Set PLUGIN_API_BACKEND to one of them.\n{_fmt_trace(_trace(records, None, {}))}",
                reasons=tuple(r.id for r in best),
            )
        chosen = best[0]
        why = {
            r.id: f"lower priority ({r.descriptor.priority} < {top})"
            for r in validated
            if r is not chosen and r.descriptor
        }
        why[REFERENCE_ID] = "portable fallback; a validated plugin was found"
        reason = f"auto: the only validated plugin (priority {top})"
        if len(validated) > 1:
            reason = f"auto: highest priority ({top}) among validated plugins"
        return _selection(chosen, records, why, reason, notes, settings)
    ref = by_id.get(REFERENCE_ID)
    if ref is None or ref.state != Status.VALIDATED.value:
        raise SelectionError(
            "no backend can run here, not even the reference (it needs torch).\n"
            + _fmt_trace(_trace(records, None, {})),
        )
    notes.insert(0, _install_hint(info, records))
    return _selection(ref, records, {}, "auto: no plugin is validated here", notes, settings)


def experimental_note(backend_id: str) -> str:
    return f"{backend_id} is experimental on this machine (runs, not validated)"


def _select_named(
    records: Sequence[PluginRecord], by_id: dict[str, PluginRecord], settings: Settings
) -> Selection:
    want = settings.backend
    assert want is not None
    rec = by_id.get(want)
    if rec is None:
        ok = sorted(r.id for r in records if r.state not in ("failed", "excluded"))
        failed = [f"{r.id} ({r.failure.message})" for r in records if r.failure]
        close = difflib.get_close_matches(want, [r.id for r in records], n=1)
        msg = f"PLUGIN_API_BACKEND={want!r} is not installed. Installed: {', '.join(ok)}."
        if failed:
            msg += f" Failed to load: {'; '.join(failed)}."
        if close:
            msg += f" Did you mean {close[0]!r}?"
        raise BackendNotInstalled(msg, backend=want)
    if rec.excluded:
        raise BackendUnavailable(
            f"PLUGIN_API_BACKEND={want!r} is excluded by PLUGIN_API_PLUGINS; add it to the list",
            backend=want,
        )
    if rec.state in ("failed", Status.UNAVAILABLE.value):
        verb = "failed to load" if rec.failure else "is unavailable here"
        reasons = rec.reasons
        detail = "\n".join(f"  - {r}" for r in reasons)
        raise BackendUnavailable(
            f"PLUGIN_API_BACKEND={want!r} {verb} (no fallback is made):\n{detail}",
            backend=want,
            reasons=reasons,
        )
    notes = []
    if rec.state == Status.EXPERIMENTAL.value:
        notes.append(experimental_note(want))
    why = {r.id: "not requested (PLUGIN_API_BACKEND)" for r in records if r is not rec}
    return _selection(rec, records, why, "PLUGIN_API_BACKEND", notes, settings)


def _selection(
    rec: PluginRecord,
    records: Sequence[PluginRecord],
    why: dict[str, str],
    reason: str,
    notes: list[str],
    settings: Settings,
) -> Selection:
    a = rec.availability
    assert a is not None and a.device_type is not None
    why = dict(why)
    why[rec.id] = f"{reason}; {_line(rec)}"
    return Selection(
        backend=rec.id,
        distribution=rec.distribution,
        version=rec.version,
        status=a.status,
        device_type=a.device_type,
        reason=reason,
        trace=_trace(records, rec.id, why),
        notes=tuple(notes),
        strict=settings.strict,
    )


# ---- the process-wide shell ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadedSelection:
    selection: Selection
    registry: Registry
    settings: Settings

    @property
    def reused(self) -> bool:
        """True when this process took a serialised selection and probed nothing."""
        return self.settings.selection_json is not None


_lock = threading.Lock()
_process_selection: LoadedSelection | None = None


def load_and_select(
    settings: Settings | None = None, info: DeviceInfo | None = None
) -> LoadedSelection:
    """Load plugins and select, without touching the process-wide cache (what-if, reports)."""
    settings = read_settings() if settings is None else settings
    registry = load_plugins(settings, info)
    check_names(os.environ, registry.known_settings)
    chosen = select(registry.records, settings, registry.info)
    device = json.loads(registry.info.to_json())  # JSON-normal, so a round trip is equal
    return LoadedSelection(replace(chosen, device=device), registry, settings)


def select_backend() -> Selection:
    """The backend for this process, resolved once (thread-safe) and then reused.

    With ``PLUGIN_API_SELECTION`` set (see ``Selection.to_json``), the serialised choice is
    reused after checking the installed version, and no plugin is probed.
    """
    return process_selection().selection


def process_selection() -> LoadedSelection:
    global _process_selection
    with _lock:
        if _process_selection is None:
            settings = read_settings()
            if settings.selection_json is not None:
                loaded = _reuse(settings)
            else:
                loaded = load_and_select(settings)
                # the process that selected warns; workers reusing its choice stay quiet
                _announce(loaded)
            _process_selection = loaded
        return _process_selection


def passed_over(loaded: LoadedSelection) -> tuple[PluginRecord, ...]:
    """Plugins that automatic selection could not consider because they failed to load, probe
    or conform (an excluded plugin is the user's choice, not a failure)."""
    if loaded.settings.backend is not None:
        return ()
    return tuple(r for r in loaded.registry.records if r.failure is not None)


def _announce(loaded: LoadedSelection) -> None:
    """Once per process: plugins automatic selection passed over (an error under
    ``PLUGIN_API_STRICT=1``), and a chosen backend that is only experimental here."""
    failed = passed_over(loaded)
    lines = [
        f"plugin {r.id!r} ({r.distribution} {r.version}) failed at stage "
        f"{r.failure.stage} after {r.seconds:.2f} s: {r.failure.message}"
        for r in failed
        if r.failure is not None
    ]
    if lines and loaded.settings.strict:
        raise SelectionError(
            "automatic selection would pass over plugins that failed, and PLUGIN_API_STRICT=1 "
            "refuses that:\n"
            + "\n".join(f"  - {line}" for line in lines)
            + "\nFix or uninstall them, leave them out with PLUGIN_API_PLUGINS, or name the "
            "backend with PLUGIN_API_BACKEND.",
            reasons=tuple(lines),
        )
    for line in lines:
        warnings.warn(
            f"{line}; automatic selection passed it over (plugin-api doctor shows why)",
            PluginApiWarning,
            stacklevel=4,
        )
    sel = loaded.selection
    if sel.status == Status.EXPERIMENTAL:
        warnings.warn(experimental_note(sel.backend), PluginApiWarning, stacklevel=4)


def _reuse(settings: Settings) -> LoadedSelection:
    assert settings.selection_json is not None
    sel = Selection.from_json(settings.selection_json)
    if sel.host_api != HOST_API_VERSION:
        raise StaleSelection(
            f"PLUGIN_API_SELECTION was made by host API {sel.host_api}; this is "
            f"{HOST_API_VERSION}. Unset it to select afresh."
        )
    have = installed_version(sel.distribution)
    if sel.backend != REFERENCE_ID and have != sel.version:
        raise StaleSelection(
            f"PLUGIN_API_SELECTION chose {sel.backend} from {sel.distribution} {sel.version}, "
            f"but {have or 'nothing'} is installed. Unset it to select afresh."
        )
    # Load only the chosen plugin; its probe is not run again.
    only = Settings(
        backend=sel.backend,
        strict=settings.strict,
        plugins=frozenset({sel.backend}),
        probe_timeout=settings.probe_timeout,
    )
    if sel.device is None:
        raise StaleSelection(
            "PLUGIN_API_SELECTION carries no device (the machine it was made for); unset it to "
            "select afresh"
        )
    registry = load_plugins(only, DeviceInfo.from_dict(sel.device), probe=False)
    rec = registry.record(sel.backend)
    if rec is None or rec.failure is not None:
        why = rec.failure.message if rec and rec.failure else "not installed"
        raise StaleSelection(f"PLUGIN_API_SELECTION chose {sel.backend}, which failed: {why}")
    check_names(os.environ, registry.known_settings)
    return LoadedSelection(sel, registry, settings)

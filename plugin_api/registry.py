"""Discovering, loading and probing plugins.

Each installed plugin goes through the same stages, and the first one that fails is recorded with
its cause and traceback; nothing is swallowed and no plugin can take the host down:

  discover  entry point in group ``plugin_api.backends``; an id claimed twice is a conflict
  allow     ``PLUGIN_API_PLUGINS`` may exclude it (then nothing of it is imported)
  describe  import the descriptor module, read ``DESCRIPTOR``
  compat    check ``DESCRIPTOR.host_api`` against this host, before any other plugin code runs
  register  import the hooks module and register it with pluggy (signatures validated)
  probe     ``plugin_api_probe(info)``, bounded in time like every stage above
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from importlib import import_module
from typing import Any, TypeVar

import importlib_metadata
import pluggy

from . import hookspecs
from ._version import HOST_API_VERSION, __version__
from .contract import Availability, BackendDescriptor, OpFamily, Status
from .device_info import DeviceInfo, read_device_info
from .errors import SettingError
from .settings import Settings

GROUP = "plugin_api.backends"
REFERENCE_ID = "reference"
_REFERENCE_EP = "plugin_api.reference.descriptor"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a plugin did not load or probe: the stage, a one-line message and the traceback."""

    stage: str
    message: str
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class PluginRecord:
    """Everything the host learnt about one installed plugin. Plain data for reports and tests."""

    id: str
    distribution: str
    version: str
    module: str
    descriptor: BackendDescriptor | None = None
    probe: Availability | None = None  # what the probe said about the hardware
    failure: Failure | None = None
    excluded: bool = False  # left out by PLUGIN_API_PLUGINS
    seconds: float = 0.0  # time spent loading and probing

    @property
    def availability(self) -> Availability | None:
        """The probe's answer, capped to unavailable when the plugin has no kernels yet."""
        if self.probe is None or self.descriptor is None:
            return None
        if self.probe.usable and not self.descriptor.families:
            return Availability.unavailable(
                *self.probe.reasons,
                "provides no op kernels yet (its descriptor lists no op families)",
            )
        return self.probe

    @property
    def state(self) -> str:
        """One word for tables: validated, experimental, unavailable, failed, excluded."""
        if self.excluded:
            return "excluded"
        if self.failure is not None:
            return "failed"
        a = self.availability
        return str(a.status) if a is not None else "not probed"

    @property
    def reasons(self) -> tuple[str, ...]:
        if self.excluded:
            return ("excluded by PLUGIN_API_PLUGINS",)
        if self.failure is not None:
            return (f"{self.failure.stage}: {self.failure.message}",)
        a = self.availability
        return a.reasons if a is not None else ()


@dataclass
class Registry:
    """The loaded plugins of this process: records, plus pluggy managers for the live ones."""

    records: tuple[PluginRecord, ...]
    info: DeviceInfo
    managers: dict[str, pluggy.PluginManager] = field(default_factory=dict)

    def record(self, backend_id: str) -> PluginRecord | None:
        return next((r for r in self.records if r.id == backend_id), None)

    @property
    def known_settings(self) -> tuple[str, ...]:
        return tuple(s for r in self.records if r.descriptor for s in r.descriptor.settings)

    def implementations(self, backend_id: str, family: OpFamily) -> Sequence[object]:
        """Call the plugin's ``plugin_api_implementations`` hook (imports its heavy modules)."""
        rec = self.record(backend_id)
        if rec is None or rec.descriptor is None or backend_id not in self.managers:
            raise KeyError(f"backend {backend_id!r} is not loaded")
        if family not in rec.descriptor.families:
            return ()
        impls = self.managers[backend_id].hook.plugin_api_implementations(family=family)
        if impls is None:
            raise TypeError(
                f"plugin {backend_id!r} lists {family} in its descriptor but its "
                "plugin_api_implementations hook returned None for it"
            )
        return tuple(impls)


# ---- discovery ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Entry:
    id: str
    distribution: str
    version: str
    module: str


def discover() -> tuple[list[_Entry], list[PluginRecord]]:
    """Entry points of group ``plugin_api.backends``: usable entries, and id conflicts."""
    by_id: dict[str, list[_Entry]] = {}
    for ep in importlib_metadata.entry_points(group=GROUP):
        dist = ep.dist
        entry = _Entry(
            id=ep.name,
            distribution=dist.name if dist else "?",
            version=dist.version if dist else "?",
            module=ep.value,
        )
        by_id.setdefault(ep.name, []).append(entry)
    if REFERENCE_ID not in by_id:  # running from a source tree that was never installed
        by_id[REFERENCE_ID] = [_Entry(REFERENCE_ID, "plugin-api", __version__, _REFERENCE_EP)]
    entries, conflicts = [], []
    for backend_id, found in sorted(by_id.items()):
        if len(found) == 1:
            entries.append(found[0])
            continue
        claimants = ", ".join(f"{e.distribution} {e.version} ({e.module})" for e in found)
        for e in found:
            conflicts.append(
                PluginRecord(
                    id=backend_id,
                    distribution=e.distribution,
                    version=e.version,
                    module=e.module,
                    failure=Failure(
                        "discover",
                        f"backend id {backend_id!r} is claimed by {len(found)} distributions: "
                        f"{claimants}. Uninstall all but one; none of them was loaded.",
                    ),
                )
            )
    return entries, conflicts


# ---- loading -----------------------------------------------------------------------------------


def _describe(entry: _Entry) -> BackendDescriptor:
    module = import_module(entry.module)
    desc = getattr(module, "DESCRIPTOR", None)
    if not isinstance(desc, BackendDescriptor):
        raise TypeError(
            f"{entry.module}.DESCRIPTOR must be a plugin_api.BackendDescriptor, "
            f"got {type(desc).__name__}"
        )
    if desc.id != entry.id:
        raise ValueError(
            f"entry point name {entry.id!r} and DESCRIPTOR.id {desc.id!r} differ; "
            "the entry-point name is the backend id, make them equal"
        )
    return desc


def _register(desc: BackendDescriptor) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    module = import_module(desc.hooks)
    pm.register(module, name=desc.id)  # pluggy validates hookimpl signatures here
    pm.check_pending()  # a hookimpl for a hook the host does not define
    missing = [h for h in hookspecs.REQUIRED_HOOKS if not getattr(pm.hook, h).get_hookimpls()]
    if missing:
        raise pluggy.PluginValidationError(
            module, f"{desc.hooks} does not implement required hook(s): {', '.join(missing)}"
        )
    return pm


def _probe(pm: pluggy.PluginManager, desc: BackendDescriptor, info: DeviceInfo) -> Availability:
    result = pm.hook.plugin_api_probe(info=info)
    if not isinstance(result, Availability):
        raise TypeError(
            f"{desc.hooks}.plugin_api_probe returned {type(result).__name__}, not Availability"
        )
    return result


def _bounded(fn: Callable[[], T], timeout: float) -> tuple[T | None, Failure | None]:
    """Run ``fn`` in a daemon thread; a hang costs ``timeout`` seconds, never the process.

    The returned failure has an empty stage; the caller knows which stage it was running.
    """
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # a plugin's bug, recorded with its traceback
            box["error"] = e
            box["tb"] = traceback.format_exc()

    thread = threading.Thread(target=target, daemon=True, name="plugin-api-load")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        frame = sys._current_frames().get(thread.ident or -1)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        hint = " (PLUGIN_API_PROBE_TIMEOUT); it was left running in a daemon thread"
        return None, Failure("", f"did not finish within {timeout:g} s{hint}", stack)
    if "error" in box:
        e = box["error"]
        return None, Failure("", f"{type(e).__name__}: {e}".strip(), str(box["tb"]))
    return box["result"], None  # type: ignore[return-value]


def _load_one(entry: _Entry, timeout: float) -> tuple[PluginRecord, pluggy.PluginManager | None]:
    """Describe, check and register one plugin; probing comes later, once DeviceInfo is known."""
    stage = ["describe"]
    out: dict[str, object] = {}
    started = time.perf_counter()

    def work() -> None:
        desc = _describe(entry)
        out["desc"] = desc
        stage[0] = "compat"
        if not desc.supports_host(HOST_API_VERSION):
            raise _Incompatible(
                f"plugin {desc.id!r} supports host API {desc.host_api}; this host "
                f"(plugin-api {__version__}) provides API {HOST_API_VERSION}. Install a "
                f"{entry.distribution} release built for API {HOST_API_VERSION} "
                "(no plugin code beyond its descriptor was imported)."
            )
        stage[0] = "register"
        out["pm"] = _register(desc)

    _, failure = _bounded(work, timeout)
    desc = out.get("desc")
    rec = PluginRecord(
        id=entry.id,
        distribution=entry.distribution,
        version=entry.version,
        module=entry.module,
        descriptor=desc if isinstance(desc, BackendDescriptor) else None,
    )
    if failure is not None:
        if stage[0] == "compat":  # our own message says it all; the traceback is noise
            failure = Failure("", failure.message.removeprefix("_Incompatible: "))
        return _finish(rec, started, failure=replace(failure, stage=stage[0])), None
    pm = out["pm"]
    assert isinstance(pm, pluggy.PluginManager)
    return _finish(rec, started), pm


class _Incompatible(Exception):
    pass


def _finish(rec: PluginRecord, started: float, **changes: Any) -> PluginRecord:
    return replace(rec, seconds=rec.seconds + time.perf_counter() - started, **changes)


def _machine_facts(
    loaded: list[tuple[PluginRecord, pluggy.PluginManager]], timeout: float
) -> tuple[dict[str, str], dict[str, Failure]]:
    facts: dict[str, str] = {}
    failures: dict[str, Failure] = {}
    for rec, pm in loaded:
        if not pm.hook.plugin_api_machine_facts.get_hookimpls():
            continue
        result, failure = _bounded(lambda pm=pm: pm.hook.plugin_api_machine_facts(), timeout)
        if failure is not None:
            failures[rec.id] = replace(failure, stage="facts")
        elif result:
            facts.update({str(k): str(v) for k, v in dict(result).items()})
    return facts, failures


def load_plugins(
    settings: Settings, info: DeviceInfo | None = None, *, probe: bool = True
) -> Registry:
    """Discover, load and probe every allowed plugin.

    ``info`` is the machine to probe for; None reads the real one (after the descriptors are
    loaded, so that the library versions they ask for and their machine facts are included).
    ``probe=False`` loads and registers only (reusing a serialised selection): records then
    carry no probe result.
    """
    entries, conflicts = discover()
    ids = {e.id for e in entries} | {c.id for c in conflicts}
    if settings.plugins is not None:
        unknown = sorted(settings.plugins - ids)
        if unknown:
            raise SettingError(
                f"PLUGIN_API_PLUGINS names {', '.join(map(repr, unknown))}, which match no "
                f"installed plugin. Installed: {', '.join(sorted(ids))}."
            )
    records: list[PluginRecord] = list(conflicts)
    loaded: list[tuple[PluginRecord, pluggy.PluginManager]] = []
    for entry in entries:
        if settings.plugins is not None and entry.id not in settings.plugins | {REFERENCE_ID}:
            records.append(
                PluginRecord(
                    entry.id, entry.distribution, entry.version, entry.module, excluded=True
                )
            )
            continue
        rec, pm = _load_one(entry, settings.probe_timeout)
        if pm is None:
            records.append(rec)
        else:
            loaded.append((rec, pm))
    if not probe:
        records.extend(rec for rec, _ in loaded)
        return Registry(
            tuple(records),
            info or DeviceInfo(machine="(not read)"),
            dict((rec.id, pm) for rec, pm in loaded),
        )
    fact_failures: dict[str, Failure] = {}
    if info is None:
        libs = tuple(lib for r, _ in loaded if r.descriptor for lib in r.descriptor.libraries)
        facts, fact_failures = _machine_facts(loaded, settings.probe_timeout)
        info = read_device_info(libs).with_facts(facts)
    managers: dict[str, pluggy.PluginManager] = {}
    for rec, pm in loaded:
        if rec.id in fact_failures:
            records.append(replace(rec, failure=fact_failures[rec.id]))
            continue
        started = time.perf_counter()
        desc = rec.descriptor
        assert desc is not None
        result, failure = _bounded(
            lambda pm=pm, d=desc: _probe(pm, d, info), settings.probe_timeout
        )
        if failure is not None:
            records.append(_finish(rec, started, failure=replace(failure, stage="probe")))
        else:
            records.append(_finish(rec, started, probe=result))
            managers[rec.id] = pm
    records.sort(key=lambda r: (r.id, r.distribution))
    return Registry(records=tuple(records), info=info, managers=managers)


def usable(records: Sequence[PluginRecord]) -> list[PluginRecord]:
    return [r for r in records if r.state in (Status.VALIDATED.value, Status.EXPERIMENTAL.value)]

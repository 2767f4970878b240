"""Discovering, loading and probing plugins.

Each installed plugin goes through the same stages, and the first one that fails is recorded with
its cause and traceback; nothing is swallowed and no plugin can take the host down:

  discover  entry point in group ``plugin_api.backends``; an id claimed twice is a conflict
  allow     ``PLUGIN_API_PLUGINS`` may exclude it (then nothing of it is imported)
  describe  import the descriptor module, read ``DESCRIPTOR``
  compat    check ``DESCRIPTOR.host_api`` against this host, before any other plugin code runs
  register  import the hooks module and register it with pluggy (signatures validated)
  probe     ``plugin_api_probe(info)``, bounded in time like every stage above
  conform   for a plugin the probe found usable: its implementations of every family its
            descriptor lists, each checked against the family's Protocol (``ops.protocols``)

``conform`` runs after ``probe`` rather than at ``register`` so that plugins that cannot run here
never have their implementation modules imported.
"""

from __future__ import annotations

import functools
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
from .device_info import DeviceInfo, dist_name_version, read_device_info
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
    # implementations already checked against their Protocol, by (backend id, family)
    checked: dict[tuple[str, OpFamily], tuple[Any, ...]] = field(default_factory=dict)

    def record(self, backend_id: str) -> PluginRecord | None:
        return next((r for r in self.records if r.id == backend_id), None)

    @property
    def known_settings(self) -> tuple[str, ...]:
        return tuple(s for r in self.records if r.descriptor for s in r.descriptor.settings)

    def implementations(self, backend_id: str, family: OpFamily) -> tuple[Any, ...]:
        """The plugin's implementations of ``family``, checked against the family's Protocol
        (calls its ``plugin_api_implementations`` hook once, importing its heavy modules)."""
        rec = self.record(backend_id)
        if rec is None or rec.descriptor is None or backend_id not in self.managers:
            raise KeyError(f"backend {backend_id!r} is not loaded")
        if family not in rec.descriptor.families:
            return ()
        key = (backend_id, family)
        if key not in self.checked:
            self.checked[key] = _implementations(self.managers[backend_id], backend_id, family)
        return self.checked[key]


def _implementations(
    pm: pluggy.PluginManager, backend_id: str, family: OpFamily
) -> tuple[Any, ...]:
    from .ops.protocols import checked  # the op Protocols need torch: not at selection's import

    impls = pm.hook.plugin_api_implementations(family=family)
    if impls is None:
        raise TypeError(
            f"plugin {backend_id!r} lists {family} in its descriptor but its "
            "plugin_api_implementations hook returned None for it"
        )
    return checked(backend_id, family, impls)


def _conform(
    pm: pluggy.PluginManager, desc: BackendDescriptor
) -> dict[tuple[str, OpFamily], tuple[Any, ...]]:
    return {(desc.id, f): _implementations(pm, desc.id, f) for f in desc.families}


# ---- discovery ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PluginEntry:
    """One installed plugin's entry point: its id, distribution, version and descriptor module."""

    id: str
    distribution: str
    version: str
    module: str


def discover() -> tuple[list[PluginEntry], list[PluginRecord]]:
    """Entry points of group ``plugin_api.backends``: usable entries, and id conflicts."""
    by_id: dict[str, list[PluginEntry]] = {}
    for ep in importlib_metadata.entry_points(group=GROUP):
        name, version = dist_name_version(ep.dist)
        entry = PluginEntry(id=ep.name, distribution=name, version=version, module=ep.value)
        by_id.setdefault(ep.name, []).append(entry)
    if REFERENCE_ID not in by_id:  # running from a source tree that was never installed
        by_id[REFERENCE_ID] = [PluginEntry(REFERENCE_ID, "plugin-api", __version__, _REFERENCE_EP)]
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


def read_descriptor(entry: PluginEntry) -> BackendDescriptor:
    """Import the entry's descriptor module and return its ``DESCRIPTOR`` (light: no torch)."""
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
    plugin = getattr(module, "HOOKS", module)  # the standard shape, or the module's own hookimpls
    if plugin is not module and not isinstance(plugin, hookspecs.PluginHooks):
        raise TypeError(
            f"{desc.hooks}.HOOKS must be a plugin_api.hookspecs.PluginHooks, "
            f"got {type(plugin).__name__}"
        )
    pm.register(plugin, name=desc.id)  # pluggy validates hookimpl signatures here
    pm.check_pending()  # a hookimpl for a hook the host does not define
    missing = [h for h in hookspecs.REQUIRED_HOOKS if not getattr(pm.hook, h).get_hookimpls()]
    if missing:
        raise pluggy.PluginValidationError(
            module, f"{desc.hooks} does not implement required hook(s): {', '.join(missing)}"
        )
    return pm


def _probe(
    pm: pluggy.PluginManager, desc: BackendDescriptor | None, info: DeviceInfo
) -> Availability:
    """``desc`` is the loaded plugin's descriptor (set on every record that loaded)."""
    result = pm.hook.plugin_api_probe(info=info)
    if not isinstance(result, Availability):
        hooks = desc.hooks if desc is not None else "the plugin's hooks"
        raise TypeError(
            f"{hooks}.plugin_api_probe returned {type(result).__name__}, not Availability"
        )
    return result


@dataclass
class _Task:
    """One plugin's work in one stage, run in its own daemon thread."""

    fn: Callable[[], Any]
    result: Any = None
    error: BaseException | None = None
    tb: str = ""
    done_seconds: float | None = None
    started: float | None = None
    thread: threading.Thread | None = None

    @property
    def seconds(self) -> float:
        """How long it took, or, still running (hung), how long it has run so far: the time a
        process start lost to it."""
        if self.done_seconds is not None:
            return self.done_seconds
        return 0.0 if self.started is None else time.perf_counter() - self.started

    def run(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()
        try:
            self.result = self.fn()
        except BaseException as e:  # a plugin's bug, recorded with its traceback
            self.error = e
            self.tb = traceback.format_exc()
        finally:
            self.done_seconds = time.perf_counter() - self.started

    def failure(self, timeout: float) -> Failure | None:
        """None on success; the stage is filled in by the caller, who knows it."""
        assert self.thread is not None
        if self.thread.is_alive():
            frame = sys._current_frames().get(self.thread.ident or -1)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
            hint = " (PLUGIN_API_PROBE_TIMEOUT); it was left running in a daemon thread"
            return Failure("", f"did not finish within {timeout:g} s{hint}", stack)
        if self.error is not None:
            e = self.error
            return Failure("", f"{type(e).__name__}: {e}".strip(), self.tb)
        return None


def _run_bounded(tasks: Sequence[_Task], timeout: float) -> None:
    """Run every task concurrently; a task that hangs costs ``timeout`` seconds in total, never
    the process (its daemon thread is abandoned)."""
    for task in tasks:
        task.thread = threading.Thread(target=task.run, daemon=True, name="plugin-api-load")
        task.started = time.perf_counter()
        task.thread.start()
    deadline = time.monotonic() + timeout
    for task in tasks:
        assert task.thread is not None
        task.thread.join(max(0.0, deadline - time.monotonic()))


class _Incompatible(Exception):
    pass


@dataclass
class _Progress:
    """How far one plugin's load got, so a failure names its stage."""

    stage: str = "describe"
    descriptor: BackendDescriptor | None = None


def _load(entry: PluginEntry, progress: _Progress) -> pluggy.PluginManager:
    """Describe, check and register one plugin."""
    desc = progress.descriptor = read_descriptor(entry)
    progress.stage = "compat"
    if not desc.supports_host(HOST_API_VERSION):
        raise _Incompatible(
            f"plugin {desc.id!r} supports host API {desc.host_api}; this host "
            f"(plugin-api {__version__}) provides API {HOST_API_VERSION}. Install a "
            f"{entry.distribution} release built for API {HOST_API_VERSION} "
            "(no plugin code beyond its descriptor was imported)."
        )
    progress.stage = "register"
    return _register(desc)


def _load_all(
    entries: Sequence[PluginEntry], timeout: float
) -> tuple[list[PluginRecord], list[tuple[PluginRecord, pluggy.PluginManager]]]:
    progress = [_Progress() for _ in entries]
    tasks = [_Task(functools.partial(_load, e, p)) for e, p in zip(entries, progress, strict=True)]
    _run_bounded(tasks, timeout)
    failed, loaded = [], []
    for entry, prog, task in zip(entries, progress, tasks, strict=True):
        rec = PluginRecord(
            entry.id,
            entry.distribution,
            entry.version,
            entry.module,
            descriptor=prog.descriptor,
            seconds=task.seconds,
        )
        failure = task.failure(timeout)
        if failure is None:
            loaded.append((rec, task.result))
            continue
        if prog.stage == "compat":  # our own message says it all; the traceback is noise
            failure = Failure("", failure.message.removeprefix("_Incompatible: "))
        failed.append(replace(rec, failure=replace(failure, stage=prog.stage)))
    return failed, loaded


def _machine_facts_of(pm: pluggy.PluginManager) -> Any:
    return pm.hook.plugin_api_machine_facts()


def _machine_facts(
    loaded: list[tuple[PluginRecord, pluggy.PluginManager]], timeout: float
) -> tuple[dict[str, str], dict[str, Failure]]:
    asking = [(rec, pm) for rec, pm in loaded if pm.hook.plugin_api_machine_facts.get_hookimpls()]
    tasks = [_Task(functools.partial(_machine_facts_of, pm)) for _, pm in asking]
    _run_bounded(tasks, timeout)
    facts: dict[str, str] = {}
    failures: dict[str, Failure] = {}
    for (rec, _), task in zip(asking, tasks, strict=True):
        failure = task.failure(timeout)
        if failure is not None:
            failures[rec.id] = replace(failure, stage="facts")
        elif task.result:
            facts.update({str(k): str(v) for k, v in dict(task.result).items()})
    return facts, failures


def load_plugins(
    settings: Settings, info: DeviceInfo | None = None, *, probe: bool = True
) -> Registry:
    """Discover, load and probe every allowed plugin (each stage concurrently, bounded).

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
    allowed = settings.plugins | {REFERENCE_ID} if settings.plugins is not None else None
    records: list[PluginRecord] = list(conflicts)
    records += [
        PluginRecord(e.id, e.distribution, e.version, e.module, excluded=True)
        for e in entries
        if allowed is not None and e.id not in allowed
    ]
    failed, loaded = _load_all(
        [e for e in entries if allowed is None or e.id in allowed], settings.probe_timeout
    )
    records += failed
    if not probe:
        records += [rec for rec, _ in loaded]
        managers = {rec.id: pm for rec, pm in loaded}
        return Registry(tuple(records), info or DeviceInfo(machine="(not read)"), managers)
    if info is None:
        libs = tuple(lib for r, _ in loaded if r.descriptor for lib in r.descriptor.libraries)
        facts, fact_failures = _machine_facts(loaded, settings.probe_timeout)
        info = read_device_info(libs).with_facts(facts)
        records += [
            replace(rec, failure=fact_failures[rec.id])
            for rec, _ in loaded
            if rec.id in fact_failures
        ]
        loaded = [(rec, pm) for rec, pm in loaded if rec.id not in fact_failures]
    probed = info
    tasks = [_Task(functools.partial(_probe, pm, rec.descriptor, probed)) for rec, pm in loaded]
    _run_bounded(tasks, settings.probe_timeout)
    probed_ok: list[tuple[PluginRecord, pluggy.PluginManager]] = []
    for (rec, pm), task in zip(loaded, tasks, strict=True):
        took = rec.seconds + task.seconds
        failure = task.failure(settings.probe_timeout)
        if failure is not None:
            records.append(replace(rec, failure=replace(failure, stage="probe"), seconds=took))
        else:
            probed_ok.append((replace(rec, probe=task.result, seconds=took), pm))
    # conform: only plugins that can run here, so the others' kernel modules stay unimported
    conforming = [
        (r, pm, r.descriptor)
        for r, pm in probed_ok
        if r.descriptor is not None and r.availability is not None and r.availability.usable
    ]
    tasks = [_Task(functools.partial(_conform, pm, desc)) for _, pm, desc in conforming]
    _run_bounded(tasks, settings.probe_timeout)
    outcome = {r.id: t for (r, _, _), t in zip(conforming, tasks, strict=True)}
    managers = {}
    checked: dict[tuple[str, OpFamily], tuple[Any, ...]] = {}
    for rec, pm in probed_ok:
        conform = outcome.get(rec.id)
        if conform is None:  # not usable here: its implementations are never asked for
            records.append(rec)
            managers[rec.id] = pm
            continue
        took = rec.seconds + conform.seconds
        failure = conform.failure(settings.probe_timeout)
        if failure is not None:
            message = failure.message.removeprefix("ImplementationMismatch: ")
            failure = replace(failure, stage="conform", message=message)
            records.append(replace(rec, failure=failure, seconds=took))
            continue
        records.append(replace(rec, seconds=took))
        managers[rec.id] = pm
        checked.update(conform.result)
    records.sort(key=lambda r: (r.id, r.distribution))
    return Registry(records=tuple(records), info=info, managers=managers, checked=checked)


def usable(records: Sequence[PluginRecord]) -> list[PluginRecord]:
    return [r for r in records if r.state in (Status.VALIDATED.value, Status.EXPERIMENTAL.value)]

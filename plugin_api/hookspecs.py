"""The pluggy hooks between the host and a plugin's ``hooks`` module, and the one plugin shape.

pluggy checks every hookimpl's argument names against these specs when the plugin registers, so a
drifted signature fails at load time with the offending function named, not at the first call.
Selection is the host's own logic (see ``selection``), never pluggy's call order.

Every plugin of this project has the same hooks: ``HOOKS = PluginHooks(package, probe, facts)``
in its ``hooks`` module, whose implementations are ``<package>.<family>.implementations()``.
A third-party plugin may instead write the hookimpls as module functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .contract import Availability, OpFamily
    from .device_info import DeviceInfo
    from .ops.protocols import Implementation

PROJECT = "plugin_api"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# Hooks every plugin must implement; a plugin missing one fails at registration.
REQUIRED_HOOKS = ("plugin_api_probe", "plugin_api_implementations")


@hookspec(firstresult=True)
def plugin_api_probe(info: DeviceInfo) -> Availability:  # type: ignore[empty-body]
    """Decide whether the backend can run on the machine ``info`` describes.

    A pure function of ``info``: it must not touch hardware, so that what-if planning and tests
    can pass a ``DeviceInfo`` for hardware that is not present.
    """


@hookspec(firstresult=True)
def plugin_api_implementations(  # type: ignore[empty-body]
    family: OpFamily,
) -> Sequence[Implementation]:
    """The plugin's implementations of op family ``family``, best first.

    Called once per family its descriptor lists, when the probe finds the plugin usable; each
    object is checked against the family's Protocol (``plugin_api.ops.protocols``) and a
    mismatch fails the plugin's ``conform`` stage. Keep it light: build the objects, and import
    extensions, triton or flashinfer inside the methods that run kernels. Every plugin answers
    with ``implementations_in(__package__, family)``.
    """


@hookspec(firstresult=True)
def plugin_api_machine_facts() -> Mapping[str, str]:  # type: ignore[empty-body]
    """Optional: facts about the real machine that the probe needs and ``DeviceInfo`` lacks.

    E.g. whether the oneDNN at a user-given path was built with ACL. Keys are namespaced by the
    backend id (``"cpu-arm-acl.onednn"``). Called only on the real machine, never for what-if.
    """


def implementations_in(package: str | None, family: OpFamily) -> Sequence[Implementation]:
    """The one shape of a plugin: module ``<package>.<family>`` (``attention``, ``gemm``,
    ``quant``, ``state``) defines ``implementations()``, best first. A family the descriptor
    lists without its module is an error that names the module."""
    if not package:
        raise ValueError("implementations_in: pass the hooks module's __package__")
    name = f"{package}.{family.value}"
    module = import_module(name)
    make = getattr(module, "implementations", None)
    if not callable(make):
        raise TypeError(f"{name} defines no implementations() function")
    found: Sequence[Implementation] = make()
    return found


@dataclass(frozen=True, slots=True)
class PluginHooks:
    """The hookimpls of a plugin in the standard shape: ``probe(info)`` from its ``probe``
    module, optional machine ``facts()``, and one module per op family (``implementations_in``).
    The registry registers a hooks module's ``HOOKS`` in place of the module."""

    package: str | None  # the plugin's package: pass the hooks module's ``__package__``
    probe: Callable[[DeviceInfo], Availability]
    facts: Callable[[], Mapping[str, str]] | None = None

    def __post_init__(self) -> None:
        if not self.package:
            raise ValueError("PluginHooks.package: pass the hooks module's __package__")

    @hookimpl
    def plugin_api_probe(self, info: DeviceInfo) -> Availability:
        return self.probe(info)

    @hookimpl
    def plugin_api_implementations(self, family: OpFamily) -> Sequence[Implementation]:
        return implementations_in(self.package, family)

    @hookimpl
    def plugin_api_machine_facts(self) -> Mapping[str, str] | None:
        return self.facts() if self.facts is not None else None

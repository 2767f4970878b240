"""The plugin contract as data: descriptor, availability, op families.

A plugin's entry point names a *descriptor module* that defines ``DESCRIPTOR``. The host reads it
and checks ``host_api`` before importing anything else of the plugin; only then is the ``hooks``
module imported and registered with pluggy.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet


class Status(str, enum.Enum):
    """How well a backend fits this machine."""

    VALIDATED = "validated"  # tested on this hardware class
    EXPERIMENTAL = "experimental"  # runs here, not validated
    UNAVAILABLE = "unavailable"  # cannot run here

    def __str__(self) -> str:
        return self.value


class OpFamily(str, enum.Enum):
    ATTENTION = "attention"
    GEMM = "gemm"
    QUANT = "quant"
    STATE = "state"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Availability:
    """A probe's answer: status, the reasons for it, and the torch device the backend would use."""

    status: Status
    reasons: tuple[str, ...]
    device_type: str | None = None  # e.g. "cuda", "xpu", "cpu"; None when unavailable

    def __post_init__(self) -> None:
        if not self.reasons:
            raise ValueError("Availability needs at least one reason, whatever the status")
        if self.status is not Status.UNAVAILABLE and not self.device_type:
            raise ValueError(f"Availability {self.status}: device_type is required")

    @classmethod
    def validated(cls, device_type: str, *reasons: str) -> Availability:
        return cls(Status.VALIDATED, reasons, device_type)

    @classmethod
    def experimental(cls, device_type: str, *reasons: str) -> Availability:
        return cls(Status.EXPERIMENTAL, reasons, device_type)

    @classmethod
    def unavailable(cls, *reasons: str) -> Availability:
        return cls(Status.UNAVAILABLE, reasons, None)

    @property
    def usable(self) -> bool:
        return self.status is not Status.UNAVAILABLE


_ID = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
DEVICE_KINDS = frozenset({"cpu", "cuda", "rocm", "xpu", "any"})


@dataclass(frozen=True, slots=True)
class BackendDescriptor:
    """Static facts about a backend, readable without importing any of its kernels.

    ``hooks`` is the module holding the plugin's pluggy hookimpls; it is imported only after
    ``host_api`` has been checked. ``families`` lists the op families the plugin has kernels for:
    empty means "no kernels yet", and such a backend is never selected. ``libraries`` are
    distributions whose versions its probe reads from ``DeviceInfo.libraries``; ``settings`` are
    the ``PLUGIN_API_*`` variables it reads (so the host can reject unknown ones).
    """

    id: str
    host_api: str
    priority: int
    families: tuple[OpFamily, ...]
    device_kinds: tuple[str, ...]
    hooks: str
    summary: str
    libraries: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _ID.match(self.id):
            raise ValueError(f"BackendDescriptor.id={self.id!r}: use lowercase words joined by '-'")
        try:
            SpecifierSet(self.host_api)
        except InvalidSpecifier as e:
            raise ValueError(f"BackendDescriptor.host_api={self.host_api!r}: {e}") from e
        bad = [k for k in self.device_kinds if k not in DEVICE_KINDS]
        if bad:
            raise ValueError(f"BackendDescriptor.device_kinds: {bad} not in {sorted(DEVICE_KINDS)}")
        for s in self.settings:
            if not s.startswith("PLUGIN_API_"):
                raise ValueError(f"BackendDescriptor.settings: {s!r} must start with PLUGIN_API_")
        object.__setattr__(self, "families", tuple(OpFamily(f) for f in self.families))

    def supports_host(self, host_api_version: str) -> bool:
        return SpecifierSet(self.host_api).contains(host_api_version, prereleases=True)

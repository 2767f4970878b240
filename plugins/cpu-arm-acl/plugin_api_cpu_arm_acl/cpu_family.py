"""The x86 CPU's vendor and family (``/proc/cpuinfo``), as a machine fact.

ISA flags say what a core can compute, not how its memory system behaves: the Zen 4 and the Zen 5
have the same AVX-512 flags, yet the decode kernels' prefetches into L1 rather than L2 made the
cold decode faster on one and slower on the other (``attention.prefetch_target``). The family
tells them apart.
"""

from __future__ import annotations

import functools
from pathlib import Path

from plugin_api.device_info import DeviceInfo, read_device_info

FACT = "cpu-arm-acl.cpu_family"  # "<vendor_id> <cpu family>", e.g. "AuthenticAMD 26"


def read(cpuinfo: str) -> str | None:
    """``"<vendor_id> <cpu family>"`` of the first processor in ``cpuinfo``, or None when the
    text has no such lines (Arm kernels report implementer and part instead)."""
    vendor = family = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "vendor_id" and vendor is None:
            vendor = value
        elif key == "cpu family" and family is None:
            family = value
        if vendor is not None and family is not None:
            return f"{vendor} {family}"
    return None


def parse(fact: str | None) -> tuple[str, int] | None:
    """(vendor, family) from a ``FACT`` value; None when absent or malformed."""
    vendor, _, family = (fact or "").rpartition(" ")
    return (vendor, int(family)) if vendor and family.isdigit() else None


def of(info: DeviceInfo) -> tuple[str, int] | None:
    """(vendor, family) of the machine ``info`` describes; None when it carries no such fact."""
    return parse(info.fact(FACT))


def facts(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    try:
        found = read(path.read_text())
    except OSError:  # no /proc (not Linux): the fact is absent and "auto" keeps its default
        return {}
    return {FACT: found} if found else {}


@functools.cache
def host() -> DeviceInfo:
    """The machine the kernels run on, with its family fact: read once (``/proc/cpuinfo`` and
    package metadata), not per call."""
    return read_device_info().with_facts(facts())

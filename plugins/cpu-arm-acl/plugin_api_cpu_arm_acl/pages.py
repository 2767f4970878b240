"""Whether packed weights get huge pages on this machine (``csrc/huge_pages.h`` asks for them):
the kernel's THP mode, read as a machine fact so that the pure probe can say it."""

from __future__ import annotations

from plugin_api.device_info import DeviceInfo
from plugin_api.ops.huge_pages import THP_MODE_FILE, thp_mode

FACT_THP = "cpu-arm-acl.thp_mode"


def facts() -> dict[str, str]:
    mode = thp_mode()
    return {FACT_THP: mode} if mode is not None else {}


def describe(info: DeviceInfo) -> str | None:
    """One line for the probe's reasons; None where the THP mode is unknown (not Linux)."""
    mode = info.fact(FACT_THP)
    if mode is None:
        return None
    if mode == "never":
        return (
            "THP mode 'never': packed weights get 4 KB pages, a TLB miss per page of each decode "
            f"step's weight stream (enable with: echo madvise > {THP_MODE_FILE})"
        )
    return f"packed weights of 4 MiB or more ask for transparent huge pages (THP mode {mode!r})"

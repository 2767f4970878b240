"""Where the portable Triton kernels run, as a plugin declares it, and whether Triton is there.

Outside ``plugin_api.triton`` on purpose: plugins import it from their probe module, which loads
on every machine, while ``plugin_api.triton`` loads only for a selected backend that uses it.
Light: no torch, no triton.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from ..contract.decision import Decision
from ..device_info import DeviceInfo

# tl.math.div_rn, fp_downcast_rounding and bitcasts in .to() are all present from 3.0 on.
MIN_TRITON = Version("3.0")


@dataclass(frozen=True, slots=True)
class TritonTarget:
    """A device the kernels serve, declared by the plugin that launches them.

    - ``device_type``: the torch device the kernels run on (``"xpu"``, ``"cuda"``).
    - ``distributions``: the distributions that provide the ``triton`` module for this device
      (``pytorch-triton-xpu`` ships with XPU torch wheels), looked up in ``DeviceInfo``.
    - ``graph_capture``: pure ``info -> Decision``: can this device capture and replay the
      kernels in a graph here (accept or reject, with the reason either way)? None: the plugin
      declares no graph capture for them (it serves attention with other kernels).
    """

    device_type: str
    distributions: tuple[str, ...]
    graph_capture: Callable[[DeviceInfo], Decision] | None = None

    def triton(self, info: DeviceInfo) -> Decision:
        """Is a usable Triton installed for this device, per ``info``?"""
        for name in self.distributions:
            found = info.library(name)
            if found is None:
                continue
            try:
                too_old = Version(found) < MIN_TRITON
            except InvalidVersion:
                return Decision.reject(f"{name} {found}: not a version the kernels can check")
            if too_old:
                return Decision.reject(
                    f"{name} {found} is older than the kernels need ({MIN_TRITON}+)"
                )
            return Decision.accept(f"Triton kernels ({name} {found})")
        names = ", ".join(self.distributions)
        return Decision.reject(f"no Triton for {self.device_type}: none of {names} is installed")

    def probe_line(self, info: DeviceInfo, families: str) -> str:
        """A probe reason: the Triton that serves ``families`` ("quant and state"), or why
        none does and that those families fall back to the reference (visibly, warned once)."""
        found = self.triton(info)
        if found.ok:
            return found.because()
        return f"{found.because()}: {families} fall back to the reference"

"""Where the reference backend runs: on the first accelerator torch reaches, else the CPU."""

from __future__ import annotations

from plugin_api.contract import Availability
from plugin_api.device_info import DeviceInfo


def probe(info: DeviceInfo) -> Availability:
    if info.torch is None:
        return Availability.unavailable("torch is not installed; pip install torch")
    if info.accelerators:
        a = info.accelerators[0]
        return Availability.validated(
            a.torch_device, f"eager torch {info.torch.version} on {a.torch_device} ({a.name})"
        )
    return Availability.validated("cpu", f"eager torch {info.torch.version} on the CPU")

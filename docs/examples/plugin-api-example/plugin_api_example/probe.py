"""Where the example backend runs: any CPU that has torch, and nowhere validated."""

from __future__ import annotations

from plugin_api.contract import Availability
from plugin_api.device_info import DeviceInfo


def probe(info: DeviceInfo) -> Availability:
    """A pure function of ``info``: what-if answers (``--device-info h200``) need no hardware."""
    if info.torch is None:
        return Availability.unavailable("torch is not installed; pip install torch")
    cpu = info.cpu_model or info.machine
    # Experimental, not validated: auto-selection never picks it; PLUGIN_API_BACKEND=example does.
    return Availability.experimental(
        "cpu", f"eager torch {info.torch.version} on the CPU ({cpu}); an example, not validated"
    )

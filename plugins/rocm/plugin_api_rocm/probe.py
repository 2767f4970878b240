"""Does this machine have a supported AMD GPU that a HIP build of torch reaches?"""

from __future__ import annotations

import re

from plugin_api.contract import Availability
from plugin_api.device_info import DeviceInfo

VALIDATED_ARCHS = frozenset({"gfx942", "gfx950"})  # MI300X/MI325X, MI355X
EXPERIMENTAL_ARCHS = frozenset({"gfx90a"})  # MI210/MI250X
_RDNA = re.compile(r"^gfx1(1|2)\d\d$")  # gfx1100+ (RDNA3, RDNA4): experimental


def probe(info: DeviceInfo) -> Availability:
    if info.torch is None:
        return Availability.unavailable("torch is not installed")
    if info.torch.hip is None:
        return Availability.unavailable(
            f"torch {info.torch.version} is not a ROCm build (torch.version.hip is None)"
        )
    gpus = info.accelerators_of("amd")
    if not gpus:
        return Availability.unavailable(f"no AMD GPU visible to torch (HIP {info.torch.hip})")
    gpu = gpus[0]
    where = f"{gpu.name} ({gpu.arch})"
    if gpu.arch in VALIDATED_ARCHS:
        return Availability.validated("cuda", f"{where}: a validated architecture")
    if gpu.arch in EXPERIMENTAL_ARCHS or _RDNA.match(gpu.arch):
        return Availability.experimental("cuda", f"{where}: supported, not validated")
    return Availability.unavailable(
        f"{where}: supported architectures are gfx942/gfx950 (validated), gfx90a and gfx1100+"
    )

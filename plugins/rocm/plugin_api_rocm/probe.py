"""Does this machine have a supported AMD GPU that a HIP build of torch reaches?

A pure function of ``DeviceInfo``: the gfx architecture comes from the device properties
(``gcnArchName``, read into ``Accelerator.arch``), Triton from the installed distributions.
"""

from __future__ import annotations

import re

from plugin_api.contract import Availability
from plugin_api.device_info import DeviceInfo

from .facts import FACTS

VALIDATED_ARCHS = {"gfx942": "CDNA3: MI300X/MI325X", "gfx950": "CDNA4: MI350X/MI355X"}
EXPERIMENTAL_ARCHS = {"gfx90a": "CDNA2: MI210/MI250X"}
_RDNA = re.compile(r"^gfx1(1|2)\d\d$")  # gfx1100 and later (RDNA3, RDNA4): experimental

# The host's portable kernels serve attention, quantization and state copies on ROCm; whether
# they run in HIP graphs is the rocm.graph_capture fact.
TRITON = FACTS.triton_target()


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
    kernels = TRITON.probe_line(info, "attention, quant and state")
    if gpu.arch in VALIDATED_ARCHS:
        family = VALIDATED_ARCHS[gpu.arch]
        return Availability.validated(
            "cuda", f"{where}: a validated architecture ({family})", kernels
        )
    if gpu.arch in EXPERIMENTAL_ARCHS or _RDNA.match(gpu.arch):
        family = EXPERIMENTAL_ARCHS.get(gpu.arch, "RDNA3/RDNA4")
        return Availability.experimental(
            "cuda", f"{where}: supported, not validated ({family})", kernels
        )
    return Availability.unavailable(
        f"{where}: supported architectures are gfx942/gfx950 (validated), gfx90a and gfx1100+ "
        "(experimental)"
    )

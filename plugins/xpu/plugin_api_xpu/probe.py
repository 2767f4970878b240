"""Does torch reach an Intel GPU here, and may IPEX accelerate it?"""

from __future__ import annotations

from plugin_api.contract import Availability
from plugin_api.device_info import DeviceInfo

VALIDATED_FAMILIES = {"pvc": "Data Center GPU Max", "bmg": "Arc B-series", "dg2": "Arc A-series"}


def ipex_status(info: DeviceInfo) -> str:
    """IPEX is an optional accelerator, used only when built for the installed torch."""
    ipex = info.library("intel-extension-for-pytorch")
    if ipex is None:
        return "IPEX not installed (optional; upstream torch.xpu + Triton serve every op)"
    torch_v = info.torch.version if info.torch else "?"
    if _minor(ipex) == _minor(torch_v):
        return f"IPEX {ipex} matches torch {torch_v}: used as an optional accelerator"
    return (
        f"IPEX {ipex} is built for torch {_minor(ipex)}, not {torch_v}: not used "
        "(it would fail to load; IPEX development has ended)"
    )


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def probe(info: DeviceInfo) -> Availability:
    if info.torch is None:
        return Availability.unavailable("torch is not installed")
    if not info.torch.xpu:
        return Availability.unavailable(
            f"torch {info.torch.version} was built without XPU support "
            "(torch.xpu.is_available() is False)"
        )
    gpus = info.accelerators_of("intel")
    if not gpus:
        return Availability.unavailable(
            "torch.xpu.is_available() is False: no Intel GPU visible to this XPU build"
        )
    gpu = gpus[0]
    family = VALIDATED_FAMILIES.get(gpu.arch)
    if family is not None:
        return Availability.validated("xpu", f"{gpu.name} ({family})", ipex_status(info))
    return Availability.experimental(
        "xpu", f"{gpu.name}: an Intel GPU outside the validated families", ipex_status(info)
    )

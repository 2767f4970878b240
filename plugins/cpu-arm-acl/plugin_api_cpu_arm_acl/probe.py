"""Is this an Arm CPU with an ACL-enabled oneDNN (validated), or an x86 CPU that runs the same
oneDNN code with x86 kernels (experimental)?"""

from __future__ import annotations

from plugin_api.contract import Availability
from plugin_api.device_info import DeviceInfo

ACL_FACT = "cpu-arm-acl.onednn_acl"  # "yes" when the oneDNN in use was built with ACL


def probe(info: DeviceInfo) -> Availability:
    if info.torch is None:
        return Availability.unavailable("torch is not installed")
    flags = info.cpu_flags
    if info.machine in ("aarch64", "arm64"):
        isa = "/".join(f for f in ("sve2", "sve", "bf16", "i8mm") if f in flags) or "neon"
        if info.fact(ACL_FACT) == "yes":
            return Availability.validated(
                "cpu", f"{info.cpu_model} ({isa}) with ACL-enabled oneDNN"
            )
        return Availability.unavailable(
            f"{info.cpu_model} ({isa}): no ACL-enabled oneDNN found; build oneDNN with ACL "
            "and point PLUGIN_API_ONEDNN_ROOT at it"
        )
    if info.machine in ("x86_64", "AMD64"):
        isa = [f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags]
        if not isa:
            return Availability.unavailable(f"{info.cpu_model}: oneDNN needs at least AVX2")
        return Availability.experimental(
            "cpu",
            f"{info.cpu_model} ({isa[0]}): the same oneDNN code with x86 kernels; "
            "validated target is aarch64 with ACL",
        )
    return Availability.unavailable(f"{info.machine}: not an Arm or x86-64 CPU")

"""Does this machine have a Hopper GPU that torch reaches through CUDA, and a FlashInfer we
have validated? A pure function of ``DeviceInfo``."""

from __future__ import annotations

from plugin_api.contract import Availability
from plugin_api.device_info import DeviceInfo
from plugin_api.gpu.platforms import CUDA

from . import versions

VALIDATED_MAJOR = 9  # SM90: H100, H200, GH200
EXPERIMENTAL_MAJORS = (10, 12)  # SM100 (B200), SM12x (RTX Blackwell)

# The host's portable Triton kernels serve quantization, state copies, int8 scaled_mm and the
# attention's K/V write. FlashInfer serves attention (with its own graph table, which covers
# the write), so no graph capture is declared for the kernels themselves.
TRITON = CUDA.triton_target()


def probe(info: DeviceInfo) -> Availability:
    if info.torch is None:
        return Availability.unavailable("torch is not installed")
    if info.torch.hip is not None:
        return Availability.unavailable(
            f"torch {info.torch.version} is a ROCm build; use plugin-api-rocm"
        )
    if info.torch.cuda is None:
        return Availability.unavailable(
            f"torch {info.torch.version} is not a CUDA build (torch.version.cuda is None)"
        )
    gpus = info.accelerators_of("nvidia")
    if not gpus:
        return Availability.unavailable(
            f"no NVIDIA GPU visible to torch (CUDA {info.torch.cuda} build)"
        )
    gpu = gpus[0]
    cc = gpu.compute_capability or (0, 0)
    where = f"{gpu.name}, compute capability {cc[0]}.{cc[1]}"
    if cc[0] != VALIDATED_MAJOR and cc[0] not in EXPERIMENTAL_MAJORS:
        return Availability.unavailable(
            f"{where}: this plugin needs 9.x (validated) or 10.x/12.x (experimental)"
        )
    flashinfer = versions.check_installed(info)
    if not flashinfer:
        return Availability.unavailable(where, *flashinfer.reasons)
    kernels = TRITON.probe_line(info, "quant and state")
    if cc[0] == VALIDATED_MAJOR:
        return Availability.validated(
            "cuda", f"{where}: the validated target", *flashinfer.reasons, kernels
        )
    return Availability.experimental(
        "cuda",
        f"{where}: runs with this architecture's own rules, not validated",
        *flashinfer.reasons,
        kernels,
    )

"""Named ``DeviceInfo`` examples of real machines, for what-if planning and tests.

``plugin-api doctor --device-info h200`` uses these; a JSON file works the same way.
"""

from __future__ import annotations

from .device_info import Accelerator, DeviceInfo, TorchBuild

GiB = 1 << 30
# /proc/cpuinfo flags that kernels choose ISA paths by (Sapphire Rapids, Zen 4)
_AVX512 = {
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_bf16",
    "avx512vbmi",
}
_XEON = frozenset(_AVX512 | {"amx_bf16", "amx_int8", "amx_tile"})
_EPYC = frozenset(_AVX512)
_CUDA_TORCH = TorchBuild("2.13.0+cu130", cuda="13.0")
_ROCM_TORCH = TorchBuild("2.13.0+rocm7.0", hip="7.0.0")
_XPU_TORCH = TorchBuild("2.13.0+xpu", xpu=True)


def _nvidia(name: str, cc: tuple[int, int], mem_gib: int) -> DeviceInfo:
    gpu = Accelerator("nvidia", "cuda", name, f"sm_{cc[0]}{cc[1]}", mem_gib * GiB, cc)
    return DeviceInfo(
        machine="x86_64",
        cpu_model="Intel(R) Xeon(R) Platinum 8480+",
        cpu_count=224,
        cpu_flags=_XEON,
        torch=_CUDA_TORCH,
        accelerators=(gpu,),
        libraries=(("flashinfer-python", "0.7.4"), ("torch", "2.13.0"), ("triton", "3.9.0")),
    )


def _amd(name: str, arch: str, mem_gib: int) -> DeviceInfo:
    return DeviceInfo(
        machine="x86_64",
        cpu_model="AMD EPYC 9654",
        cpu_count=192,
        cpu_flags=_EPYC,
        torch=_ROCM_TORCH,
        accelerators=(Accelerator("amd", "cuda", name, arch, mem_gib * GiB),),
        libraries=(("torch", "2.13.0"), ("triton", "3.9.0")),
    )


def _intel(name: str, family: str, mem_gib: int) -> DeviceInfo:
    return DeviceInfo(
        machine="x86_64",
        cpu_model="Intel(R) Xeon(R) Platinum 8480+",
        cpu_count=224,
        cpu_flags=_XEON,
        torch=_XPU_TORCH,
        accelerators=(Accelerator("intel", "xpu", name, family, mem_gib * GiB),),
        libraries=(("torch", "2.13.0"), ("pytorch-triton-xpu", "3.9.0")),
    )


MACHINES: dict[str, DeviceInfo] = {
    "h100": _nvidia("NVIDIA H100 80GB HBM3", (9, 0), 80),
    "h200": _nvidia("NVIDIA H200", (9, 0), 141),
    "b200": _nvidia("NVIDIA B200", (10, 0), 180),
    "rtx-5090": _nvidia("NVIDIA GeForce RTX 5090", (12, 0), 32),
    "a100": _nvidia("NVIDIA A100-SXM4-80GB", (8, 0), 80),
    "mi300x": _amd("AMD Instinct MI300X", "gfx942", 192),
    "mi355x": _amd("AMD Instinct MI355X", "gfx950", 288),
    "radeon-7900xtx": _amd("AMD Radeon RX 7900 XTX", "gfx1100", 24),
    "max-1550": _intel("Intel(R) Data Center GPU Max 1550", "pvc", 128),
    "arc-b580": _intel("Intel(R) Arc(TM) B580 Graphics", "bmg", 12),
    "graviton4": DeviceInfo(
        machine="aarch64",
        cpu_model="Neoverse-V2",
        cpu_count=96,
        cpu_flags=frozenset({"fp", "asimd", "sve", "sve2", "bf16", "i8mm", "svebf16"}),
        torch=TorchBuild("2.13.0"),
        libraries=(("torch", "2.13.0"),),
        facts=(("cpu-arm-acl.onednn_acl", "yes"), ("cpu-arm-acl.onednn_version", "3.9.0")),
    ),
    "graviton4-no-acl": DeviceInfo(
        machine="aarch64",
        cpu_model="Neoverse-V2",
        cpu_count=96,
        cpu_flags=frozenset({"fp", "asimd", "sve", "sve2", "bf16", "i8mm"}),
        torch=TorchBuild("2.13.0"),
        libraries=(("torch", "2.13.0"),),
    ),
    "xeon-cpu": DeviceInfo(
        machine="x86_64",
        cpu_model="Intel(R) Xeon(R) Platinum 8480+",
        cpu_count=2,
        cpu_flags=_XEON,
        torch=TorchBuild("2.13.0+cpu"),
        libraries=(("torch", "2.13.0"),),
    ),
}


def machine(name_or_path: str) -> DeviceInfo:
    """A named example, or a DeviceInfo JSON file."""
    if name_or_path in MACHINES:
        return MACHINES[name_or_path]
    return DeviceInfo.from_json_file(name_or_path)

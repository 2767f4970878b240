"""What the CPU described by a ``DeviceInfo`` gives oneDNN: pure functions of its flags."""

from __future__ import annotations

from plugin_api.device_info import DeviceInfo

ARM = ("aarch64", "arm64")
X86 = ("x86_64", "AMD64")


def isa_name(info: DeviceInfo) -> str:
    """The best matrix ISA oneDNN would use, as users know it (AMX, AVX-512, AVX2, SVE, ...)."""
    f = info.cpu_flags
    if info.machine in ARM:
        parts = [n for n, flag in (("SVE2", "sve2"), ("SVE", "sve"), ("BF16", "bf16")) if flag in f]
        parts += ["I8MM"] if "i8mm" in f else []
        return "/".join(parts) or "NEON"
    if "amx_bf16" in f:
        return "AMX"
    if "avx512f" in f:
        return "AVX-512 with BF16" if "avx512_bf16" in f else "AVX-512"
    if "avx2" in f:
        return "AVX2"
    return "no AVX2"


AMX_FLAGS = frozenset({"amx_tile", "amx_bf16"})


def amx(info: DeviceInfo) -> bool:
    """Whether the CPU has AMX tiles with bf16 (oneDNN's and torch's brgemm use them)."""
    return info.cpu_flags >= AMX_FLAGS


def bf16_matmul(info: DeviceInfo) -> bool:
    """Whether oneDNN has a bf16 matmul kernel for this CPU.

    x86: oneDNN needs AVX-512 (avx512_core), AMX or AVX-NE-CONVERT; with AVX2 alone every
    bf16 matmul implementation reports "unsupported isa". Arm: ACL's bf16 kernels need FEAT_BF16.
    """
    f = info.cpu_flags
    if info.machine in ARM:
        return "bf16" in f
    return bool({"amx_bf16", "avx512_bf16", "avx_ne_convert"} & f or {"avx512f", "avx512bw"} <= f)


def int8_matmul_exact(info: DeviceInfo) -> bool:
    """Whether oneDNN's s8 x s8 matmul is exact for full-range int8 weights here.

    x86 without VNNI/AMX computes u8 x s8 pairs with vpmaddubsw, whose int16 intermediate
    saturates (measured: errors of 4e4 on random int8 data). Arm (sdot/i8mm) accumulates in
    int32 directly.
    """
    if info.machine in ARM:
        return True
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & info.cpu_flags)


def panel_isa(info: DeviceInfo) -> str:
    """The best panel-GEMM kernel family for this CPU: ``avx2`` (AVX2, FMA and F16C intrinsics)
    on x86-64 with those flags, else ``generic`` (torch's at::vec: NEON on Arm)."""
    if info.machine in X86 and {"avx2", "fma", "f16c"} <= info.cpu_flags:
        return "avx2"
    return "generic"


def quant_isa(info: DeviceInfo) -> str:
    """The widest vector path of the group-quant kernel for this CPU (built as the GEMM variant
    this CPU loads): ``avx512`` (AVX-512 F/BW/VL, with AVX2 for the rest of a group), ``avx2``
    (AVX2, FMA, F16C), ``neon`` (every aarch64 CPU), else ``scalar`` (compiler-vectorised C++);
    group_quant.cpp's PA_AVX512, PA_AVX2 and PA_NEON."""
    if info.machine in ARM:
        return "neon"
    avx2 = {"avx2", "fma", "f16c"}
    if info.machine in X86 and avx2 | {"avx512f", "avx512bw", "avx512vl"} <= info.cpu_flags:
        return "avx512"
    if info.machine in X86 and avx2 <= info.cpu_flags:
        return "avx2"
    return "scalar"


def f32_panel(info: DeviceInfo) -> bool:
    """Whether fp32 weights go to the panel GEMM: x86 with AVX2 but no AVX-512, where oneDNN 3.2
    has only its jit sgemm for f32 (``gemm:jit:f32``), a third of the panel kernel's speed at a
    decode step's few rows (docs/measurements/cpu-arm-acl/2026-12-06-xeon-avx2-capped.md)."""
    return panel_isa(info) == "avx2" and "avx512f" not in info.cpu_flags


def int8_panel_exact(info: DeviceInfo) -> bool:
    """Whether the panel GEMM has an exact int8 kernel here: AVX2's vpmaddwd on int8 widened to
    int16 sums pairs into int32, so nothing saturates. Other ISAs have none (Arm: oneDNN's int8
    matmul is exact, see ``int8_matmul_exact``)."""
    return panel_isa(info) == "avx2"

"""Is this an Arm CPU with an ACL-enabled oneDNN (validated), or an x86 CPU that runs the same
oneDNN code with x86 kernels (experimental)? Pure: reads the ``DeviceInfo`` and the oneDNN facts
that ``hooks.plugin_api_machine_facts`` put there."""

from __future__ import annotations

from plugin_api.contract import Availability
from plugin_api.device_info import DeviceInfo

from . import kernel_probe, native, pages, prebuilt
from .isa import ARM, X86, bf16_matmul, int8_matmul_exact, isa_name
from .locate import FACT_ACL, FACT_MISSING, FACT_ROOT, FACT_VERSION
from .settings import ROOT


def probe(info: DeviceInfo) -> Availability:
    if info.torch is None:
        return Availability.unavailable("torch is not installed")
    if info.machine not in ARM + X86:
        return Availability.unavailable(f"{info.machine}: not an Arm or x86-64 CPU")
    isa = isa_name(info)
    refused = _prebuilt_refused(info)
    if refused is not None:
        return Availability.unavailable(f"{info.cpu_model} ({isa}): {refused}")
    version = info.fact(FACT_VERSION)
    if version is None:
        why = info.fact(FACT_MISSING) or "oneDNN library not found (no facts about it)"
        if info.machine in ARM:
            why = f"no ACL-enabled oneDNN found ({why}); build oneDNN with ACL, set {ROOT}"
        return Availability.unavailable(f"{info.cpu_model} ({isa}): {why}")
    onednn = f"oneDNN {version} at {info.fact(FACT_ROOT) or '?'}"
    failed = info.fact(kernel_probe.FACT_ERROR)
    if failed is not None:
        return Availability.unavailable(f"{info.cpu_model} ({isa}): {onednn} failed: {failed}")
    kernels = [line] if (line := kernel_probe.describe(info)) else []
    kernels += [line] if (line := _native_origin(info)) else []
    kernels += [line] if (line := pages.describe(info)) else []
    if info.machine in ARM:
        if info.fact(FACT_ACL) == "yes":
            slow = kernel_probe.slow_bf16(info) if bf16_matmul(info) else None
            why = kernel_probe.why_not(info, slow) if slow else ""
            panel = [f"bf16 GEMMs run the plugin's panel kernels: {why}"] if slow else []
            return Availability.validated(
                "cpu", f"{info.cpu_model} ({isa}) with ACL-enabled {onednn}", *kernels, *panel
            )
        return Availability.unavailable(
            f"{info.cpu_model} ({isa}): {onednn} was built without ACL; build oneDNN with ACL "
            f"and point {ROOT} at it"
        )
    if isa == "no AVX2":
        return Availability.unavailable(f"{info.cpu_model}: oneDNN needs at least AVX2")
    bf16 = (
        "bf16 matmuls run oneDNN bf16 kernels"
        if kernel_probe.onednn_bf16(info)
        else "no oneDNN bf16 kernel on this ISA: bf16 GEMMs run the plugin's panel kernels "
        "(bf16 weights widened in registers, fp32 accumulation)"
    )
    int8 = (
        "int8 matmuls run oneDNN s8 kernels (exact with VNNI/AMX)"
        if int8_matmul_exact(info)
        else "int8 GEMMs run the plugin's exact panel kernel (oneDNN's s8 matmul saturates "
        "without VNNI)"
    )
    return Availability.experimental(
        "cpu",
        f"{info.cpu_model} ({isa}): {onednn}, x86 kernels; validated target is aarch64 with ACL",
        bf16,
        int8,
        *kernels,
    )


def _prebuilt_refused(info: DeviceInfo) -> str | None:
    """Why the wheel's prebuilt libraries cannot load into the torch ``info`` describes."""
    if info.fact(prebuilt.FACT_NATIVE) != "prebuilt" or info.torch is None:
        return None
    error = info.fact(prebuilt.FACT_MANIFEST_ERROR)
    if error is not None:
        return error
    built = info.fact(prebuilt.FACT_BUILT_TORCH)
    if built is None:
        return f"the installed wheel records no torch version; {prebuilt.reinstall()}"
    onednn = info.fact(prebuilt.FACT_BUILT_ONEDNN)
    found = info.fact(FACT_VERSION)
    if (
        onednn is not None
        and found is not None
        and (why := prebuilt.onednn_mismatch(onednn, found))
    ):
        return why
    abi = info.fact(prebuilt.FACT_TORCH_ABI)
    built_abi = info.fact(prebuilt.FACT_BUILT_ABI) == "1"
    torch_abi = None if abi is None else abi == "1"
    return prebuilt.mismatch(built, built_abi, info.torch.version, torch_abi)


def _native_origin(info: DeviceInfo) -> str | None:
    """One line: the kernels come from the wheel, or are compiled here on first use, and the
    GEMM level either runs on this CPU (a wheel loads it; a development build compiles it)."""
    origin = info.fact(prebuilt.FACT_NATIVE)
    if origin == "prebuilt":
        line = f"native kernels prebuilt for torch {info.fact(prebuilt.FACT_BUILT_TORCH)} (wheel)"
    elif origin == "jit":
        line = prebuilt.JIT_NOTE
    else:
        return None
    level = native.best(native.GEMM_VARIANTS, info.machine, info.cpu_flags)
    built = f"{level.name}: {level.summary}" if level else "-march=native (no level fits)"
    return f"{line}; GEMM level {built}"

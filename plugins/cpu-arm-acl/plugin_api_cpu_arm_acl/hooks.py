"""pluggy hookimpls of the ``cpu-arm-acl`` backend. Light: heavy modules load inside the hooks."""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from pathlib import Path

from plugin_api.contract import Availability, OpFamily
from plugin_api.device_info import DeviceInfo
from plugin_api.hookspecs import hookimpl

from . import cpu_family, locate, settings
from .probe import probe


@hookimpl
def plugin_api_machine_facts() -> Mapping[str, str]:
    found = locate.facts(settings.read().root) | cpu_family.facts()
    if locate.FACT_LIBRARY in found:  # and which kernels oneDNN picks (a few ms; no compiling)
        from . import kernel_probe
        from .matmul_form import MatmulForm

        form = MatmulForm.for_machine(platform.machine())
        found |= kernel_probe.facts(Path(found[locate.FACT_LIBRARY]), form)
    return found


@hookimpl
def plugin_api_probe(info: DeviceInfo) -> Availability:
    return probe(info)


@hookimpl
def plugin_api_implementations(family: OpFamily) -> Sequence[object]:
    s = settings.read()
    if family is OpFamily.ATTENTION:
        from .attention import CpuPagedAttention

        return (CpuPagedAttention(matrix=s.attention_matrix, prefetch=s.attention_prefetch),)
    if family is OpFamily.GEMM:
        from .gemm import OneDnnGemm
        from .panel_gemm import PanelGemm

        return (
            OneDnnGemm(policy=s.lm_head, threads=s.threads, gemv=s.gemv),
            PanelGemm(policy=s.panel, threads=s.threads),
        )
    if family is OpFamily.QUANT:
        from .quant import NativeGroupQuant

        return (NativeGroupQuant(threads=s.threads),)
    raise ValueError(f"cpu-arm-acl provides no {family} implementations")

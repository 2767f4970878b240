"""The machine a benchmark ran on, as recorded beside its figures."""

from __future__ import annotations

import platform
import re
from typing import Any

import torch

from .._version import __version__
from ..backend import Backend

# the instruction-set extensions that decide which kernels can run (x86 and Arm names)
_ISA = re.compile(r"^(sse|ssse|avx|amx|fma|f16c|asimd|sve|sme(\d|_|$)|bf16|i8mm|fphp|dotprod)")


def isa_flags(flags: frozenset[str]) -> list[str]:
    return sorted(f for f in flags if _ISA.match(f))


def describe_machine(backend: Backend) -> dict[str, Any]:
    info = backend.info
    device = backend.device_type
    gpus = [a.name for a in info.accelerators if a.torch_device == device]
    return {
        "cpu_model": info.cpu_model,
        "arch": info.machine,
        "cpu_count": info.cpu_count,
        "isa_flags": isa_flags(info.cpu_flags),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": torch.version.hip,
        "gpu": gpus[0] if gpus else None,
        "python": platform.python_version(),
        "plugin_api": __version__,
        "device": device,
    }

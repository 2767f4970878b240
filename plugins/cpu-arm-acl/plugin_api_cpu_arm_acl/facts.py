"""The machine facts the probe needs and ``DeviceInfo`` lacks: where oneDNN is and how it was
built, the CPU family, the THP mode, and which kernels that oneDNN picks here (a few ms;
nothing compiles)."""

from __future__ import annotations

import platform
from pathlib import Path

from . import cpu_family, locate, pages, prebuilt, settings


def read() -> dict[str, str]:
    found = locate.facts(settings.read().root) | cpu_family.facts() | prebuilt.facts()
    found |= pages.facts()
    if locate.FACT_LIBRARY in found:
        from . import kernel_probe
        from .matmul_form import MatmulForm

        form = MatmulForm.for_machine(platform.machine())
        found |= kernel_probe.facts(Path(found[locate.FACT_LIBRARY]), form)
    return found

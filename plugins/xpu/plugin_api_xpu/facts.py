"""What only the real machine can tell about the XPU stack, for ``DeviceInfo.facts``.

Read through the ``plugin_api_machine_facts`` hook on the real machine (never for what-if).
Each value is ``"yes: <detail>"`` or ``"no: <detail>"``. torch is imported inside ``read``; the
device is touched only when torch reaches an XPU.
"""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

from plugin_api.device_info import installed_version

GRAPH_CAPTURE = "xpu.graph_capture"
MM_OUT_DTYPE = "xpu.mm_out_dtype"
IPEX_IMPORT = "xpu.ipex_import"
IPEX = "intel-extension-for-pytorch"
_IPEX_IMPORT_SECONDS = 8.0  # inside the host's probe timeout


def minor(version: str) -> str:
    """``"2.13"`` from ``"2.13.0+xpu"``."""
    return ".".join(version.split("+")[0].split(".")[:2])


def read() -> dict[str, str]:
    import torch

    found = {GRAPH_CAPTURE: _graph_capture(torch), MM_OUT_DTYPE: _mm_out_dtype(torch)}
    ipex = installed_version(IPEX)
    if ipex is not None and minor(ipex) == minor(torch.__version__):
        found[IPEX_IMPORT] = _ipex_imports()
    return found


def _graph_capture(torch: ModuleType) -> str:
    v = torch.__version__
    if not getattr(torch._C, "_has_xpu", False):
        # in a build without XPU, torch.xpu.XPUGraph exists but is a placeholder type
        return f"no: torch {v} is built without XPU"
    if not hasattr(torch.xpu, "XPUGraph"):
        return f"no: torch {v} has no torch.xpu.XPUGraph"
    return f"yes: torch {v} provides torch.xpu.XPUGraph"


def _mm_out_dtype(torch: ModuleType) -> str:
    from plugin_api.reference.gemm import has_out_dtype_mm

    v = torch.__version__
    if not torch.xpu.is_available():
        return f"no: no XPU device to try it on (torch {v})"
    if has_out_dtype_mm(torch.device("xpu")):
        return f"yes: torch {v} computes it"
    return f"no: torch {v} raises for it on xpu"


def _ipex_imports() -> str:
    """Does the installed IPEX import? In a child process: a broken extension (undefined
    symbols) can neither take this process down nor stay loaded in it."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", "import intel_extension_for_pytorch"],
            capture_output=True,
            text=True,
            timeout=_IPEX_IMPORT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return f"no: importing it took over {_IPEX_IMPORT_SECONDS:g} s"
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines() or [f"exit code {r.returncode}"]
        return f"no: {lines[-1]}"
    return "yes: imports cleanly"

"""What only the real machine can tell about the XPU stack, for ``DeviceInfo.facts``.

Read through the ``plugin_api_machine_facts`` hook on the real machine (never for what-if).
Graph capture and ``torch.mm(out_dtype=...)`` are the host's trials (``plugin_api.gpu.torch_facts``,
keys ``xpu.graph_capture`` and ``xpu.mm_out_dtype``); whether an installed IPEX imports is this
plugin's own. Each value is ``"yes: <detail>"`` or ``"no: <detail>"``.
"""

from __future__ import annotations

import subprocess
import sys

from plugin_api.device_info import installed_version
from plugin_api.gpu.platforms import XPU
from plugin_api.gpu.torch_facts import GRAPH_CAPTURE, MM_OUT_DTYPE, TorchFacts

FACTS = TorchFacts("xpu", XPU)
IPEX_IMPORT = "xpu.ipex_import"
IPEX = "intel-extension-for-pytorch"
_IPEX_IMPORT_SECONDS = 8.0  # inside the host's probe timeout


def minor(version: str) -> str:
    """``"2.13"`` from ``"2.13.0+xpu"``."""
    return ".".join(version.split("+")[0].split(".")[:2])


def read() -> dict[str, str]:
    import torch

    found = FACTS.read(GRAPH_CAPTURE, MM_OUT_DTYPE)
    ipex = installed_version(IPEX)
    if ipex is not None and minor(ipex) == minor(torch.__version__):
        found[IPEX_IMPORT] = _ipex_imports()
    return found


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

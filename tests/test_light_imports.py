"""Descriptors and selection import nothing heavy (checked in fresh interpreters)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("triton", "flashinfer", "intel_extension_for_pytorch", "torch.utils.cpp_extension")
CHECK = """
import json, sys
import importlib_metadata
{body}
heavy = {heavy!r}
loaded = sorted(
    m for m in sys.modules
    if any(m == h or m.startswith(h + ".") for h in heavy)
    or (m.startswith("plugin_api") and m.endswith("._C"))
)
print(json.dumps(loaded))
"""


def run(body: str) -> list[str]:
    code = CHECK.format(body=body, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_descriptor_is_light():
    body = """
import importlib
eps = importlib_metadata.entry_points(group="plugin_api.backends")
assert {"reference", "cpu-arm-acl", "xpu", "cuda-sm90", "rocm"} <= {e.name for e in eps}
for ep in eps:
    importlib.import_module(ep.value)
assert "torch" not in sys.modules, "a descriptor imported torch"
"""
    assert run(body) == []


def test_selection_imports_no_plugin_heavy_module():
    body = """
import plugin_api
assert "torch" not in sys.modules, "import plugin_api must stay light"
sel = plugin_api.select_backend()
assert sel.backend == "reference", sel
assert "plugin_api.triton" not in sys.modules, "the Triton kernels load only for their backend"
"""
    assert run(body) == []


def test_what_if_planning_of_the_gpu_plugins_imports_no_triton():
    """Listing and asking every implementation of the GPU plugins, as a what-if doctor does,
    imports neither triton nor flashinfer: kernels load when one first runs."""
    body = """
from plugin_api.contract import OpFamily
from plugin_api.machines import MACHINES
from plugin_api.cli.model_specs import MODELS
from plugin_api_cuda_sm90.hooks import HOOKS as cuda_hooks
from plugin_api_rocm.hooks import HOOKS as rocm_hooks
from plugin_api_xpu.hooks import HOOKS as xpu_hooks
for plugin, name in ((cuda_hooks, "h200"), (rocm_hooks, "mi300x"), (xpu_hooks, "max-1550")):
    info = MACHINES[name]
    for model in MODELS:
        for layer in model.layers:
            for impl in plugin.plugin_api_implementations(layer.family):
                impl.supports(layer.spec, info)
                if layer.family is OpFamily.ATTENTION:
                    impl.graph_support(layer.spec, info)
"""
    assert run(body) == []

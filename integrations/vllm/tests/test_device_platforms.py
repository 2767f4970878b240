"""The bridge's CUDA, ROCm and XPU platform and worker classes against vLLM's real ones.

vLLM's CPU wheel cannot import its GPU platform modules as installed, but what they miss is only
third-party native code, never Python of vLLM's: ``vllm._C_stable_libtorch`` (CUDA's compiled
kernels), ``vllm_xpu_kernels`` (Intel's kernel package) and ``amdsmi`` (AMD's device library,
queried at import for the GPU's architecture). A subprocess puts an empty module in place of each
kernel library, and for ``amdsmi`` one that reports a single gfx942 (MI300X) GPU, each only where
the real one is not importable; then it imports vLLM's modules and ours as they are, and checks:

- our platform's MRO is (ours, ``BridgePlatform``, vLLM's class, ...);
- every method ``BridgePlatform`` defines exists on vLLM's class (for CUDA, on both classes vLLM
  picks between at import), of the same kind, and our signature binds every call vLLM's own
  signature allows; its class attributes shadow nothing of vLLM's;
- ``vllm_worker`` is the worker class string vLLM's ``check_and_update_config`` sets, read from
  that method's source; it and ``bridge_worker`` resolve, and our worker's MRO is (ours,
  ``BridgeWorker``, that vLLM worker, ...);
- every method ``BridgeWorker`` overrides exists on vLLM's worker with a compatible signature, the
  ones it adds exist nowhere in vLLM's worker, and the attributes it declares are set by it.

The same checks run on deliberately broken variants (a wrong worker string, a narrowed or renamed
method, a swapped MRO, a misspelled worker attribute), which must each be reported, so none of them
passes by construction. The probe is this file run as a script (``python test_device_platforms.py``
prints its findings as JSON), so no stand-in reaches pytest's own process.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import itertools
import json
import subprocess
import sys
import textwrap
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from plugin_api_vllm.platforms.bridge import BridgePlatform

pytestmark = pytest.mark.needs_vllm


@dataclass(frozen=True)
class Device:
    vllm_module: str
    vllm_class: str  # the name our platform module imports from vllm_module
    # classes vLLM may bind vllm_class to at import (CUDA: with or without NVML); each must fit
    vllm_alternatives: tuple[str, ...]
    ours: str


DEVICES = {
    "cuda": Device(
        "vllm.platforms.cuda",
        "CudaPlatform",
        ("NvmlCudaPlatform", "NonNvmlCudaPlatform"),
        "plugin_api_vllm.platforms.cuda.CudaPlatform",
    ),
    "rocm": Device(
        "vllm.platforms.rocm", "RocmPlatform", (), "plugin_api_vllm.platforms.rocm.RocmPlatform"
    ),
    "xpu": Device(
        "vllm.platforms.xpu", "XPUPlatform", (), "plugin_api_vllm.platforms.xpu.XpuPlatform"
    ),
}

# Methods BridgeWorker adds (reached through collective_rpc); all its others override vLLM's.
ADDED_BY_BRIDGE_WORKER = frozenset({"plugin_api_report"})

EMPTY_NATIVE_MODULES = (
    "vllm._C_stable_libtorch",
    "vllm_xpu_kernels",
    "vllm_xpu_kernels._C",
    "vllm_xpu_kernels._moe_C",
    "vllm_xpu_kernels._xpu_C",
)


# --- the probe: runs in a subprocess (python this_file), so no stand-in reaches pytest's process


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _amdsmi_one_mi300x() -> types.ModuleType:
    """AMD's device library answering what vLLM's ROCm module asks at import: one gfx942 GPU."""

    class AmdSmiException(Exception):
        pass

    def not_here(*args: Any, **kwargs: Any) -> Any:
        raise AmdSmiException("no AMD GPU on this machine")

    answers: dict[str, Any] = {
        "AmdSmiException": AmdSmiException,
        "AmdSmiMemoryType": types.SimpleNamespace(VRAM=0),
        "amdsmi_init": lambda *args: None,
        "amdsmi_shut_down": lambda *args: None,
        "amdsmi_get_processor_handles": lambda: ["gpu0"],
        "amdsmi_get_gpu_asic_info": lambda handle: {"target_graphics_version": "gfx942"},
        "amdsmi_get_gpu_device_uuid": not_here,
        "amdsmi_get_gpu_memory_total": not_here,
        "amdsmi_topo_get_link_type": not_here,
        "amdsmi_topo_get_numa_node_number": not_here,
    }
    amd = types.ModuleType("amdsmi")
    for name, value in answers.items():
        setattr(amd, name, value)
    return amd


def stand_in_native_modules() -> list[str]:
    """Put the third-party native pieces the CPU wheel lacks in place; returns their names."""
    used = []
    # On a CPU without AVX-512 BF16, vLLM's CPU platform loads its kernels from _C_AVX2 or
    # _C_AVX512 (Python gets no module from them, torch gets the ops in torch.ops._C); loading
    # _C.abi3.so after them, as `import vllm._C` in the ROCm module does, aborts the process
    # (one TORCH_LIBRARY per namespace). So this machine's kernels load first, as at vLLM's
    # start, and vllm._C then names the ones loaded.
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    if "vllm._C" not in sys.modules:
        sys.modules["vllm._C"] = types.ModuleType("vllm._C")
        used.append("vllm._C")
    for name in EMPTY_NATIVE_MODULES:
        if name not in sys.modules and not _importable(name):
            sys.modules[name] = types.ModuleType(name)
            used.append(name)
    if not _importable("amdsmi"):
        sys.modules["amdsmi"] = _amdsmi_one_mi300x()
        used.append("amdsmi")
    return used


def resolve(qualname: str) -> Any:
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _signature(raw: Any) -> inspect.Signature:
    """The signature a caller sees: without ``cls``/``self`` for class and instance methods."""
    fn = raw.__func__ if isinstance(raw, classmethod | staticmethod) else raw
    sig = inspect.signature(fn)
    if isinstance(raw, staticmethod):
        return sig
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def call_shapes(sig: inspect.Signature) -> Iterator[tuple[list[str], list[str]]]:
    """Every call ``sig`` accepts, as (positional names, keyword names): the first k parameters
    positionally, then each choice of the remaining optional ones by keyword."""
    params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    only_positional = sum(p.kind == p.POSITIONAL_ONLY for p in params)
    for k in range(only_positional, len(positional) + 1):
        rest = params[k:]
        required = [p.name for p in rest if p.default is p.empty]
        optional = [p.name for p in rest if p.default is not p.empty]
        for n in range(len(optional) + 1):
            for chosen in itertools.combinations(optional, n):
                yield [p.name for p in params[:k]], required + list(chosen)


def method_problems(ours: dict[str, Any], theirs: type, where: str) -> list[str]:
    """``ours``: raw class-dict entries (functions, classmethods) meant to override ``theirs``."""
    out = []
    for name, raw in ours.items():
        try:
            vllm_raw = inspect.getattr_static(theirs, name)
        except AttributeError:
            out.append(f"{where}: {name} is not defined by vLLM's {theirs.__qualname__}")
            continue
        if type(raw) is not type(vllm_raw):
            out.append(
                f"{where}: {name} is a {type(raw).__name__} here, "
                f"a {type(vllm_raw).__name__} in vLLM's {theirs.__qualname__}"
            )
            continue
        ours_sig, vllm_sig = _signature(raw), _signature(vllm_raw)
        for args, kwargs in call_shapes(vllm_sig):
            try:
                ours_sig.bind(*args, **{k: k for k in kwargs})
            except TypeError as e:
                shown = ", ".join([*args, *(f"{k}=..." for k in kwargs)])
                out.append(
                    f"{where}: vLLM's {theirs.__qualname__}.{name}{vllm_sig} accepts "
                    f"({shown}); ours{ours_sig} does not: {e}"
                )
    return out


def own_methods(mixin: type) -> dict[str, Any]:
    return {
        name: raw
        for name, raw in vars(mixin).items()
        if not name.startswith("__") and isinstance(raw, types.FunctionType | classmethod)
    }


def mro_problems(cls: type, mixin: type, base: type) -> list[str]:
    got = cls.__mro__[1:3]
    if got != (mixin, base):
        names = [c.__qualname__ for c in cls.__mro__]
        return [
            f"{cls.__qualname__}'s MRO is {names}: expected {mixin.__qualname__}, then vLLM's "
            f"{base.__qualname__}, right after it"
        ]
    return []


def worker_set_by_vllm(platform: type) -> list[str]:
    """The string constants vLLM's check_and_update_config assigns to ``*.worker_cls``."""
    owner = next(c for c in platform.__mro__ if "check_and_update_config" in vars(c))
    fn = vars(owner)["check_and_update_config"].__func__
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return sorted(
        {
            node.value.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and any(isinstance(t, ast.Attribute) and t.attr == "worker_cls" for t in node.targets)
        }
    )


def worker_string_problems(vllm_worker: str, platform: type) -> list[str]:
    set_by_vllm = worker_set_by_vllm(platform)
    if set_by_vllm != [vllm_worker]:
        return [
            f"vllm_worker={vllm_worker!r}; vLLM's {platform.__qualname__}."
            f"check_and_update_config sets worker_cls to {set_by_vllm}"
        ]
    return []


def assigned_self_attributes(cls: type) -> set[str]:
    """Attributes ``self.X = ...`` (or annotated) assigned anywhere in ``cls`` and its bases."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            names |= {
                t.attr
                for t in targets
                if isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            }
    return names


def worker_problems(worker: type, mixin: type, vllm_worker: type) -> list[str]:
    out = mro_problems(worker, mixin, vllm_worker)
    methods = own_methods(mixin)
    overrides = {n: m for n, m in methods.items() if n not in ADDED_BY_BRIDGE_WORKER}
    out += method_problems(overrides, vllm_worker, worker.__qualname__)
    for name in sorted(ADDED_BY_BRIDGE_WORKER & methods.keys()):
        if hasattr(vllm_worker, name):
            out.append(
                f"{mixin.__qualname__}.{name} would shadow vLLM's {vllm_worker.__qualname__}"
            )
    return out + attribute_problems(mixin, vllm_worker)


def attribute_problems(mixin: type, vllm_worker: type) -> list[str]:
    """The attributes the mixin declares (and reads) must be set by vLLM's worker."""
    missing = set(vars(mixin).get("__annotations__", {})) - assigned_self_attributes(vllm_worker)
    return [
        f"{mixin.__qualname__} reads self.{n}; vLLM's {vllm_worker.__qualname__} never sets it"
        for n in sorted(missing)
    ]


def platform_problems(ours: type[BridgePlatform], mixin: type, device: Device) -> list[str]:
    module = importlib.import_module(device.vllm_module)
    vllm_cls = getattr(module, device.vllm_class)
    out = mro_problems(ours, mixin, vllm_cls)
    methods = own_methods(mixin)
    for theirs in {vllm_cls, *(getattr(module, n) for n in device.vllm_alternatives)}:
        out += method_problems(methods, theirs, ours.__qualname__)
    for name in vars(mixin):
        if not name.startswith("__") and name not in methods and hasattr(vllm_cls, name):
            out.append(f"{mixin.__qualname__}.{name} shadows vLLM's {vllm_cls.__qualname__}.{name}")
    out += worker_string_problems(ours.vllm_worker, vllm_cls)
    try:
        vllm_worker, worker = resolve(ours.vllm_worker), resolve(ours.bridge_worker)
    except (ImportError, AttributeError) as e:
        return [*out, f"worker classes of {ours.__qualname__} do not resolve: {e!r}"]
    from plugin_api_vllm.workers.bridge import BridgeWorker

    return out + worker_problems(worker, BridgeWorker, vllm_worker)


def broken_variants(mixin: type, device: Device) -> dict[str, list[str]]:
    """What the checks report for deliberately wrong versions of ours: each must be non-empty."""
    from plugin_api_vllm.workers.bridge import BridgeWorker

    vllm_cls = getattr(importlib.import_module(device.vllm_module), device.vllm_class)
    vllm_worker = resolve(worker_set_by_vllm(vllm_cls)[0])  # vLLM's, whatever ours says

    def narrowed(cls: Any, selected_backend: Any, config: Any) -> str:
        return ""

    def load_model(self: Any, dummy: bool) -> None:
        pass

    swapped = type("Swapped", (vllm_cls, mixin), {})
    return {
        "worker string": worker_string_problems("vllm.v1.worker.gpu_worker.WorkerV2", vllm_cls),
        "narrowed get_attn_backend_cls": method_problems(
            {"get_attn_backend_cls": classmethod(narrowed)}, vllm_cls, "broken"
        ),
        "renamed get_attn_backend_cls": method_problems(
            {"get_attn_backend_class": classmethod(narrowed)}, vllm_cls, "broken"
        ),
        "classmethod made a plain method": method_problems(
            {"check_and_update_config": vars(mixin)["check_and_update_config"].__func__},
            vllm_cls,
            "broken",
        ),
        "platform MRO": mro_problems(swapped, mixin, vllm_cls),
        "narrowed load_model": method_problems({"load_model": load_model}, vllm_worker, "broken"),
        "worker attribute renamed": attribute_problems(
            type("Reader", (), {"__annotations__": {"model_runnr": "Any"}}), vllm_worker
        ),
        "worker MRO": mro_problems(
            type("W", (vllm_worker, BridgeWorker), {}), BridgeWorker, vllm_worker
        ),
    }


def probe() -> dict[str, Any]:
    # vLLM picks this machine's platform (CPU) first, with nothing stood in: its ROCm detection
    # asks amdsmi too, and must not find the stand-in's GPU
    from vllm.platforms import current_platform

    assert current_platform.device_type, "vLLM found no platform for this machine"
    stand_ins = stand_in_native_modules()
    from plugin_api_vllm.platforms.bridge import BridgePlatform

    out: dict[str, Any] = {"stand_ins": stand_ins}
    for name, device in DEVICES.items():
        try:
            ours = resolve(device.ours)
            out[name] = {
                "problems": platform_problems(ours, BridgePlatform, device),
                "broken": broken_variants(BridgePlatform, device),
            }
        except Exception:  # reported per device: the others are still checked
            out[name] = {"problems": [traceback.format_exc()], "broken": {}}
    return out


# --- the tests


@pytest.fixture(scope="module")
def probed(env: Callable[..., dict[str, str]]) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, str(Path(__file__))],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-6000:]
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_platform_and_worker_fit_vllm(probed: dict[str, Any], device: str) -> None:
    problems = probed[device]["problems"]
    assert problems == [], "\n".join([*problems, f"stood in: {probed['stand_ins']}"])


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_checks_report_broken_variants(probed: dict[str, Any], device: str) -> None:
    broken = probed[device]["broken"]
    assert broken, "\n".join(probed[device]["problems"])
    unnoticed = [variant for variant, problems in broken.items() if not problems]
    assert unnoticed == [], f"checks passed these deliberately broken variants: {unnoticed}"


if __name__ == "__main__":
    print(json.dumps(probe()))

"""The native libraries a wheel carries (``_prebuilt/``), compiled when the wheel was built.

A wheel holds, per ISA variant, the GEMM/quant extension and the attention kernels, and a
``manifest.json`` naming the torch they were compiled against. They load only into that torch
(same release, same C++ ABI): any other makes the probe report the backend unavailable with
the reason, and loading raises it; nothing is rebuilt. A source tree or an editable install has
no ``_prebuilt/``: its kernels are compiled on first use (``build.py``, ``_attention_ext.py``).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from packaging.version import InvalidVersion, Version

from plugin_api.errors import PluginApiError

from . import native
from .native import Manifest
from .settings import ROOT

DIRECTORY = Path(__file__).parent / native.PREBUILT_DIR
MANIFEST = DIRECTORY / "manifest.json"
DISTRIBUTION = "plugin-api-cpu-arm-acl"

FACT_NATIVE = "cpu-arm-acl.native"  # "prebuilt" or "jit"
FACT_BUILT_TORCH = "cpu-arm-acl.built_for_torch"
FACT_BUILT_ABI = "cpu-arm-acl.built_cxx11_abi"
FACT_BUILT_ONEDNN = "cpu-arm-acl.built_for_onednn"
FACT_TORCH_ABI = "cpu-arm-acl.torch_cxx11_abi"
FACT_MANIFEST_ERROR = "cpu-arm-acl.manifest_error"
JIT_NOTE = "development install: kernels built on first use (JIT)"


class PrebuiltMismatch(PluginApiError):
    """The wheel's libraries were compiled for another torch, or its manifest is unreadable."""


def gemm_library(variant: str) -> Path:
    return DIRECTORY / native.gemm_library_name(variant)


def attention_library(variant: str) -> Path:
    return DIRECTORY / native.attention_library_name(variant)


def read() -> Manifest | None:
    """The installed wheel's manifest; None when the package has no prebuilt libraries."""
    if not MANIFEST.is_file():
        return None
    try:
        return Manifest.from_json(MANIFEST.read_text())
    except ValueError as e:
        raise PrebuiltMismatch(
            f"cpu-arm-acl: {MANIFEST}: unreadable manifest ({e}); {reinstall()}",
            backend="cpu-arm-acl",
        ) from e


def reinstall() -> str:
    return (
        f"install the torch it was built for, or a {DISTRIBUTION} built for this one "
        f"(pip install --force-reinstall {DISTRIBUTION})"
    )


def mismatch(built: str, built_abi: bool, torch_version: str, cxx11_abi: bool | None) -> str | None:
    """Why libraries built for torch ``built`` (``_GLIBCXX_USE_CXX11_ABI`` ``built_abi``) cannot
    load into torch ``torch_version``; None when they can: the same release (a local label such
    as ``+cpu`` does not change the C++ ABI) and the same ABI flag (``cxx11_abi`` None: not
    known)."""
    if _public(built) != _public(torch_version):
        return f"built for torch {built}, found {torch_version}; {reinstall()}"
    if cxx11_abi is not None and cxx11_abi != built_abi:
        return (
            f"built for torch {built} with _GLIBCXX_USE_CXX11_ABI={int(built_abi)}, found "
            f"{torch_version} with {int(cxx11_abi)}; {reinstall()}"
        )
    return None


def onednn_mismatch(built: str, found: str) -> str | None:
    """Why libraries compiled against oneDNN ``built``'s headers cannot run with oneDNN
    ``found`` (the wheel pins its oneDNN wheel: another comes from PLUGIN_API_ONEDNN_ROOT)."""
    if built == found:
        return None
    return (
        f"built against oneDNN {built}, found oneDNN {found}; unset {ROOT} or point it at "
        f"oneDNN {built}"
    )


def facts() -> dict[str, str]:
    """Machine facts for the probe: how the kernels get here, and what the wheel was built for."""
    try:
        manifest = read()
    except PrebuiltMismatch as e:
        return {FACT_NATIVE: "prebuilt", FACT_MANIFEST_ERROR: str(e)}
    if manifest is None:
        return {FACT_NATIVE: "jit"}
    found = {
        FACT_NATIVE: "prebuilt",
        FACT_BUILT_TORCH: manifest.torch,
        FACT_BUILT_ABI: str(int(manifest.cxx11_abi)),
        FACT_BUILT_ONEDNN: manifest.onednn,
    }
    try:
        import torch
    except ImportError:
        return found
    return found | {FACT_TORCH_ABI: str(int(torch._C._GLIBCXX_USE_CXX11_ABI))}


def check(manifest: Manifest) -> None:
    """Raise ``PrebuiltMismatch`` unless ``manifest``'s libraries fit the running torch."""
    import torch

    abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    why = mismatch(manifest.torch, manifest.cxx11_abi, torch.__version__, abi)
    if why is not None:
        raise PrebuiltMismatch(f"cpu-arm-acl: {why}", backend="cpu-arm-acl")


@functools.cache
def preload_onednn(library: Path) -> None:
    """Load libdnnl from the installed oneDNN wheel, global, so that a prebuilt GEMM library's
    ``libdnnl.so.3`` dependency resolves to it wherever that wheel put it (no rpath can know)."""
    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)


def load_library(library: Path) -> None:
    """``torch.ops.load_library`` of one prebuilt library, its absence named as a broken install."""
    import torch

    if not library.is_file():
        raise PrebuiltMismatch(
            f"cpu-arm-acl: {library} is missing from the installed wheel; {reinstall()}",
            backend="cpu-arm-acl",
        )
    try:
        torch.ops.load_library(str(library))  # type: ignore[no-untyped-call]
    except OSError as e:
        raise PrebuiltMismatch(
            f"cpu-arm-acl: cannot load {library}: {e}; {reinstall()}", backend="cpu-arm-acl"
        ) from e


def _public(version: str) -> str:
    try:
        return Version(version).public
    except InvalidVersion:
        return version

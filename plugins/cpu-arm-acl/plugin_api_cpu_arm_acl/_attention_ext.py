"""The CPU attention extension (``csrc/attention.cpp``): which ISA variant fits a machine, and
building/loading it once.

One source, compiled per ISA with torch's ``at::vec`` capability macros. A build is cached under
``$XDG_CACHE_HOME/plugin-api/cpu-arm-acl`` (default ``~/.cache``) in a folder keyed by the
sources, the torch version, the ISA and its flags, so it is built once per machine and reloaded
without a compiler afterwards. A failed build raises ``ExtensionBuildError`` naming the log.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from plugin_api.device_info import DeviceInfo
from plugin_api.errors import PluginApiError

CSRC = Path(__file__).parent / "csrc"
SOURCES = ("attention.cpp",)
HEADERS = ("attention_vec.h", "attention_kernels.h")


@dataclass(frozen=True, slots=True)
class IsaPath:
    """One compiled variant: its name, the CPU flags it needs, and how it is compiled."""

    name: str
    machines: tuple[str, ...]
    needs: frozenset[str]
    cflags: tuple[str, ...]
    summary: str


# Best first. AVX-512 is the same source at 16 lanes; it is not exercised by this repo's CI.
ISA_PATHS = (
    IsaPath(
        "avx512",
        ("x86_64", "AMD64"),
        frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"}),
        (
            "-mavx512f",
            "-mavx512bw",
            "-mavx512vl",
            "-mavx512dq",
            "-mavx2",
            "-mfma",
            "-mf16c",
            "-DCPU_CAPABILITY=AVX512",
            "-DCPU_CAPABILITY_AVX512",
        ),
        "at::vec 16 x fp32 (AVX-512)",
    ),
    IsaPath(
        "avx2",
        ("x86_64", "AMD64"),
        frozenset({"avx2", "fma", "f16c"}),
        ("-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"),
        "at::vec 8 x fp32 (AVX2+FMA)",
    ),
    IsaPath(
        "neon",
        ("aarch64", "arm64"),
        frozenset({"asimd"}),
        ("-DCPU_CAPABILITY=DEFAULT",),
        "at::vec 4 x fp32 (NEON)",
    ),
)
COMMON_CFLAGS = ("-O3", "-fvisibility=hidden", "-std=c++17")


def isa_path(info: DeviceInfo) -> IsaPath | None:
    """The best variant this machine can run, from its CPU flags; None when none fits."""
    for isa in ISA_PATHS:
        if info.machine in isa.machines and isa.needs <= info.cpu_flags:
            return isa
    return None


class ExtensionBuildError(PluginApiError, RuntimeError):
    """The CPU attention extension could not be compiled or loaded."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "plugin-api" / "cpu-arm-acl"


def build_key(isa: IsaPath, torch_version: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    h.update(f"{torch_version}\0{isa.name}\0{' '.join(isa.cflags + COMMON_CFLAGS)}".encode())
    return h.hexdigest()[:16]


@functools.cache
def load(isa_name: str) -> ModuleType:
    """The extension module for ``isa_name``: loaded from the cache, else built once."""
    import torch

    isa = next(i for i in ISA_PATHS if i.name == isa_name)
    key = build_key(isa, torch.__version__)
    name = f"plugin_api_cpu_attention_{isa.name}_{key}"
    folder = cache_root() / name
    built = next(folder.glob(f"{name}*.so"), None) if folder.is_dir() else None
    if built is None:
        built = _build(isa, name, folder)
    spec = importlib.util.spec_from_file_location(
        name, built, loader=importlib.machinery.ExtensionFileLoader(name, str(built))
    )
    if spec is None or spec.loader is None:
        raise ExtensionBuildError(f"cpu-arm-acl: cannot load {built}", backend="cpu-arm-acl")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(isa: IsaPath, name: str, folder: Path) -> Path:
    from torch.utils import cpp_extension

    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "build.log"
    print(
        f"plugin-api cpu-arm-acl: building the CPU attention kernels ({isa.name}) once "
        f"into {folder}",
        file=sys.stderr,
    )
    try:
        cpp_extension.load(
            name=name,
            sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=list(COMMON_CFLAGS + isa.cflags),
            extra_include_paths=[str(CSRC)],
            build_directory=str(folder),
            verbose=False,
        )
    except Exception as e:  # the compiler's output is in the message; keep it in the log
        log.write_text(f"{type(e).__name__}: {e}\n")
        raise ExtensionBuildError(
            f"cpu-arm-acl: building the CPU attention extension ({isa.name}) failed: "
            f"{type(e).__name__}; compiler output in {log}",
            backend="cpu-arm-acl",
        ) from e
    built = next(folder.glob(f"{name}*.so"), None)
    if built is None:
        raise ExtensionBuildError(
            f"cpu-arm-acl: the build of {name} left no library in {folder}", backend="cpu-arm-acl"
        )
    return built

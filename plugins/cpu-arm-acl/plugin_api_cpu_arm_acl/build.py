"""The C++ extension (csrc/): loaded from the wheel's prebuilt libraries, else built once per
machine on first use.

A wheel carries it compiled per ISA level (``prebuilt.py``; the best level this CPU runs is
loaded, nothing is compiled). A development (editable) install builds it on first use, at the
level a wheel would load on this CPU (``host_variant``), into a per-user cache directory keyed by
the source hash, the flags, the torch version, the oneDNN version and location, and the CPU; the
first use prints one line before and after the build (about a minute on 2 cores); a failed build
raises ``ExtensionBuildError`` naming the compiler log. Sources and flags: ``native.py``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugin_api.errors import PluginApiError

from . import native, prebuilt, settings
from .locate import OneDnnInstall, locate

CSRC = native.CSRC
SOURCES = native.GEMM_SOURCES
NAMESPACE = native.GEMM_NAMESPACE


class ExtensionBuildError(PluginApiError):
    """The C++ extension failed to compile or load."""


@dataclass(frozen=True, slots=True)
class Extension:
    ops: Any  # torch.ops.pa_cpu_onednn
    onednn: OneDnnInstall
    build_dir: Path  # the JIT build's cache folder, or the wheel's _prebuilt/
    build_seconds: float  # 0.0 when it came from the cache or the wheel
    origin: str  # "prebuilt <variant>" (from the wheel) or "jit <variant>" (built on this machine)


_lock = threading.Lock()
_loaded: Extension | None = None


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "plugin-api" / "cpu-arm-acl"


def build_key(onednn: OneDnnInstall, torch_version: str) -> str:
    h = hashlib.sha256()
    for name in sorted(p.name for p in CSRC.iterdir() if p.suffix in (".cpp", ".h")):
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes())
    parts = (torch_version, onednn.version, str(onednn.library), platform.machine(), _cpu_id())
    for part in (*parts, *cflags()):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]


def host_variant() -> native.IsaPath | None:
    """The GEMM variant for this CPU (as ``/proc/cpuinfo`` reports it): what a wheel loads and
    what the JIT build compiles, so that a development install runs the code a wheel ships and the
    ISA plugin-api reasons about; None where no variant fits (then ``-march=native``)."""
    return native.best(native.GEMM_VARIANTS, platform.machine(), _cpu_flags())


def cflags() -> tuple[str, ...]:
    """The JIT build's compiler flags: ``native.gemm_cflags`` of ``host_variant()``."""
    return native.gemm_cflags(host_variant())


def extension() -> Extension:
    """The loaded extension, built on first use (thread-safe; once per process)."""
    global _loaded
    with _lock:
        if _loaded is None:
            onednn = locate(settings.read().root)
            manifest = prebuilt.read()
            _loaded = _build(onednn) if manifest is None else _load_prebuilt(onednn, manifest)
        return _loaded


def _load_prebuilt(onednn: OneDnnInstall, manifest: native.Manifest) -> Extension:
    """The wheel's library for the best GEMM level this CPU runs; never compiles."""
    import torch

    prebuilt.check(manifest)
    variant = host_variant()
    if variant is None or variant.name not in manifest.gemm:
        raise ExtensionBuildError(
            f"cpu-arm-acl: this wheel has GEMM builds for {list(manifest.gemm)}; none runs on "
            f"this CPU ({platform.machine()}, needs one of "
            f"{[sorted(v.needs) for v in native.GEMM_VARIANTS]})",
            backend="cpu-arm-acl",
        )
    why = prebuilt.onednn_mismatch(manifest.onednn, onednn.version)
    if why is not None:
        raise ExtensionBuildError(f"cpu-arm-acl: {why} ({onednn.source})", backend="cpu-arm-acl")
    prebuilt.preload_onednn(onednn.library)
    library = prebuilt.gemm_library(variant.name)
    prebuilt.load_library(library)
    ops = getattr(torch.ops, NAMESPACE)
    _check_onednn(ops, onednn)
    return Extension(ops, onednn, library.parent, 0.0, f"prebuilt {variant.name}")


@functools.cache
def _cpu_flags() -> frozenset[str]:
    from plugin_api.device_info import read_device_info

    return read_device_info().cpu_flags


def _check_onednn(ops: Any, onednn: OneDnnInstall) -> None:
    loaded = str(ops.onednn_version())
    if loaded != onednn.version:  # torch ships other oneDNN headers; these must not mix
        raise ExtensionBuildError(
            f"cpu-arm-acl: built against oneDNN {onednn.version} headers ({onednn.include}) but "
            f"loaded oneDNN {loaded}; check LD_LIBRARY_PATH and {settings.ROOT}",
            backend="cpu-arm-acl",
        )


def _build(onednn: OneDnnInstall) -> Extension:
    import torch
    from torch.utils import cpp_extension

    key = build_key(onednn, torch.__version__)
    build_dir = cache_root() / key
    build_dir.mkdir(parents=True, exist_ok=True)
    name = f"{NAMESPACE}_{key}"
    cached = (build_dir / f"{name}.so").exists()
    if not cached:
        print(
            f"plugin-api cpu-arm-acl: building the oneDNN {onednn.version} extension in "
            f"{build_dir} (first use, about a minute)...",
            file=sys.stderr,
            flush=True,
        )
    started = time.perf_counter()
    try:
        cpp_extension.load(
            name=name,
            sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=list(cflags()),
            extra_include_paths=[str(onednn.include)],
            extra_ldflags=list(native.gemm_ldflags(onednn.lib_dir, rpath=True)),
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )
    except Exception as e:  # compiler or loader output, kept whole in the log
        log = build_dir / "build.log"
        log.write_text(f"{type(e).__name__}: {e}\n")
        tail = "\n".join(str(e).strip().splitlines()[-5:])
        raise ExtensionBuildError(
            f"cpu-arm-acl: building the oneDNN extension failed; compiler log: {log}\n{tail}",
            backend="cpu-arm-acl",
        ) from e
    ops = getattr(torch.ops, NAMESPACE)
    _check_onednn(ops, onednn)
    seconds = 0.0 if cached else time.perf_counter() - started
    if not cached:
        print(f"plugin-api cpu-arm-acl: built in {seconds:.0f} s", file=sys.stderr, flush=True)
    variant = host_variant()
    origin = f"jit {variant.name if variant else 'native'}"
    return Extension(ops, onednn, build_dir, seconds, origin)


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    keys = ("model name", "flags", "Features", "CPU part")
    lines = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in keys]
    return "\n".join(dict.fromkeys(lines))

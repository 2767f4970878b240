"""Building the C++ extension (csrc/) once per machine and loading it.

The build lives in a per-user cache directory keyed by the source hash, the torch version, the
oneDNN version and location, and the CPU (it is compiled for the host CPU). The first use prints
one line before and after the build (about a minute on 2 cores); a failed build raises
``ExtensionBuildError`` naming the compiler log.
"""

from __future__ import annotations

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

from . import settings
from .locate import OneDnnInstall, locate

CSRC = Path(__file__).parent / "csrc"
SOURCES = (
    "bindings.cpp",
    "matmul.cpp",
    "group_quant.cpp",
    "panel_gemm.cpp",
    "panel_avx2.cpp",
    "panel_generic.cpp",
    "gemv.cpp",
)
NAMESPACE = "pa_cpu_onednn"


class ExtensionBuildError(PluginApiError):
    """The C++ extension failed to compile or load."""


@dataclass(frozen=True, slots=True)
class Extension:
    ops: Any  # torch.ops.pa_cpu_onednn
    onednn: OneDnnInstall
    build_dir: Path
    build_seconds: float  # 0.0 when it came from the cache


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


def cflags() -> tuple[str, ...]:
    """Compiler flags. No fp contraction: the int8 epilogue and the group quant are bit-exact
    with the reference only if ``a * b + c`` stays two roundings (the GEMM loops use FMA
    explicitly)."""
    arch = "-mcpu=native" if platform.machine() in ("aarch64", "arm64") else "-march=native"
    return ("-O3", arch, "-fopenmp", "-ffp-contract=off")


def extension() -> Extension:
    """The loaded extension, built on first use (thread-safe; once per process)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _build(locate(settings.read().root))
        return _loaded


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
            extra_ldflags=[
                f"-L{onednn.lib_dir}",
                "-ldnnl",
                f"-Wl,-rpath,{onednn.lib_dir}",
                "-fopenmp",
            ],
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
    loaded = str(ops.onednn_version())
    if loaded != onednn.version:  # torch ships other oneDNN headers; these must not mix
        raise ExtensionBuildError(
            f"cpu-arm-acl: built against oneDNN {onednn.version} headers ({onednn.include}) but "
            f"loaded oneDNN {loaded}; check LD_LIBRARY_PATH and {settings.ROOT}",
            backend="cpu-arm-acl",
        )
    seconds = 0.0 if cached else time.perf_counter() - started
    if not cached:
        print(f"plugin-api cpu-arm-acl: built in {seconds:.0f} s", file=sys.stderr, flush=True)
    return Extension(ops, onednn, build_dir, seconds)


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    keys = ("model name", "flags", "Features", "CPU part")
    lines = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in keys]
    return "\n".join(dict.fromkeys(lines))

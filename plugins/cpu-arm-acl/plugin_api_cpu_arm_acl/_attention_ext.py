"""The CPU attention extension (``csrc/attention_*``): which ISA variant fits a machine, and
loading it (from the wheel's prebuilt libraries, ``prebuilt.py``) or building it once.

The sources are compiled per ISA with torch's ``at::vec`` capability macros into a library of
torch ops in a namespace of that variant (``torch.ops.pa_cpu_attn_<variant>``), so that variants
never collide in one process; the ops take tensors and check them. Python calls them by name
(``Kernels.ops``) and reads the kernels' constants from the ``limits`` op (``Limits``). A build
is cached beside the oneDNN extension's (``build.cache_root()``) in a folder keyed by the
sources, the torch version, the ISA and its flags, so it is built once per machine and reloaded
without a compiler afterwards (development installs; a wheel carries every variant). Sources,
flags and defines: ``native.py``. A failed build raises ``ExtensionBuildError`` (``build``'s) naming
the log.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from plugin_api.device_info import DeviceInfo

from . import native, prebuilt
from .build import ExtensionBuildError, cache_root
from .native import ADMISSION as ADMISSION
from .native import BLOCK_MULTIPLE as BLOCK_MULTIPLE
from .native import HEAD_MULTIPLE as HEAD_MULTIPLE
from .native import MAX_BLOCK_SIZE as MAX_BLOCK_SIZE
from .native import MAX_HEAD_SIZE as MAX_HEAD_SIZE
from .native import IsaPath as IsaPath

CSRC = native.CSRC
SOURCES = native.ATTENTION_SOURCES
HEADERS = native.ATTENTION_HEADERS
NAMESPACE = native.ATTENTION_NAMESPACE
ISA_PATHS = native.ISA_PATHS
COMMON_CFLAGS = native.ATTENTION_COMMON_CFLAGS
namespace = native.attention_namespace
cflags = native.attention_cflags


def isa_path(info: DeviceInfo) -> IsaPath | None:
    """The best variant this machine can run, from its CPU flags; None when none fits."""
    return native.best(ISA_PATHS, info.machine, info.cpu_flags)


def build_key(isa: IsaPath, torch_version: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    h.update(f"{torch_version}\0{isa.name}\0{' '.join(cflags(isa))}".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Limits:
    """The kernels' constants, as the ``limits`` op reports them (csrc/attention_plan.h)."""

    rows_layout_min: (
        int  # query rows per KV head from which an item takes the rows or matrix layout
    )
    item_fields: int  # int32 columns of a plan's items
    reduce_fields: int  # int32 columns of a plan's reduce rows
    max_head_group: int  # KV heads per decode item
    max_splits: int  # parts a key range is split into, at most
    vector_width: int  # fp32 lanes of at::vec in this variant
    head_multiple: int
    max_head_size: int
    block_multiple: int
    max_block_size: int


@dataclass(frozen=True, slots=True)
class Kernels:
    """One loaded variant: its ops (``torch.ops.pa_cpu_attn_<variant>``) and constants."""

    isa: IsaPath
    ops: Any
    limits: Limits
    library: Path


@functools.cache
def load(isa_name: str) -> Kernels:
    """The kernels for ``isa_name``: from the wheel's prebuilt libraries, else from the cache,
    else built once (development installs)."""
    import torch  # its libraries must be loaded before ours (ours links against them)

    isa = next((i for i in ISA_PATHS if i.name == isa_name), None)
    if isa is None:
        raise ValueError(f"isa_name={isa_name!r}: one of {[i.name for i in ISA_PATHS]}")
    manifest = prebuilt.read()
    if manifest is not None:
        prebuilt.check(manifest)
        if isa.name not in manifest.attention:
            raise ExtensionBuildError(
                f"cpu-arm-acl: this wheel has attention builds for {list(manifest.attention)}, "
                f"not {isa.name}; {prebuilt.reinstall()}",
                backend="cpu-arm-acl",
            )
        library = prebuilt.attention_library(isa.name)
        prebuilt.load_library(library)
        return _kernels(isa, library)
    name = f"plugin_api_cpu_attention_{isa.name}_{build_key(isa, torch.__version__)}"
    folder = cache_root() / name
    library = folder / f"{name}.so"
    if library.is_file():
        try:
            torch.ops.load_library(str(library))  # type: ignore[no-untyped-call]
        except OSError as e:
            raise ExtensionBuildError(
                f"cpu-arm-acl: cannot load {library}: {e}", backend="cpu-arm-acl"
            ) from e
    else:  # the build loads what it built (a second copy would register the ops twice)
        _build(isa, name, folder, library)
    return _kernels(isa, library)


def _kernels(isa: IsaPath, library: Path) -> Kernels:
    import torch

    ops = getattr(torch.ops, namespace(isa))
    reported = dict(ops.limits())
    names = [f.name for f in fields(Limits)]
    if sorted(reported) != sorted(names):
        raise ExtensionBuildError(
            f"cpu-arm-acl: {library} reports limits {sorted(reported)}, expected {sorted(names)}",
            backend="cpu-arm-acl",
        )
    return Kernels(isa, ops, Limits(**reported), library)


def _build(isa: IsaPath, name: str, folder: Path, library: Path) -> None:
    from torch.utils import cpp_extension

    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "build.log"
    # each process builds in its own folder and renames the result into place, so a process
    # that finds the library never sees one that another process is still linking
    work = folder / f"build-{os.getpid()}"
    work.mkdir(exist_ok=True)
    print(
        f"plugin-api cpu-arm-acl: building the CPU attention kernels ({isa.name}) once "
        f"into {folder}",
        file=sys.stderr,
    )
    try:
        cpp_extension.load(
            name=name,
            sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=list(cflags(isa)),
            extra_include_paths=[str(CSRC)],
            build_directory=str(work),
            is_python_module=False,
            verbose=False,
        )
    except Exception as e:  # the compiler's output is in the message; keep it in the log
        log.write_text(f"{type(e).__name__}: {e}\n")
        raise ExtensionBuildError(
            f"cpu-arm-acl: building the CPU attention extension ({isa.name}) failed: "
            f"{type(e).__name__}; compiler output in {log}",
            backend="cpu-arm-acl",
        ) from e
    built = work / f"{name}.so"
    if not built.is_file():
        raise ExtensionBuildError(
            f"cpu-arm-acl: the build of {name} left no {built.name} in {work}",
            backend="cpu-arm-acl",
        )
    built.replace(library)
    log.unlink(missing_ok=True)  # a log left by an earlier failed attempt
    shutil.rmtree(work, ignore_errors=True)

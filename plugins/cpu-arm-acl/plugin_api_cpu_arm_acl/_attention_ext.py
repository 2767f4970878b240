"""The CPU attention extension (``csrc/attention_*``): which ISA variant fits a machine, and
building/loading it once.

The sources are compiled per ISA with torch's ``at::vec`` capability macros into a library of
torch ops in a namespace of that variant (``torch.ops.pa_cpu_attn_<variant>``), so that variants
never collide in one process; the ops take tensors and check them. Python calls them by name
(``Kernels.ops``) and reads the kernels' constants from the ``limits`` op (``Limits``). A build
is cached beside the oneDNN extension's (``build.cache_root()``) in a folder keyed by the
sources, the torch version, the ISA and its flags, so it is built once per machine and reloaded
without a compiler afterwards. A failed build raises ``ExtensionBuildError`` (``build``'s) naming
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

from .build import ExtensionBuildError, cache_root

CSRC = Path(__file__).parent / "csrc"
# four translation units, compiled in parallel: only the ops parse torch's library headers
SOURCES = (
    "attention_vector.cpp",
    "attention_ops.cpp",
    "attention_matrix.cpp",
    "attention_plan.cpp",
)
HEADERS = (
    "attention.h",
    "attention_plan.h",
    "attention_item.h",
    "attention_vec.h",
    "attention_kernels.h",
)
NAMESPACE = "pa_cpu_attn"

# What the kernels admit (attention.py's ``supports`` applies it without building anything):
# the build passes these to the C++ as -D definitions, which checks its assumptions against them.
HEAD_MULTIPLE = 16  # whole vectors on every ISA path
MAX_HEAD_SIZE = 512
BLOCK_MULTIPLE = 16  # one vector of 16 lanes, two of 8, four of 4: every ISA path
MAX_BLOCK_SIZE = 256
ADMISSION = {
    "PA_ATTN_HEAD_MULTIPLE": HEAD_MULTIPLE,
    "PA_ATTN_MAX_HEAD_SIZE": MAX_HEAD_SIZE,
    "PA_ATTN_BLOCK_MULTIPLE": BLOCK_MULTIPLE,
    "PA_ATTN_MAX_BLOCK_SIZE": MAX_BLOCK_SIZE,
}


@dataclass(frozen=True, slots=True)
class IsaPath:
    """One compiled variant: its name, the CPU flags it needs, and how it is compiled."""

    name: str
    machines: tuple[str, ...]
    needs: frozenset[str]
    cflags: tuple[str, ...]
    summary: str


_AVX512_NEEDS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"})
_AVX512_CFLAGS = (
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512dq",
    "-mavx2",
    "-mfma",
    "-mf16c",
    "-DCPU_CAPABILITY=AVX512",
    "-DCPU_CAPABILITY_AVX512",
)
# Best first. AVX-512 is the same source at 16 lanes (run by the tests where the CPU has it);
# with AVX-512 BF16 the bf16 decode scores and P.V take vdpbf16ps (kDotBf16, attention_vec.h).
ISA_PATHS = (
    IsaPath(
        "avx512bf16",
        ("x86_64", "AMD64"),
        _AVX512_NEEDS | {"avx512_bf16"},
        (*_AVX512_CFLAGS, "-mavx512bf16"),
        "at::vec 16 x fp32 (AVX-512), bf16 decode scores and P.V (bf16 probabilities) by "
        "vdpbf16ps (AVX-512 BF16)",
    ),
    IsaPath(
        "avx512", ("x86_64", "AMD64"), _AVX512_NEEDS, _AVX512_CFLAGS, "at::vec 16 x fp32 (AVX-512)"
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
# -fopenmp: at::parallel_for is an OpenMP pragma in the headers; without it, one thread runs
COMMON_CFLAGS = ("-O3", "-fopenmp", "-fvisibility=hidden")


def isa_path(info: DeviceInfo) -> IsaPath | None:
    """The best variant this machine can run, from its CPU flags; None when none fits."""
    for isa in ISA_PATHS:
        if info.machine in isa.machines and isa.needs <= info.cpu_flags:
            return isa
    return None


def namespace(isa: IsaPath) -> str:
    """The variant's torch op namespace: ``torch.ops.pa_cpu_attn_<variant>``."""
    return f"{NAMESPACE}_{isa.name}"


def cflags(isa: IsaPath) -> tuple[str, ...]:
    """Everything the variant is compiled with: flags, its op namespace, the admission limits."""
    defines = {"PA_ATTN_NAMESPACE": namespace(isa), **ADMISSION}
    return (*COMMON_CFLAGS, *isa.cflags, *(f"-D{k}={v}" for k, v in defines.items()))


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
    """The kernels for ``isa_name``: loaded from the cache, else built once."""
    import torch  # its libraries must be loaded before ours (ours links against them)

    isa = next((i for i in ISA_PATHS if i.name == isa_name), None)
    if isa is None:
        raise ValueError(f"isa_name={isa_name!r}: one of {[i.name for i in ISA_PATHS]}")
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

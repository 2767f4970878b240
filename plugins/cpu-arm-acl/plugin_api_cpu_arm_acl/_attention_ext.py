"""The CPU attention extension (``csrc/attention.cpp``): which ISA variant fits a machine, and
building/loading it once.

One source, compiled per ISA with torch's ``at::vec`` capability macros into a shared library of
plain C functions, called through ctypes (no pybind: the build takes seconds, not minutes; ctypes
releases the GIL during each call). A build is cached beside the oneDNN extension's
(``build.cache_root()``) in a folder keyed by the sources, the torch version, the ISA and its
flags, so it is built once per machine and reloaded without a compiler afterwards. A failed
build raises ``ExtensionBuildError`` (``build``'s) naming the log.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from plugin_api.device_info import DeviceInfo

from .build import ExtensionBuildError, cache_root

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


def build_key(isa: IsaPath, torch_version: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    h.update(f"{torch_version}\0{isa.name}\0{' '.join(isa.cflags + COMMON_CFLAGS)}".encode())
    return h.hexdigest()[:16]


_I64, _F64, _PTR = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "pa_attn_init": (None, []),
    "pa_attn_fp8_table": (_PTR, []),
    "pa_attn_vector_width": (_I64, []),
    "pa_attn_matrix_engine": (_I64, []),
    "pa_attn_last_error": (ctypes.c_char_p, []),
    "pa_attn_plan": (None, [_PTR, _PTR] + [_I64] * 9 + [_PTR, _PTR, _PTR]),
    "pa_attn_forward": (
        _I64,
        [_PTR, _PTR, _I64, _I64, _PTR, _I64, _PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _PTR]
        + [_I64] * 4
        + [_F64] * 3
        + [_I64, _I64, _F64, _I64, _I64],
    ),
    "pa_attn_write_kv": (
        _I64,
        [_PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _I64, _PTR, _I64, _I64, _I64, _I64]
        + [_F64] * 2,
    ),
}


@functools.cache
def load(isa_name: str) -> ctypes.CDLL:
    """The kernels for ``isa_name``: loaded from the cache, else built once."""
    import torch  # its libraries must be loaded before ours (ours links against them)

    isa = next(i for i in ISA_PATHS if i.name == isa_name)
    name = f"plugin_api_cpu_attention_{isa.name}_{build_key(isa, torch.__version__)}"
    folder = cache_root() / name
    library = folder / f"{name}.so"
    if not library.is_file():
        _build(isa, name, folder, library)
    try:
        lib = ctypes.CDLL(str(library))
    except OSError as e:
        raise ExtensionBuildError(
            f"cpu-arm-acl: cannot load {library}: {e}", backend="cpu-arm-acl"
        ) from e
    for fn, (restype, argtypes) in SIGNATURES.items():
        f = getattr(lib, fn)
        f.restype, f.argtypes = restype, argtypes
    lib.pa_attn_init()
    return lib


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
            extra_cflags=list(COMMON_CFLAGS + isa.cflags),
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

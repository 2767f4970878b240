"""What the two native libraries are compiled from and with, for both ways they are built.

The oneDNN GEMM/quant extension (``GEMM``) and the attention kernels (``ATTENTION``) are built
either on first use into a per-user cache (``build.py``, ``_attention_ext.py``: editable and
development installs, compiled for the host CPU) or once per ISA variant when a wheel is built
(``setup.py``; the wheel loads them through ``prebuilt.py`` without a compiler). Both read their
sources, flags and defines from here. Standard library only: ``setup.py`` loads this file by
path, before the package's dependencies are importable.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CSRC = Path(__file__).parent / "csrc"

GEMM_NAMESPACE = "pa_cpu_onednn"
GEMM_SOURCES = (
    "bindings.cpp",
    "matmul.cpp",
    "group_quant.cpp",
    "panel_gemm.cpp",
    "panel_avx2.cpp",
    "panel_generic.cpp",
    "gemv.cpp",
)
# The sources whose kernels the compiler's ISA macros select (__AVX512BF16__, __AVX512VBMI__, ...):
# a wheel compiles them per variant and the rest once, at its machine's lowest variant (the
# others choose their ISA at run time or need none), and links each variant from both.
GEMM_ISA_SOURCES = ("group_quant.cpp", "gemv.cpp")
# No fp contraction: the int8 epilogue and the group quant are bit-exact with the reference only
# if ``a * b + c`` stays two roundings (the GEMM loops use FMA explicitly).
GEMM_COMMON_CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")

ATTENTION_NAMESPACE = "pa_cpu_attn"
# four translation units, compiled in parallel: only the ops parse torch's library headers
ATTENTION_SOURCES = (
    "attention_vector.cpp",
    "attention_ops.cpp",
    "attention_matrix.cpp",
    "attention_plan.cpp",
)
ATTENTION_HEADERS = (
    "attention.h",
    "attention_plan.h",
    "attention_item.h",
    "attention_vec.h",
    "attention_kernels.h",
    "attention_tiles.h",
    "amx.h",
)
# -fopenmp: at::parallel_for is an OpenMP pragma in the headers; without it, one thread runs
ATTENTION_COMMON_CFLAGS = ("-O3", "-fopenmp", "-fvisibility=hidden")

# What the attention kernels admit (attention.py's ``supports`` applies it without building
# anything): the build passes these to the C++ as -D definitions, which checks its assumptions.
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

X86 = ("x86_64", "AMD64")
ARM = ("aarch64", "arm64")


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
_AVX2_CFLAGS = ("-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2")
# Best first. AVX-512 is the same source at 16 lanes (run by the tests where the CPU has it);
# with AVX-512 BF16 the bf16 decode scores and P.V take vdpbf16ps (kDotBf16, attention_vec.h).
ISA_PATHS = (
    IsaPath(
        "avx512bf16",
        X86,
        _AVX512_NEEDS | {"avx512_bf16", "avx512vbmi"},
        (*_AVX512_CFLAGS, "-mavx512bf16", "-mavx512vbmi"),
        "at::vec 16 x fp32 (AVX-512), bf16 decode scores and P.V (bf16 probabilities) by "
        "vdpbf16ps (AVX-512 BF16)",
    ),
    IsaPath("avx512", X86, _AVX512_NEEDS, _AVX512_CFLAGS, "at::vec 16 x fp32 (AVX-512)"),
    IsaPath(
        "avx2", X86, frozenset({"avx2", "fma", "f16c"}), _AVX2_CFLAGS, "at::vec 8 x fp32 (AVX2+FMA)"
    ),
    IsaPath(
        "neon", ARM, frozenset({"asimd"}), ("-DCPU_CAPABILITY=DEFAULT",), "at::vec 4 x fp32 (NEON)"
    ),
)

# The GEMM/quant extension selects its kernels at compile time (group_quant.cpp, gemv.cpp), so a
# wheel carries one build per level; the JIT build compiles the level a wheel would load here. The
# top level adds VBMI (group_quant.cpp's bf16 path) to AVX-512 BF16 (gemv.cpp): the CPUs that
# have both (Sapphire Rapids, Zen 4) are where those kernels matter.
GEMM_VARIANTS = (
    IsaPath(
        "avx512bf16",
        X86,
        _AVX512_NEEDS | {"avx512_bf16", "avx512vbmi"},
        (*_AVX512_CFLAGS, "-mavx512bf16", "-mavx512vbmi"),
        "AVX-512 with BF16 (bf16 GEMV) and VBMI (bf16 group quant)",
    ),
    IsaPath("avx512", X86, _AVX512_NEEDS, _AVX512_CFLAGS, "AVX-512"),
    IsaPath("avx2", X86, frozenset({"avx2", "fma", "f16c"}), _AVX2_CFLAGS, "AVX2 + FMA + F16C"),
    IsaPath("neon", ARM, frozenset({"asimd"}), ("-march=armv8-a",), "NEON (Armv8-A)"),
)


def best(variants: tuple[IsaPath, ...], machine: str, cpu_flags: frozenset[str]) -> IsaPath | None:
    """The first (best) of ``variants`` this machine can run; None when none fits."""
    for isa in variants:
        if machine in isa.machines and isa.needs <= cpu_flags:
            return isa
    return None


def attention_namespace(isa: IsaPath) -> str:
    """The variant's torch op namespace: ``torch.ops.pa_cpu_attn_<variant>``."""
    return f"{ATTENTION_NAMESPACE}_{isa.name}"


def attention_cflags(isa: IsaPath) -> tuple[str, ...]:
    """Everything the variant is compiled with: flags, its op namespace, the admission limits."""
    defines = {"PA_ATTN_NAMESPACE": attention_namespace(isa), **ADMISSION}
    return (*ATTENTION_COMMON_CFLAGS, *isa.cflags, *(f"-D{k}={v}" for k, v in defines.items()))


def gemm_cflags(variant: IsaPath | None, machine: str | None = None) -> tuple[str, ...]:
    """The GEMM extension's flags for ``variant``; None (a CPU no variant fits) for the host."""
    if variant is not None:
        return (*GEMM_COMMON_CFLAGS, *variant.cflags)
    native = "-mcpu=native" if (machine or platform.machine()) in ARM else "-march=native"
    # this order is part of the JIT cache key (build.build_key): kept, so caches stay valid
    return (GEMM_COMMON_CFLAGS[0], native, *GEMM_COMMON_CFLAGS[1:])


def gemm_ldflags(onednn_lib_dir: Path, *, rpath: bool) -> tuple[str, ...]:
    """Linking oneDNN: the JIT build records its directory (``rpath``); a wheel's library finds
    it at run time because ``prebuilt.py`` loads libdnnl from the installed wheel first."""
    run_path = (f"-Wl,-rpath,{onednn_lib_dir}",) if rpath else ()
    return (f"-L{onednn_lib_dir}", "-ldnnl", *run_path, "-fopenmp")


def source_hash() -> str:
    """Hash of every C++ source and header (csrc/), recorded in a wheel's manifest."""
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# ---- a wheel's prebuilt libraries ----------------------------------------------------------------

PREBUILT_DIR = "_prebuilt"  # in the package, beside this file: only a built wheel has it
MANIFEST_FORMAT = 1


def gemm_library_name(variant: str) -> str:
    return f"{GEMM_NAMESPACE}_{variant}.so"


def attention_library_name(variant: str) -> str:
    return f"{ATTENTION_NAMESPACE}_{variant}.so"


@dataclass(frozen=True, slots=True)
class Manifest:
    """What ``setup.py`` recorded beside the libraries it compiled (``manifest.json``)."""

    torch: str  # torch.__version__ of the build, e.g. "2.13.0+cpu"
    cxx11_abi: bool  # torch._C._GLIBCXX_USE_CXX11_ABI of the build
    machine: str  # platform.machine() of the build
    python: str  # the build's interpreter tag, e.g. "cp311" (the libraries do not link it)
    onednn: str  # oneDNN version of the headers compiled against
    source_hash: str  # source_hash() of csrc/
    gemm: tuple[str, ...]  # GEMM_VARIANTS present
    attention: tuple[str, ...]  # ISA_PATHS present

    def to_json(self) -> str:
        fields = {"format": MANIFEST_FORMAT, **{k: getattr(self, k) for k in self.__slots__}}
        return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()})

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Raises ValueError naming what is wrong."""
        try:
            data = json.loads(text)
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {MANIFEST_FORMAT}")
            return cls(
                torch=str(data["torch"]),
                cxx11_abi=bool(data["cxx11_abi"]),
                machine=str(data["machine"]),
                python=str(data["python"]),
                onednn=str(data["onednn"]),
                source_hash=str(data["source_hash"]),
                gemm=tuple(str(v) for v in data["gemm"]),
                attention=tuple(str(v) for v in data["attention"]),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{type(e).__name__}: {e}") from e


# ---- finding oneDNN's files (locate.py for the plugin, setup.py for the wheel's build) --------


def wheel_file(dist: str, name: str, under: str = "") -> Path | None:
    """The installed file ``name`` (in a folder path containing ``under``) of distribution
    ``dist``, from its RECORD; None when the distribution or the file is missing."""
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        rel = PurePosixPath(str(f))  # the record's path, relative to site-packages
        if rel.name == name and (not under or under in rel.as_posix()):
            path = Path(str(f.locate())).resolve()
            if path.exists():
                return path
    return None


def header_version(header: Path) -> str | None:
    """ "major.minor.patch" from oneDNN's ``dnnl_version.h``; None when it does not say."""
    text = header.read_text()
    parts = [
        re.search(rf"#define DNNL_VERSION_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")
    ]
    if not all(parts):
        return None
    return ".".join(p.group(1) for p in parts if p)

"""Building plugin-api-cpu-arm-acl: a wheel with its native libraries compiled, or nothing compiled.

A wheel (PEP 517 ``build_wheel``, through ``wheel_backend.py``) carries the GEMM/quant extension
and the attention kernels compiled here for every ISA variant of the build machine's
architecture, with the sources, flags and defines of ``plugin_api_cpu_arm_acl/native.py`` (the
ones the JIT build uses), in ``plugin_api_cpu_arm_acl/_prebuilt/`` beside a ``manifest.json``
naming the torch they were compiled against; the wheel requires exactly that torch release and
is tagged for the platform. An editable install and the sdist compile nothing: their kernels are
built on first use (JIT), so they depend on ninja (and need a C++ compiler) instead.

The compile is one ninja graph over every object of every variant (all cores busy); the build
folder persists, so a rebuild recompiles only what changed.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PACKAGE = "plugin_api_cpu_arm_acl"
# Set by wheel_backend.py for build_wheel and its metadata: the one switch for "compile here".
PREBUILT_ENV = "PLUGIN_API_CPU_ARM_ACL_PREBUILT"
# where the objects go (default build/native-<machine>); a folder kept between builds of the
# same source paths recompiles only what changed
BUILD_DIR_ENV = "PLUGIN_API_CPU_ARM_ACL_BUILD_DIR"
ROOT_ENV = "PLUGIN_API_ONEDNN_ROOT"  # settings.ROOT: another oneDNN than the wheels'
ONEDNN_LIB_WHEEL, ONEDNN_DEVEL_WHEEL = "onednn-cpu-gomp", "onednn-devel-cpu-gomp"
# oneDNN 3.2 library and headers on x86_64; on aarch64 set PLUGIN_API_ONEDNN_ROOT (README)
ONEDNN_REQUIRES = [
    f"{ONEDNN_LIB_WHEEL}==2023.2.0; platform_machine == 'x86_64'",
    f"{ONEDNN_DEVEL_WHEEL}==2023.2.0; platform_machine == 'x86_64'",  # the version (locate.py)
]
BASE_REQUIRES = ["plugin-api>=0.1,<0.2", *ONEDNN_REQUIRES]
# without prebuilt libraries, torch.utils.cpp_extension builds them at first use with ninja
JIT_REQUIRES = ["torch>=2.4", "ninja>=1.11"]


def prebuilt() -> bool:
    return os.environ.get(PREBUILT_ENV) == "1"


def native() -> ModuleType:
    """``native.py``, loaded by path: the package's own imports need its dependencies."""
    name = f"_{PACKAGE}_native"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / PACKAGE / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def requirements() -> list[str]:
    if not prebuilt():
        return [*BASE_REQUIRES, *JIT_REQUIRES]
    import torch

    # the release compiled against; its local label (+cpu) does not change the C++ ABI, and
    # "==2.13.0" is met by 2.13.0+cpu as well
    return [*BASE_REQUIRES, f"torch=={torch.__version__.split('+')[0]}"]


class BuildPyWithNative(build_py):  # type: ignore[misc]
    """build_py, then (wheel builds only) the native libraries into the package's build."""

    def run(self) -> None:
        super().run()
        if self.editable_mode or not prebuilt():
            return
        build_base = Path(self.get_finalized_command("build").build_base)
        out = Path(self.build_lib) / PACKAGE / native().PREBUILT_DIR
        work = os.environ.get(BUILD_DIR_ENV) or build_base / f"native-{platform.machine()}"
        compile_native(out, Path(work))


class NativeDistribution(Distribution):  # type: ignore[misc]
    """With prebuilt libraries the package is platform-specific: installed to platlib, and the
    wheel's root is platlib (not a pure wheel with a .data/purelib folder)."""

    def has_ext_modules(self) -> bool:
        return prebuilt() or bool(super().has_ext_modules())


class PlatformWheel(bdist_wheel):  # type: ignore[misc]
    """A wheel with prebuilt libraries is for one platform but any Python 3: the libraries
    link torch's, not libpython (checked after linking)."""

    def get_tag(self) -> tuple[str, str, str]:
        impl, abi, plat = super().get_tag()
        return ("py3", "none", plat) if prebuilt() else (impl, abi, plat)


def compile_native(out: Path, work: Path) -> None:
    import torch
    from torch.utils import cpp_extension

    nat = native()
    machine = platform.machine()
    gemm = [v for v in nat.GEMM_VARIANTS if machine in v.machines]
    attention = [v for v in nat.ISA_PATHS if machine in v.machines]
    if not gemm or not attention:
        raise SystemExit(f"{PACKAGE}: no native variants for {machine}; build an sdist instead")
    lib_dir, include, onednn_version = find_onednn(nat)
    python_include = sysconfig.get_path("include", scheme="posix_prefix")
    # what torch.utils.cpp_extension.load adds to ours (torch 2.13: C++20, -fPIC, its headers)
    torch_cflags = [
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *(f"-isystem {shlex.quote(p)}" for p in [*cpp_extension.include_paths(), python_include]),
        "-fPIC",
        "-std=c++20",
    ]
    torch_ldflags = [
        "-shared",
        *(f"-L{shlex.quote(p)}" for p in cpp_extension.library_paths()),
        "-lc10",
        "-ltorch_cpu",
        "-ltorch",
    ]

    def flags(name: str, ours: tuple[str, ...], includes: list[Path]) -> str:
        parts = [f"-DTORCH_EXTENSION_NAME={name}", *torch_cflags, *ours]
        return " ".join([*parts, *(f"-I{shlex.quote(str(p))}" for p in includes)])

    lines = [
        "ninja_required_version = 1.3",
        f"cxx = {os.environ.get('CXX', 'c++')}",
        "rule compile",
        "  command = $cxx -MMD -MF $out.d $flags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = compile $out",
        "rule link",
        "  command = $cxx $in $ldflags -o $out",
        "  description = link $out",
    ]
    outputs: list[str] = []

    def compile_(obj: str, source: str, cflags: str) -> str:
        lines.extend([f"build {obj}: compile {nat.CSRC / source}", f"  flags = {cflags}"])
        return obj

    def link(library: str, objects: list[str], ldflags: list[str]) -> None:
        lines.append(f"build {library}: link {' '.join(objects)}")
        lines.append(f"  ldflags = {' '.join(ldflags)}")
        outputs.append(library)

    # GEMM: ISA-neutral sources once (at the lowest variant), the ISA-selected ones per variant
    base = gemm[-1]
    shared_flags = flags(nat.GEMM_NAMESPACE, nat.gemm_cflags(base), [include])
    shared = [
        compile_(f"gemm/{Path(s).stem}.o", s, shared_flags)
        for s in nat.GEMM_SOURCES
        if s not in nat.GEMM_ISA_SOURCES
    ]
    gemm_ld = [*nat.gemm_ldflags(lib_dir, rpath=False), *torch_ldflags]
    for v in gemm:
        vflags = flags(nat.GEMM_NAMESPACE, nat.gemm_cflags(v), [include])
        own = [compile_(f"gemm_{v.name}/{Path(s).stem}.o", s, vflags) for s in nat.GEMM_ISA_SOURCES]
        link(nat.gemm_library_name(v.name), shared + own, gemm_ld)
    for v in attention:
        name = nat.attention_namespace(v)
        aflags = flags(name, nat.attention_cflags(v), [nat.CSRC])
        objects = [compile_(f"{name}/{Path(s).stem}.o", s, aflags) for s in nat.ATTENTION_SOURCES]
        link(nat.attention_library_name(v.name), objects, torch_ldflags)

    work.mkdir(parents=True, exist_ok=True)
    (work / "build.ninja").write_text("\n".join(lines) + "\n")
    print(f"{PACKAGE}: compiling {len(outputs)} native libraries in {work}", flush=True)
    subprocess.run([find_ninja(), "-C", str(work), *ninja_jobs()], check=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for library in outputs:
        check_no_libpython(work / library)
        shutil.copy2(work / library, out / library)
    manifest = nat.Manifest(
        torch=torch.__version__,
        cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        machine=machine,
        python=f"cp{sys.version_info.major}{sys.version_info.minor}",
        onednn=onednn_version,
        source_hash=nat.source_hash(),
        gemm=tuple(v.name for v in gemm),
        attention=tuple(v.name for v in attention),
    )
    (out / "manifest.json").write_text(manifest.to_json() + "\n")


def find_onednn(nat: Any) -> tuple[Path, Path, str]:
    """(library folder, include folder, version) of the oneDNN to compile against, as
    locate.py finds it at run time: PLUGIN_API_ONEDNN_ROOT, else the onednn wheels."""
    root = os.environ.get(ROOT_ENV)
    if root:
        libs = [Path(root, d, "libdnnl.so") for d in ("lib", "lib64")]
        library = next((p for p in libs if p.exists()), None)
        header = Path(root, "include", "oneapi", "dnnl", "dnnl_version.h")
    else:
        library = nat.wheel_file(ONEDNN_LIB_WHEEL, "libdnnl.so")
        header = nat.wheel_file(ONEDNN_DEVEL_WHEEL, "dnnl_version.h", under="oneapi/dnnl")
    version = nat.header_version(header) if header is not None and header.exists() else None
    if library is None or header is None or version is None:
        wheels = f"the {ONEDNN_LIB_WHEEL} and {ONEDNN_DEVEL_WHEEL} wheels"
        where = f"{ROOT_ENV}={root}" if root else wheels
        raise SystemExit(f"{PACKAGE}: no oneDNN library and headers in {where}")
    return library.parent, header.parents[2], version


def find_ninja() -> str:
    """The ninja beside this Python (the ``ninja`` wheel of a venv not on PATH), else PATH's."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("ninja", path=path)
    if found is None:
        raise SystemExit(f"{PACKAGE}: ninja not found (pip install ninja)")
    return found


def ninja_jobs() -> list[str]:
    jobs = os.environ.get("MAX_JOBS")  # as torch.utils.cpp_extension reads it
    return ["-j", jobs] if jobs else []


def check_no_libpython(library: Path) -> None:
    """The wheel is tagged py3-none: a library that needs libpython would break that."""
    needed = subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=False
    ).stdout
    if "libpython" in needed or "libtorch_python" in needed:
        raise SystemExit(f"{library} links libpython or libtorch_python; the py3 tag is wrong")


setup(
    install_requires=requirements(),
    distclass=NativeDistribution,
    cmdclass={"build_py": BuildPyWithNative, "bdist_wheel": PlatformWheel},
)

"""Finding the oneDNN the plugin builds against, and the facts the probe reads about it.

Light: reads files and package metadata, never loads the library. On x86_64 the default is the
``onednn-cpu-gomp`` + ``onednn-devel-cpu-gomp`` wheels; ``PLUGIN_API_ONEDNN_ROOT`` points at any
other install (on aarch64: a oneDNN built with ACL, see the README).
"""

from __future__ import annotations

import mmap
import platform
from dataclasses import dataclass
from pathlib import Path

from plugin_api.errors import PluginApiError

from .native import header_version, wheel_file
from .settings import ROOT

LIB_WHEEL, DEVEL_WHEEL = "onednn-cpu-gomp", "onednn-devel-cpu-gomp"  # also in setup.py's
FACT_VERSION = "cpu-arm-acl.onednn_version"
FACT_ACL = "cpu-arm-acl.onednn_acl"
FACT_ROOT = "cpu-arm-acl.onednn_root"
FACT_MISSING = "cpu-arm-acl.onednn_missing"
FACT_LIBRARY = "cpu-arm-acl.onednn_library"


class OneDnnNotFound(PluginApiError):
    """No usable oneDNN install (library and headers) was found."""


@dataclass(frozen=True, slots=True)
class OneDnnInstall:
    library: Path  # libdnnl.so
    include: Path  # holds oneapi/dnnl/dnnl.hpp
    version: str  # from the headers, "major.minor.patch"
    acl: bool  # built with the Arm Compute Library
    source: str  # where it came from, for messages

    @property
    def lib_dir(self) -> Path:
        return self.library.parent


def locate(root: str | None) -> OneDnnInstall:
    """The install at ``root`` (PLUGIN_API_ONEDNN_ROOT), else the wheels; raises OneDnnNotFound."""
    if root is not None:
        base = Path(root)
        libs = [p for d in ("lib", "lib64") for p in [base / d / "libdnnl.so"] if p.exists()]
        if not libs:
            raise OneDnnNotFound(f"{ROOT}={root}: no lib/libdnnl.so or lib64/libdnnl.so there")
        return _install(libs[0], base / "include", f"{ROOT}={root}")
    lib = wheel_file(LIB_WHEEL, "libdnnl.so")
    header = wheel_file(DEVEL_WHEEL, "dnnl_version.h", under="oneapi/dnnl")
    if lib is None or header is None:
        missing = [w for w, f in ((LIB_WHEEL, lib), (DEVEL_WHEEL, header)) if f is None]
        hint = (
            f"pip install {LIB_WHEEL}==2023.2.0 {DEVEL_WHEEL}==2023.2.0"
            if platform.machine() == "x86_64"
            else f"build oneDNN with ACL and set {ROOT} (see the plugin README)"
        )
        raise OneDnnNotFound(
            f"oneDNN library not found: {', '.join(missing)} not installed and {ROOT} unset; {hint}"
        )
    return _install(lib, header.parents[2], f"wheel {LIB_WHEEL}")


def facts(root: str | None) -> dict[str, str]:
    """Machine facts for the probe: version and ACL of the oneDNN found, or why none was."""
    try:
        found = locate(root)
    except OneDnnNotFound as e:
        return {FACT_MISSING: str(e)}
    return {
        FACT_VERSION: found.version,
        FACT_ACL: "yes" if found.acl else "no",
        FACT_ROOT: str(found.lib_dir.parent),
        FACT_LIBRARY: str(found.library),
    }


def _install(library: Path, include: Path, source: str) -> OneDnnInstall:
    header = include / "oneapi" / "dnnl" / "dnnl_version.h"
    if not header.exists():
        raise OneDnnNotFound(f"oneDNN headers not found at {include} ({source})")
    version = header_version(header)
    if version is None:
        raise OneDnnNotFound(f"{header}: cannot read DNNL_VERSION_MAJOR/MINOR/PATCH ({source})")
    return OneDnnInstall(library.resolve(), include, version, _has_acl(library), source)


def _has_acl(library: Path) -> bool:
    """Whether the library links the Arm Compute Library (by name or statically, by symbols)."""
    if platform.machine() not in ("aarch64", "arm64"):
        return False  # ACL exists only for Arm; no need to scan an x86 library
    with library.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(b"arm_compute") >= 0

"""Write a smaller flashinfer-python wheel that still serves this plugin's kernels.

The full wheel (~100 MB) is over the 64 MiB that travels to the GPU machine. Kept: every Python
file and small data file of the package (so ``import flashinfer`` and its lazy imports work),
the headers the JIT compiles against (data/include, cutlass, cccl, spdlog), the top-level JIT
sources and templates of data/csrc, and data/csrc/xqa. Dropped: the other data/csrc subfolders
and the CUDA sources shipped beside Python modules (kernels of features this plugin never calls,
e.g. MoE, GDN, the cake_* products). RECORD is rewritten for the kept files.

    python trim_flashinfer_wheel.py IN.whl OUT_DIR
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

KEEP_DATA = ("data/include/", "data/cutlass/", "data/cccl/", "data/spdlog/", "data/csrc/xqa/")
SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp", ".inc", ".jinja", ".cubin", ".so")


def keep(name: str) -> bool:
    if ".dist-info/" in name:
        return not name.endswith("RECORD")
    rel = name.removeprefix("flashinfer/")
    if rel.startswith("data/"):
        if rel.startswith(KEEP_DATA):
            return True
        parts = rel.split("/")
        if parts[1] == "csrc":
            return len(parts) == 3  # top-level JIT sources and templates
        return len(parts) == 2  # data/*.py
    return not rel.endswith(SOURCE_SUFFIXES)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def trim(src: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / src.name
    if dst.resolve() == src.resolve():
        raise SystemExit("trim_flashinfer_wheel: OUT_DIR must differ from the input's folder")
    record_name = None
    lines = []
    with (
        zipfile.ZipFile(src) as zin,
        zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout,
    ):
        for item in zin.infolist():
            if item.filename.endswith(".dist-info/RECORD"):
                record_name = item.filename
            if item.is_dir() or not keep(item.filename):
                continue
            data = zin.read(item)
            zout.writestr(item, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            lines.append(_record_line(item.filename, data))
        if record_name is None:
            raise SystemExit(f"{src}: no RECORD; not a wheel")
        lines.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(lines) + "\n")
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    out = trim(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{out} {out.stat().st_size / 2**20:.1f} MiB")

"""Transparent huge pages for large CPU buffers that are read at random places (the paged KV
cache).

Paged attention reads every (block, KV head) as a run of 4-8 KB at an unrelated address; with
4 KB pages nearly every run costs a TLB miss and a page walk. On the 2-core EPYC VM of
docs/benchmarks.md, two threads reading random 4 KB runs of a 512 MB buffer got 10.7 GB/s, and
12.3 GB/s once the buffer asked for huge pages. Linux's common THP mode, ``madvise``, gives
huge pages only to ranges that ask for them, and only to pages not yet touched: so the request
comes between allocation and the first write.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HUGE_PAGE = 2 << 20
# Python's mmap names the flag only where the platform has it.
MADV_HUGEPAGE: int | None = getattr(mmap, "MADV_HUGEPAGE", None)
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode(path: Path = THP_MODE_FILE) -> str | None:
    """The kernel's transparent-huge-page mode (``always``, ``madvise`` or ``never``): the word
    in brackets of ``path``, e.g. "always [madvise] never". None where it cannot be read."""
    try:
        words = path.read_text().split()
    except OSError:
        return None
    chosen = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
    return chosen[0] if len(chosen) == 1 else None


def kv_cache_pages(mode: str | None) -> dict[str, object]:
    """What ``allocate_kv_cache`` gets on a machine in THP ``mode``, for the selection report."""
    if mode in ("always", "madvise"):
        why = f"THP mode {mode!r}: allocate_kv_cache asks for huge pages before the first write"
        return {"thp_mode": mode, "huge_pages": True, "reason": why}
    if mode == "never":
        why = (
            "THP mode 'never': CPU KV caches get 4 KB pages, a TLB miss on nearly every block "
            "read (enable with: echo madvise > " + str(THP_MODE_FILE) + ")"
        )
        return {"thp_mode": mode, "huge_pages": False, "reason": why}
    return {"thp_mode": None, "huge_pages": False, "reason": f"{THP_MODE_FILE} is not readable"}


@functools.cache
def _madvise() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    fn = ctypes.CDLL(name, use_errno=True).madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask the kernel to back the whole 2 MiB pages inside ``t``'s memory with huge pages.

    True when the request was accepted (the kernel may still have none to give, e.g. THP mode
    ``never``); False where it cannot be made: not Linux, not a CPU tensor, less than one whole
    huge page, or madvise refused it. Only a performance hint: the data are unaffected.
    """
    if sys.platform != "linux" or t.device.type != "cpu" or MADV_HUGEPAGE is None:
        return False
    fn = _madvise()
    if fn is None:
        return False
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    lo = -(-start // HUGE_PAGE) * HUGE_PAGE
    hi = end // HUGE_PAGE * HUGE_PAGE
    if hi <= lo:
        return False
    rc: int = fn(lo, hi - lo, MADV_HUGEPAGE)  # restype c_int
    return rc == 0

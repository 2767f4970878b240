"""Timing: warm-up, repeated samples (optionally with cache eviction between them), statistics.

A sample is one call timed on the host clock, with the device synchronised before and after it
when the device is not the CPU. Cold samples first touch a buffer larger than the last-level
cache, outside the timed region, so the call reads its operands from memory.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Method:
    """How long to measure one callable.

    Samples are taken until they add up to ``target_s`` and number at least ``min_samples``, or
    until ``max_samples``, or until the callable has used ``cap_s`` of wall time (at least one
    sample is always taken). ``warmup`` calls come first and are not recorded.
    """

    warmup: int = 1
    target_s: float = 1.0
    min_samples: int = 5
    max_samples: int = 200
    cap_s: float = 30.0

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.min_samples < 1 or self.max_samples < self.min_samples:
            raise ValueError(f"Method: inconsistent counts {self}")
        if not (self.target_s > 0 and self.cap_s > 0):
            raise ValueError(f"Method: target_s and cap_s must be positive, got {self}")


FULL = Method()
# --quick: one warm-up (the provenance call, see run.py), ~0.2 s of samples, at most 3 s each
QUICK = Method(warmup=0, target_s=0.2, min_samples=3, max_samples=30, cap_s=3.0)


@dataclass(frozen=True, slots=True)
class Stats:
    """Seconds per call over ``n`` samples: median, 10th/90th percentiles, mean and minimum."""

    n: int
    median: float
    p10: float
    p90: float
    mean: float
    min: float
    total: float

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative width of the middle 80% of samples."""
        return (self.p90 - self.p10) / self.median if self.median > 0 else 0.0


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of sorted values, interpolating linearly between ranks
    (numpy's default): rank ``q/100 * (n - 1)``."""
    if not sorted_values:
        raise ValueError("percentile: no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q={q} must be in [0, 100]")
    rank = q / 100 * (len(sorted_values) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = rank - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def summarize(samples: Sequence[float]) -> Stats:
    if not samples:
        raise ValueError("summarize: no samples")
    s = sorted(samples)
    total = math.fsum(s)
    return Stats(
        n=len(s),
        median=percentile(s, 50),
        p10=percentile(s, 10),
        p90=percentile(s, 90),
        mean=total / len(s),
        min=s[0],
        total=total,
    )


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that waits for ``device``'s queued work (nothing to wait for on the CPU)."""
    if device.type == "cpu":
        return lambda: None
    module = torch.get_device_module(device.type)
    return lambda: module.synchronize(device)


def measure(
    fn: Callable[[], object],
    method: Method,
    *,
    sync: Callable[[], None],
    evict: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Stats:
    """Time ``fn`` per ``method``; ``evict`` (cold caches) runs before each sample, untimed."""
    for _ in range(method.warmup):
        fn()
    sync()
    samples: list[float] = []
    start = clock()
    while True:
        if evict is not None:
            evict()
            sync()
        t0 = clock()
        fn()
        sync()
        samples.append(clock() - t0)
        if len(samples) >= method.max_samples:
            break
        if len(samples) >= method.min_samples and math.fsum(samples) >= method.target_s:
            break
        if clock() - start >= method.cap_s:
            break
    return summarize(samples)


# ---- the last-level cache, read from the machine ------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheSize:
    """The last-level cache: total bytes over all its instances, and where the figure came from."""

    bytes: int
    source: str


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": MiB, "MB": MiB}
_UNITS |= {"MIB": MiB, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    """``"32768K"`` (sysfs), ``"32 MiB"`` (lscpu) -> bytes."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"cannot read a cache size from {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def sysfs_llc(root: Path = Path("/sys/devices/system/cpu")) -> CacheSize | None:
    """Sum of the highest-level data/unified caches over their distinct instances (one per set
    of CPUs sharing it), from ``cpu*/cache/index*``."""
    instances: dict[tuple[int, str], int] = {}
    for index in sorted(root.glob("cpu[0-9]*/cache/index[0-9]*")):
        try:
            kind = (index / "type").read_text().strip()
            if kind == "Instruction":
                continue
            level = int((index / "level").read_text())
            size = parse_size((index / "size").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        instances[(level, shared)] = size
    if not instances:
        return None
    top = max(level for level, _ in instances)
    parts = [size for (level, _), size in instances.items() if level == top]
    total = sum(parts)
    return CacheSize(total, f"sysfs: L{top}, {len(parts)} instance(s)")


def lscpu_llc(text: str) -> CacheSize | None:
    """The highest ``Ln cache:`` line of ``lscpu`` output (a total over instances)."""
    best: tuple[int, int] | None = None
    for line in text.splitlines():
        m = re.match(r"\s*L(\d)[a-z]?\s+cache:\s*([\d.]+\s*[A-Za-z]+)", line)
        if m:
            level, size = int(m.group(1)), parse_size(m.group(2))
            if best is None or level > best[0]:
                best = (level, size)
    if best is None:
        return None
    return CacheSize(best[1], f"lscpu: L{best[0]}")


ASSUMED_LLC = 512 * MiB


def cpu_llc() -> CacheSize:
    found = sysfs_llc()
    if found is None:
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        found = lscpu_llc(out)
    # Unreadable: assume a large cache, and say so in every report.
    return found or CacheSize(ASSUMED_LLC, "assumed: neither sysfs nor lscpu gave a size")


def device_llc(device: torch.device) -> CacheSize:
    """The cache to defeat for ``device``: the CPU's LLC, or the accelerator's L2."""
    if device.type == "cpu":
        return cpu_llc()
    try:
        props = torch.get_device_module(device.type).get_device_properties(device)
    except (AttributeError, RuntimeError, AssertionError):
        props = None
    size = int(getattr(props, "L2_cache_size", 0) or 0)
    if size > 0:
        return CacheSize(size, f"{device.type} device properties: L2_cache_size")
    return CacheSize(ASSUMED_LLC, f"assumed: {device.type} reports no cache size")


def eviction_bytes(llc: CacheSize) -> int:
    """Twice the last-level cache (at least 8 MiB): enough to push every earlier line out."""
    return max(2 * llc.bytes, 8 * MiB)


class Evictor:
    """Touches (reads and writes) a buffer larger than the last-level cache."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.nbytes = nbytes
        self.buffer = torch.zeros(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.add_(1)

"""Ceilings measured in the same run on the same device, and the roofline they define.

- memory bandwidth: ``dst.copy_(src)`` between two preallocated tensors larger than the
  last-level cache; bytes moved = read + write = ``2 * src.nbytes`` (the STREAM convention).
  Measured before the cases and again after them; the ceiling is the better of the two (a
  shared machine's bandwidth can move by tens of percent within minutes, and a ceiling taken in
  a slow moment would flatter every case), and the report shows how far it moved.
- matmul rate: ``torch.mm(a, b.t(), out=c)`` (the linear layout), fp32 and bf16, square sizes
  growing until one call takes long enough; the best rate of any dtype and size is the ceiling.

A case with arithmetic intensity (FLOP per byte) below the ridge point ``peak / bandwidth`` is
memory-bound and judged against the bandwidth; at or above it, against the matmul rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch

from .harness import Method, MiB, Stats, measure

Bound = Literal["memory", "compute"]


@dataclass(frozen=True, slots=True)
class MatmulPoint:
    dtype: str
    size: int
    stats: Stats

    @property
    def flops(self) -> int:
        return 2 * self.size**3

    @property
    def rate(self) -> float:
        return self.flops / self.stats.median


@dataclass(frozen=True, slots=True)
class Ceilings:
    """``bandwidth`` in bytes/s and ``peak_flops`` in FLOP/s, with how each was measured."""

    bandwidth: float
    peak_flops: float
    copy_bytes: int = 0  # bytes moved per copy (2 x buffer)
    copy_stats: Stats | None = None
    matmul: tuple[MatmulPoint, ...] = ()
    # every copy bandwidth measured in the run, in order (the first gave copy_stats)
    copy_rates: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and self.peak_flops > 0):
            raise ValueError(f"Ceilings: both must be positive, got {self}")

    def rechecked(self, bandwidth: float) -> Ceilings:
        """These ceilings with one more copy measurement: the bandwidth is the best seen."""
        if not bandwidth > 0:
            raise ValueError(f"Ceilings.rechecked: bandwidth={bandwidth} must be positive")
        rates = (*self.copy_rates_seen, bandwidth)
        return replace(self, bandwidth=max(rates), copy_rates=rates)

    @property
    def copy_rates_seen(self) -> tuple[float, ...]:
        """The copy bandwidths measured, in order (``bandwidth`` alone when none was recorded)."""
        return self.copy_rates or (self.bandwidth,)

    @property
    def copy_drift(self) -> float:
        """How far the copy bandwidth moved during the run: best / worst - 1 (0 when it was
        measured once)."""
        rates = self.copy_rates_seen
        return max(rates) / min(rates) - 1

    @property
    def ridge(self) -> float:
        """FLOP per byte where the memory roof meets the compute roof."""
        return self.peak_flops / self.bandwidth

    @property
    def best_matmul(self) -> MatmulPoint | None:
        return max(self.matmul, key=lambda p: p.rate, default=None)

    def describe(self) -> str:
        best = self.best_matmul
        how = f" ({best.dtype} n={best.size})" if best else ""
        return (
            f"copy {self.bandwidth / 1e9:.1f} GB/s, matmul {self.peak_flops / 1e9:.1f} GFLOP/s"
            f"{how}, ridge {self.ridge:.1f} FLOP/B"
        )

    def classify(self, flops: int, nbytes: int) -> Bound:
        return "memory" if intensity(flops, nbytes) < self.ridge else "compute"

    def attainable(self, flops: int, nbytes: int) -> float:
        """The roofline: the FLOP/s a case of this intensity can reach at best."""
        return min(self.peak_flops, intensity(flops, nbytes) * self.bandwidth)

    def fraction(
        self, flops: int, nbytes: int, seconds: float, bound: Bound | None = None
    ) -> float:
        """Achieved share of the relevant ceiling: bytes/s over the bandwidth when memory-bound,
        FLOP/s over the matmul rate when compute-bound. ``bound``: as the case was classified
        when it ran (default: by these ceilings)."""
        if (bound or self.classify(flops, nbytes)) == "memory":
            return nbytes / seconds / self.bandwidth
        return flops / seconds / self.peak_flops


def intensity(flops: int, nbytes: int) -> float:
    if nbytes <= 0:
        raise ValueError(f"intensity: a case moves {nbytes} bytes; every case moves some")
    return flops / nbytes


def copy_buffer_bytes(llc_bytes: int) -> int:
    """Each copy buffer: four times the last-level cache, at least 256 MiB."""
    return max(4 * llc_bytes, 256 * MiB)


def measure_bandwidth(
    device: torch.device, buffer_bytes: int, method: Method, sync: Callable[[], None]
) -> tuple[float, int, Stats]:
    """Copy bandwidth between two ``buffer_bytes`` tensors: (bytes/s, bytes per copy, stats)."""
    n = buffer_bytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch of dst's pages is not part of any sample
    stats = measure(lambda: dst.copy_(src), method, sync=sync)
    moved = 2 * src.nbytes
    return moved / stats.median, moved, stats


MATMUL_DTYPES = (torch.float32, torch.bfloat16)
MATMUL_SIZES = (256, 512, 1024, 2048, 4096, 8192)


def measure_matmul(
    device: torch.device,
    method: Method,
    sync: Callable[[], None],
    *,
    stop_after_s: float,
    sizes: tuple[int, ...] = MATMUL_SIZES,
) -> tuple[MatmulPoint, ...]:
    """Square ``n x n`` matmuls for each dtype, growing ``n`` until a call takes
    ``stop_after_s`` (larger ones would only cost time) or the sizes run out."""
    points = []
    for dtype in MATMUL_DTYPES:
        for size in sizes:
            a = torch.randn(size, size, device=device).to(dtype)
            b = torch.randn(size, size, device=device).to(dtype)
            c = torch.empty(size, size, dtype=dtype, device=device)

            def mm(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> torch.Tensor:
                return torch.mm(a, b.t(), out=c)

            stats = measure(mm, method, sync=sync)
            points.append(MatmulPoint(str(dtype).removeprefix("torch."), size, stats))
            del a, b, c, mm
            if stats.median >= stop_after_s:
                break
    return tuple(points)


def measure_ceilings(
    device: torch.device,
    buffer_bytes: int,
    method: Method,
    sync: Callable[[], None],
    *,
    stop_after_s: float,
    sizes: tuple[int, ...] = MATMUL_SIZES,
) -> Ceilings:
    bandwidth, moved, copy_stats = measure_bandwidth(device, buffer_bytes, method, sync)
    points = measure_matmul(device, method, sync, stop_after_s=stop_after_s, sizes=sizes)
    best = max(p.rate for p in points)
    return Ceilings(bandwidth, best, moved, copy_stats, points, (bandwidth,))

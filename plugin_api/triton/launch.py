"""Launch parameters of the portable Triton kernels: small per-device tables, one default.

Launchers never hold block sizes, warps or stages as literals: they ask ``table_for(device)``.
A table is found by ``device_key(device)`` (``"xpu:pvc"``, ``"cuda:sm_90"``, ``"cuda:gfx942"``),
then by the device type alone (``"xpu"``), then ``DEFAULT``. The entries are starting points
derived from each device's SIMD width and register file, not measurements; ``plugin-api bench``
measures them. Light: no triton import.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..device_info import intel_gpu_family


@dataclass(frozen=True, slots=True)
class QuantLaunch:
    max_block: int  # elements of one group loaded at once (power of two); larger groups loop
    num_warps: int
    num_stages: int


@dataclass(frozen=True, slots=True)
class AttentionLaunch:
    block_m: int  # query rows per program (tokens x heads of one KV head); power of two >= 16
    block_n: int  # keys per inner-loop step; power of two >= 16
    num_warps: int
    num_stages: int


@dataclass(frozen=True, slots=True)
class CopyLaunch:
    block: int  # elements per program for state-block copies (power of two)
    write_tokens: int  # tokens per program of the KV-cache write (power of two)
    num_warps: int


@dataclass(frozen=True, slots=True)
class GemmTile:
    block_m: int  # rows of x per program; power of two >= 16 (tl.dot's smallest tile)
    block_n: int  # output columns per program; power of two >= 16
    block_k: int  # K per inner-loop step; power of two >= 32 (int8 MMA steps K by 32)
    num_warps: int
    num_stages: int


@dataclass(frozen=True, slots=True)
class ScaledMmLaunch:
    """Tiles of the int8 ``scaled_mm``: ``decode`` when M fits one of its row tiles (a few
    tokens: the weight read dominates, so N tiles are narrow enough to give every core some
    of it), ``prefill`` beyond."""

    decode: GemmTile
    prefill: GemmTile

    def tile_for(self, m: int) -> GemmTile:
        return self.decode if m <= self.decode.block_m else self.prefill


DEFAULT_SCALED_MM = ScaledMmLaunch(
    decode=GemmTile(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2),
    prefill=GemmTile(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=2),
)


@dataclass(frozen=True, slots=True)
class LaunchTable:
    quant: QuantLaunch
    attention: AttentionLaunch
    copy: CopyLaunch
    scaled_mm: ScaledMmLaunch = DEFAULT_SCALED_MM

    def __post_init__(self) -> None:
        checked: list[tuple[str, int, int]] = [
            ("quant.max_block", self.quant.max_block, 16),
            ("attention.block_m", self.attention.block_m, 16),
            ("attention.block_n", self.attention.block_n, 16),
            ("copy.block", self.copy.block, 16),
        ]
        for tier, tile in (("decode", self.scaled_mm.decode), ("prefill", self.scaled_mm.prefill)):
            checked += [
                (f"scaled_mm.{tier}.block_m", tile.block_m, 16),
                (f"scaled_mm.{tier}.block_n", tile.block_n, 16),
                (f"scaled_mm.{tier}.block_k", tile.block_k, 32),
            ]
        for name, value, least in checked:
            if value < least or value & (value - 1):
                raise ValueError(f"LaunchTable.{name}={value} must be a power of two >= {least}")
        w = self.copy.write_tokens
        if w < 1 or w & (w - 1):
            raise ValueError(f"LaunchTable.copy.write_tokens={w} must be a power of two")


DEFAULT = LaunchTable(
    quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
    attention=AttentionLaunch(block_m=64, block_n=32, num_warps=4, num_stages=2),
    copy=CopyLaunch(block=1024, write_tokens=1, num_warps=4),
)

TABLES: dict[str, LaunchTable] = {
    # The interpreter runs each program in Python over numpy: few, large programs are fastest.
    "cpu": LaunchTable(
        quant=QuantLaunch(max_block=256, num_warps=1, num_stages=1),
        attention=AttentionLaunch(block_m=32, block_n=64, num_warps=1, num_stages=1),
        copy=CopyLaunch(block=4096, write_tokens=64, num_warps=1),
        # the interpreter: one program covers the tests' small N and K
        scaled_mm=ScaledMmLaunch(
            decode=GemmTile(block_m=16, block_n=128, block_k=128, num_warps=1, num_stages=1),
            prefill=GemmTile(block_m=64, block_n=128, block_k=128, num_warps=1, num_stages=1),
        ),
    ),
    # Data Center GPU Max: 16-lane sub-groups, large register file: wide tiles, 8 warps.
    "xpu:pvc": LaunchTable(
        quant=QuantLaunch(max_block=2048, num_warps=8, num_stages=1),
        attention=AttentionLaunch(block_m=64, block_n=64, num_warps=8, num_stages=2),
        copy=CopyLaunch(block=2048, write_tokens=1, num_warps=8),
        scaled_mm=ScaledMmLaunch(
            decode=GemmTile(block_m=16, block_n=64, block_k=128, num_warps=8, num_stages=2),
            prefill=GemmTile(block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=2),
        ),
    ),
    # Arc (client parts): smaller register file per core, keep tiles moderate.
    "xpu": LaunchTable(
        quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
        attention=AttentionLaunch(block_m=32, block_n=32, num_warps=4, num_stages=2),
        copy=CopyLaunch(block=1024, write_tokens=1, num_warps=4),
        scaled_mm=ScaledMmLaunch(
            decode=GemmTile(block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=2),
            prefill=GemmTile(block_m=32, block_n=64, block_k=64, num_warps=4, num_stages=2),
        ),
    ),
    # Hopper: 228 KB shared memory per SM allows deeper pipelining of the KV loop.
    "cuda:sm_90": LaunchTable(
        quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
        attention=AttentionLaunch(block_m=64, block_n=64, num_warps=4, num_stages=3),
        copy=CopyLaunch(block=2048, write_tokens=1, num_warps=4),
        # int8 decode: N tiles of 32 give a 4096-wide layer 128 programs (132 SMs); four
        # stages of 32 x 256 weight bytes keep ~48 KB per SM in flight. Prefill: wgmma tiles.
        scaled_mm=ScaledMmLaunch(
            decode=GemmTile(block_m=16, block_n=32, block_k=256, num_warps=4, num_stages=4),
            prefill=GemmTile(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=3),
        ),
    ),
    # ROCm entries are unmeasured starting points. A "warp" is a wavefront: 64 lanes on CDNA
    # (gfx942, gfx950), 32 on RDNA (gfx1100). AMD's pipeliner stages K/V tiles through LDS.
    # MI300X (CDNA3): 64 KB LDS per CU; one stage keeps head-256 K/V tiles of 32 keys inside it.
    "cuda:gfx942": LaunchTable(
        quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
        attention=AttentionLaunch(block_m=64, block_n=32, num_warps=4, num_stages=1),
        copy=CopyLaunch(block=2048, write_tokens=1, num_warps=4),
        # int8 tiles within 64 KB of LDS, double-buffered (304 CUs: narrow decode tiles)
        scaled_mm=ScaledMmLaunch(
            decode=GemmTile(block_m=16, block_n=32, block_k=256, num_warps=4, num_stages=2),
            prefill=GemmTile(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=2),
        ),
    ),
    # MI355X (CDNA4): 160 KB LDS per CU: wider key tiles, double-buffered.
    "cuda:gfx950": LaunchTable(
        quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
        attention=AttentionLaunch(block_m=64, block_n=64, num_warps=4, num_stages=2),
        copy=CopyLaunch(block=2048, write_tokens=1, num_warps=4),
        scaled_mm=ScaledMmLaunch(
            decode=GemmTile(block_m=16, block_n=32, block_k=256, num_warps=4, num_stages=2),
            prefill=GemmTile(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=2),
        ),
    ),
    # Radeon RX 7900 (RDNA3): wave32, fewer registers per lane: half-height query tiles.
    "cuda:gfx1100": LaunchTable(
        quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
        attention=AttentionLaunch(block_m=32, block_n=32, num_warps=4, num_stages=1),
        copy=CopyLaunch(block=1024, write_tokens=1, num_warps=4),
        scaled_mm=ScaledMmLaunch(
            decode=GemmTile(block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=1),
            prefill=GemmTile(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=1),
        ),
    ),
}


@functools.lru_cache(maxsize=16)
def _key(device_type: str, index: int | None) -> str:
    if device_type == "xpu":
        return f"xpu:{intel_gpu_family(torch.xpu.get_device_properties(index).name)}"
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(index)
        if torch.version.hip is not None:
            return f"cuda:{str(getattr(props, 'gcnArchName', '')).split(':')[0]}"
        return f"cuda:sm_{props.major}{props.minor}"
    return device_type


def device_key(device: torch.device) -> str:
    """``"<device type>:<arch>"`` for accelerators (read once per device), else the type."""
    return _key(device.type, device.index)


def lookup(key: str) -> LaunchTable:
    """The table for ``key``: exact, then its device type, then ``DEFAULT``."""
    return TABLES.get(key) or TABLES.get(key.split(":", 1)[0]) or DEFAULT


def table_for(device: torch.device) -> LaunchTable:
    return lookup(device_key(device))

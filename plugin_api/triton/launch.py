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
class LaunchTable:
    quant: QuantLaunch
    attention: AttentionLaunch
    copy: CopyLaunch

    def __post_init__(self) -> None:
        for name, value in (
            ("quant.max_block", self.quant.max_block),
            ("attention.block_m", self.attention.block_m),
            ("attention.block_n", self.attention.block_n),
            ("copy.block", self.copy.block),
        ):
            if value < 16 or value & (value - 1):
                raise ValueError(f"LaunchTable.{name}={value} must be a power of two >= 16")
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
    ),
    # Data Center GPU Max: 16-lane sub-groups, large register file: wide tiles, 8 warps.
    "xpu:pvc": LaunchTable(
        quant=QuantLaunch(max_block=2048, num_warps=8, num_stages=1),
        attention=AttentionLaunch(block_m=64, block_n=64, num_warps=8, num_stages=2),
        copy=CopyLaunch(block=2048, write_tokens=1, num_warps=8),
    ),
    # Arc (client parts): smaller register file per core, keep tiles moderate.
    "xpu": LaunchTable(
        quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
        attention=AttentionLaunch(block_m=32, block_n=32, num_warps=4, num_stages=2),
        copy=CopyLaunch(block=1024, write_tokens=1, num_warps=4),
    ),
    # Hopper: 228 KB shared memory per SM allows deeper pipelining of the KV loop.
    "cuda:sm_90": LaunchTable(
        quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
        attention=AttentionLaunch(block_m=64, block_n=64, num_warps=4, num_stages=3),
        copy=CopyLaunch(block=2048, write_tokens=1, num_warps=4),
    ),
    # ROCm entries are unmeasured starting points. A "warp" is a wavefront: 64 lanes on CDNA
    # (gfx942, gfx950), 32 on RDNA (gfx1100). AMD's pipeliner stages K/V tiles through LDS.
    # MI300X (CDNA3): 64 KB LDS per CU; one stage keeps head-256 K/V tiles of 32 keys inside it.
    "cuda:gfx942": LaunchTable(
        quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
        attention=AttentionLaunch(block_m=64, block_n=32, num_warps=4, num_stages=1),
        copy=CopyLaunch(block=2048, write_tokens=1, num_warps=4),
    ),
    # MI355X (CDNA4): 160 KB LDS per CU: wider key tiles, double-buffered.
    "cuda:gfx950": LaunchTable(
        quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
        attention=AttentionLaunch(block_m=64, block_n=64, num_warps=4, num_stages=2),
        copy=CopyLaunch(block=2048, write_tokens=1, num_warps=4),
    ),
    # Radeon RX 7900 (RDNA3): wave32, fewer registers per lane: half-height query tiles.
    "cuda:gfx1100": LaunchTable(
        quant=QuantLaunch(max_block=1024, num_warps=4, num_stages=1),
        attention=AttentionLaunch(block_m=32, block_n=32, num_warps=4, num_stages=1),
        copy=CopyLaunch(block=1024, write_tokens=1, num_warps=4),
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

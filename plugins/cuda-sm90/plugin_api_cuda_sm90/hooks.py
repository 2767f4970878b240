"""pluggy hookimpls of the ``cuda-sm90`` backend. Light: heavy modules load inside the hooks."""

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
        from .attention import FlashInferAttention

        return (FlashInferAttention(),)
    if family is OpFamily.GEMM:
        from .gemm import TorchCudaGemm

        return (TorchCudaGemm(),)
    if family is OpFamily.QUANT:
        from .quant import implementations

        return implementations()
    if family is OpFamily.STATE:
        from .state import implementations

        return implementations()
    raise ValueError(f"cuda-sm90: unknown op family {family!r}")

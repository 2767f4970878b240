"""pluggy hookimpls of the ``rocm`` backend. Light: heavy modules load inside the hooks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from plugin_api.contract import Availability, OpFamily
from plugin_api.device_info import DeviceInfo
from plugin_api.hookspecs import hookimpl

from .probe import probe


@hookimpl
def plugin_api_probe(info: DeviceInfo) -> Availability:
    return probe(info)


@hookimpl
def plugin_api_machine_facts() -> Mapping[str, str]:
    from .facts import read

    return read()


@hookimpl
def plugin_api_implementations(family: OpFamily) -> Sequence[object]:
    if family is OpFamily.ATTENTION:
        from .attention import implementations
    elif family is OpFamily.GEMM:
        from .gemm import implementations
    elif family is OpFamily.QUANT:
        from .quant import implementations
    elif family is OpFamily.STATE:
        from .state import implementations
    else:
        raise ValueError(f"rocm: unknown op family {family!r}")
    return implementations()

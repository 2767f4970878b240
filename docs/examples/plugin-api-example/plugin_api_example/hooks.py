"""pluggy hookimpls of the ``example`` backend. Light: the op module loads inside the hook."""

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
    # The host asks only for the families the descriptor lists, and only once selected.
    if family is OpFamily.QUANT:
        from .quant import ChunkedGroupQuant

        return (ChunkedGroupQuant(),)
    raise LookupError(f"example provides no {family} implementations")

"""pluggy hookimpls of the ``example`` backend: its probe, and its implementations, one module per
op family (``quant``). Light: those modules load when the host asks for them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from plugin_api.contract import Availability, OpFamily
from plugin_api.device_info import DeviceInfo
from plugin_api.hookspecs import hookimpl, implementations_in

from .probe import probe

if TYPE_CHECKING:
    from plugin_api.ops.protocols import Implementation


@hookimpl
def plugin_api_probe(info: DeviceInfo) -> Availability:
    return probe(info)


@hookimpl
def plugin_api_implementations(family: OpFamily) -> Sequence[Implementation]:
    return implementations_in(__package__, family)

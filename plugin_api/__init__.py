"""plugin-api: the hardware-backend layer for LLM inference.

This module only re-exports the public names; each lives in a small module of its own. The op
names (which need torch) load on first use, so that ``import plugin_api`` and backend selection
stay light.
"""

from typing import TYPE_CHECKING, Any

from ._version import HOST_API_VERSION, __version__
from .contract import Availability, BackendDescriptor, OpFamily, Status
from .device_info import Accelerator, DeviceInfo, TorchBuild, read_device_info
from .errors import (
    AmbiguousSelection,
    BackendNotInstalled,
    BackendUnavailable,
    FallbackRefused,
    PluginApiError,
    SelectionError,
    SettingError,
    StaleSelection,
    UnsupportedSpec,
)
from .hookspecs import hookimpl
from .selection import PluginApiWarning, Selection, select_backend

# op-layer names, imported from their module on first access
_LAZY = {
    "Attention": "plugin_api.ops.attention",
    "AttentionBatch": "plugin_api.ops.attention",
    "AttentionSpec": "plugin_api.ops.attention",
    "KVCache": "plugin_api.ops.attention",
    "attention": "plugin_api.ops.attention",
    "GemmSpec": "plugin_api.ops.gemm",
    "PackedWeight": "plugin_api.ops.gemm",
    "prepare": "plugin_api.ops.gemm",
    "mm": "plugin_api.ops.gemm",
    "scaled_mm": "plugin_api.ops.gemm",
    "QuantSpec": "plugin_api.ops.quant",
    "per_token_group_quant": "plugin_api.ops.quant",
    "StateSpec": "plugin_api.ops.state",
    "copy_state_blocks": "plugin_api.ops.state",
    "zero_state_blocks": "plugin_api.ops.state",
    "KVBlockPool": "plugin_api.kv_cache",
    "KVCacheError": "plugin_api.kv_cache",
    "KVCacheManager": "plugin_api.kv_cache",
    "OutOfKVBlocks": "plugin_api.kv_cache",
    "copy_kv_blocks": "plugin_api.kv_cache.tensors",
    "GraphLevel": "plugin_api.contract.graphs",
    "GraphSupport": "plugin_api.contract.graphs",
    "Decision": "plugin_api.contract.decision",
    "ImplPath": "plugin_api.contract.decision",
    "record_ops": "plugin_api.contract.provenance",
    "Backend": "plugin_api.backend",
    "backend_for": "plugin_api.backend",
    "process_backend": "plugin_api.backend",
    "warm_up": "plugin_api._warm_up",
}

if TYPE_CHECKING:
    from ._warm_up import warm_up
    from .backend import Backend, backend_for, process_backend
    from .contract.decision import Decision, ImplPath
    from .contract.graphs import GraphLevel, GraphSupport
    from .contract.provenance import record_ops
    from .kv_cache import KVBlockPool, KVCacheError, KVCacheManager, OutOfKVBlocks
    from .kv_cache.tensors import copy_kv_blocks
    from .ops.attention import Attention, AttentionBatch, AttentionSpec, KVCache, attention
    from .ops.gemm import GemmSpec, PackedWeight, mm, prepare, scaled_mm
    from .ops.quant import QuantSpec, per_token_group_quant
    from .ops.state import StateSpec, copy_state_blocks, zero_state_blocks


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'plugin_api' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "HOST_API_VERSION",
    "Accelerator",
    "AmbiguousSelection",
    "Attention",
    "AttentionBatch",
    "AttentionSpec",
    "Availability",
    "Backend",
    "BackendDescriptor",
    "BackendNotInstalled",
    "BackendUnavailable",
    "Decision",
    "DeviceInfo",
    "FallbackRefused",
    "GemmSpec",
    "GraphLevel",
    "GraphSupport",
    "ImplPath",
    "KVBlockPool",
    "KVCache",
    "KVCacheError",
    "KVCacheManager",
    "OpFamily",
    "OutOfKVBlocks",
    "PackedWeight",
    "PluginApiError",
    "PluginApiWarning",
    "QuantSpec",
    "Selection",
    "SelectionError",
    "SettingError",
    "StaleSelection",
    "StateSpec",
    "Status",
    "TorchBuild",
    "UnsupportedSpec",
    "__version__",
    "attention",
    "backend_for",
    "copy_kv_blocks",
    "copy_state_blocks",
    "hookimpl",
    "mm",
    "per_token_group_quant",
    "prepare",
    "process_backend",
    "read_device_info",
    "record_ops",
    "scaled_mm",
    "select_backend",
    "warm_up",
    "zero_state_blocks",
]

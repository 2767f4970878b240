"""Static facts about the built-in ``reference`` backend (entry point ``reference``)."""

from plugin_api._version import HOST_API_VERSION
from plugin_api.contract import BackendDescriptor, OpFamily

DESCRIPTOR = BackendDescriptor(
    id="reference",
    host_api=f"=={HOST_API_VERSION}",  # ships with the host, so exactly this API
    priority=0,
    families=tuple(OpFamily),
    device_kinds=("any",),
    hooks="plugin_api.reference.hooks",
    summary="portable eager-torch oracle: every feature, any device torch supports",
)

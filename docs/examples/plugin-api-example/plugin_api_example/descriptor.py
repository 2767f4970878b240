"""Static facts about the ``example`` backend. Importing this imports no torch and no kernel."""

from plugin_api.contract import BackendDescriptor, OpFamily

DESCRIPTOR = BackendDescriptor(
    id="example",  # must equal the entry-point name in pyproject.toml
    host_api=">=1.0,<2",  # checked by the host before any other module of this plugin loads
    priority=1,  # only matters among validated plugins; this one never claims validated
    families=(OpFamily.QUANT,),  # the host asks for nothing else
    device_kinds=("cpu",),
    hooks="plugin_api_example.hooks",
    summary="worked example from docs/writing-a-plugin.md: int8 group quantization, eager torch",
)

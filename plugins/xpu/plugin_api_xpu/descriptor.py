"""Static facts about the ``xpu`` backend. Importing this imports neither IPEX nor triton."""

from plugin_api.contract import BackendDescriptor, OpFamily

DESCRIPTOR = BackendDescriptor(
    id="xpu",
    host_api=">=1.0,<2",
    priority=20,
    families=(OpFamily.ATTENTION, OpFamily.GEMM, OpFamily.QUANT, OpFamily.STATE),
    device_kinds=("xpu",),
    hooks="plugin_api_xpu.hooks",
    summary="Intel Data Center GPU Max / Arc through torch.xpu and Triton (IPEX optional)",
    libraries=("intel-extension-for-pytorch", "pytorch-triton-xpu"),
)

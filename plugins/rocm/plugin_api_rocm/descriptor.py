"""Static facts about the ``rocm`` backend. Importing this imports no GPU library."""

from plugin_api.contract import BackendDescriptor, OpFamily

DESCRIPTOR = BackendDescriptor(
    id="rocm",
    host_api=">=1.0,<2",
    priority=20,
    families=(OpFamily.ATTENTION, OpFamily.GEMM, OpFamily.QUANT, OpFamily.STATE),
    device_kinds=("rocm",),
    hooks="plugin_api_rocm.hooks",
    summary="AMD Instinct/Radeon through HIP torch: Triton kernels, HIP-graph declarations",
    libraries=("pytorch-triton-rocm",),
)

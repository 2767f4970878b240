"""Static facts about the ``cuda-sm90`` backend. Importing this imports no GPU library."""

from plugin_api.contract import BackendDescriptor, OpFamily

DESCRIPTOR = BackendDescriptor(
    id="cuda-sm90",
    host_api=">=1.0,<2",
    priority=20,
    families=(OpFamily.ATTENTION, OpFamily.GEMM, OpFamily.QUANT, OpFamily.STATE),
    device_kinds=("cuda",),
    hooks="plugin_api_cuda_sm90.hooks",
    summary="NVIDIA Hopper (SM90): FlashInfer attention with XQA decode, CUDA-graph declarations",
    libraries=("flashinfer-python", "pytorch-triton"),
)

"""vLLM's CUDA platform, with attention and linear layers on plugin-api."""

from typing import TYPE_CHECKING

# vLLM binds CudaPlatform at import to its NVML or non-NVML class; both derive CudaPlatformBase,
# which is what a type checker can see.
if TYPE_CHECKING:
    from vllm.platforms.cuda import CudaPlatformBase as VllmCudaPlatform
else:
    from vllm.platforms.cuda import CudaPlatform as VllmCudaPlatform

from .bridge import BridgePlatform


class CudaPlatform(BridgePlatform, VllmCudaPlatform):
    vllm_worker = "vllm.v1.worker.gpu_worker.Worker"
    bridge_worker = "plugin_api_vllm.workers.gpu.Worker"

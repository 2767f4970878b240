"""vLLM's CUDA platform, with attention and linear layers on plugin-api."""

from vllm.platforms.cuda import CudaPlatform as VllmCudaPlatform

from .bridge import BridgePlatform


class CudaPlatform(BridgePlatform, VllmCudaPlatform):
    vllm_worker = "vllm.v1.worker.gpu_worker.Worker"
    bridge_worker = "plugin_api_vllm.workers.gpu.Worker"

"""vLLM's ROCm platform, with attention and linear layers on plugin-api."""

from vllm.platforms.rocm import RocmPlatform as VllmRocmPlatform

from .bridge import BridgePlatform


class RocmPlatform(BridgePlatform, VllmRocmPlatform):
    vllm_worker = "vllm.v1.worker.gpu_worker.Worker"
    bridge_worker = "plugin_api_vllm.workers.gpu.Worker"

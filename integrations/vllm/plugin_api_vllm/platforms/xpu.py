"""vLLM's XPU platform, with attention and linear layers on plugin-api."""

from vllm.platforms.xpu import XPUPlatform as VllmXpuPlatform

from .bridge import BridgePlatform


class XpuPlatform(BridgePlatform, VllmXpuPlatform):
    vllm_worker = "vllm.v1.worker.xpu_worker.XPUWorker"
    bridge_worker = "plugin_api_vllm.workers.xpu.Worker"

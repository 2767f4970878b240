"""vLLM's CPU platform, with attention and linear layers on plugin-api."""

from vllm.platforms.cpu import CpuPlatform as VllmCpuPlatform

from .bridge import BridgePlatform


class CpuPlatform(BridgePlatform, VllmCpuPlatform):
    vllm_worker = "vllm.v1.worker.cpu_worker.CPUWorker"
    bridge_worker = "plugin_api_vllm.workers.cpu.Worker"

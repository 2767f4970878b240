"""vLLM's GPU worker (CUDA and ROCm), with the model's layers on plugin-api."""

from vllm.v1.worker.gpu_worker import Worker as GpuWorker

from .bridge import BridgeWorker


class Worker(BridgeWorker, GpuWorker):
    pass

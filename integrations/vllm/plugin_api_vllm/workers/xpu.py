"""vLLM's XPU worker, with the model's layers on plugin-api."""

from vllm.v1.worker.xpu_worker import XPUWorker

from .bridge import BridgeWorker


class Worker(BridgeWorker, XPUWorker):
    pass

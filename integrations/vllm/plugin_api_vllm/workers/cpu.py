"""vLLM's CPU worker, with the model's layers on plugin-api."""

from vllm.v1.worker.cpu_worker import CPUWorker

from .bridge import BridgeWorker


class Worker(BridgeWorker, CPUWorker):
    pass

"""vLLM worker classes, one module per device: vLLM's worker, loading the model with its linear
layers routed to plugin-api (``bridge.BridgeWorker``)."""

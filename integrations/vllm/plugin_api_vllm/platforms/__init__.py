"""vLLM platform classes, one module per device type: each subclasses vLLM's own platform for that
device and changes only what routes work to plugin-api (``bridge.BridgePlatform``)."""

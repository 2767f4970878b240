"""plugin-api backend for Intel GPUs through upstream torch.xpu. Entry point: ``descriptor``."""

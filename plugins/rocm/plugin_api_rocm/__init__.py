"""plugin-api backend for AMD GPUs through ROCm. Entry point: ``descriptor``."""

"""plugin-api backend for NVIDIA Hopper (SM90). Entry point: ``descriptor``."""

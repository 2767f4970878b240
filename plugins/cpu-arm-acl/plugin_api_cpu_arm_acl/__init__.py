"""plugin-api backend for Arm CPUs through oneDNN + ACL. Entry point: ``descriptor``."""

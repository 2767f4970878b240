"""The ``reference`` backend: eager torch, every feature of every op family, the oracle."""

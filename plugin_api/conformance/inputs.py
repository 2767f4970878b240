"""The kit's input check: a kernel that writes into one of its inputs fails naming it.

Each input is copied before the call and compared byte for byte after it (NaN payloads and
signed zeros included), so the failure says "modified its input x", not "not close".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


@contextmanager
def unchanged(backend_id: str, **inputs: torch.Tensor | None) -> Iterator[None]:
    """Around one op call: fail if any of ``inputs`` (name=tensor; None is skipped) changed."""
    before = {name: t.detach().clone() for name, t in inputs.items() if t is not None}
    yield
    for name, copy in before.items():
        now = inputs[name]
        assert now is not None
        if not torch.equal(_bytes(now), _bytes(copy)):
            raise AssertionError(f"backend {backend_id!r} modified its input {name}")

"""The cuda-sm90 probe against DeviceInfo for real machine classes (no hardware needed)."""

from __future__ import annotations

import pytest

from plugin_api.machines import MACHINES
from plugin_api_cuda_sm90.probe import probe

VERDICTS = [
    ("h200", "validated"),
    ("h100", "validated"),
    ("b200", "experimental"),
    ("rtx-5090", "experimental"),
    ("a100", "unavailable"),
    ("mi300x", "unavailable"),
    ("max-1550", "unavailable"),
    ("graviton4", "unavailable"),
    ("xeon-cpu", "unavailable"),
]


@pytest.mark.parametrize("machine,status", VERDICTS)
def test_verdict(machine: str, status: str) -> None:
    a = probe(MACHINES[machine])
    assert str(a.status) == status, a.reasons
    assert a.reasons and all(a.reasons)
    assert (a.device_type is None) == (status == "unavailable")

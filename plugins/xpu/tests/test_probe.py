"""The xpu probe against DeviceInfo for real machine classes (no hardware needed)."""

from __future__ import annotations

import pytest

from plugin_api.machines import MACHINES
from plugin_api_xpu.probe import probe

VERDICTS = [
    ("max-1550", "validated"),
    ("arc-b580", "validated"),
    ("h200", "unavailable"),
    ("mi300x", "unavailable"),
    ("xeon-cpu", "unavailable"),
    ("graviton4", "unavailable"),
]


@pytest.mark.parametrize("machine,status", VERDICTS)
def test_verdict(machine: str, status: str) -> None:
    a = probe(MACHINES[machine])
    assert str(a.status) == status, a.reasons
    assert a.reasons and all(a.reasons)
    assert (a.device_type is None) == (status == "unavailable")

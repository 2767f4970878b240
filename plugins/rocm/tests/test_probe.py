"""The rocm probe against DeviceInfo for real machine classes (no hardware needed)."""

from __future__ import annotations

import pytest

from plugin_api.machines import MACHINES
from plugin_api_rocm.probe import probe

VERDICTS = [
    ("mi300x", "validated"),
    ("mi355x", "validated"),
    ("radeon-7900xtx", "experimental"),
    ("h200", "unavailable"),
    ("b200", "unavailable"),
    ("max-1550", "unavailable"),
    ("xeon-cpu", "unavailable"),
]


@pytest.mark.parametrize("machine,status", VERDICTS)
def test_verdict(machine: str, status: str) -> None:
    a = probe(MACHINES[machine])
    assert str(a.status) == status, a.reasons
    assert a.reasons and all(a.reasons)
    assert (a.device_type is None) == (status == "unavailable")

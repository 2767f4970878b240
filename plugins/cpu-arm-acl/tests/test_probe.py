"""The cpu-arm-acl probe against DeviceInfo for real machine classes (no hardware needed)."""

from __future__ import annotations

import pytest

from plugin_api.machines import MACHINES
from plugin_api_cpu_arm_acl.probe import probe

VERDICTS = [
    ("graviton4", "validated"),
    ("graviton4-no-acl", "unavailable"),
    ("xeon-cpu", "experimental"),
    ("h200", "experimental"),
]


@pytest.mark.parametrize("machine,status", VERDICTS)
def test_verdict(machine: str, status: str) -> None:
    a = probe(MACHINES[machine])
    assert str(a.status) == status, a.reasons
    assert a.reasons and all(a.reasons)
    assert (a.device_type is None) == (status == "unavailable")

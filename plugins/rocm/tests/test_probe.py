"""The rocm probe against DeviceInfo for real machine classes (no hardware needed)."""

from __future__ import annotations

import dataclasses

import pytest

from plugin_api.device_info import Accelerator, DeviceInfo, TorchBuild
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
    if status != "unavailable":
        assert a.device_type == "cuda"  # torch reaches HIP devices as "cuda"


def _amd(name: str, arch: str) -> DeviceInfo:
    gpu = Accelerator("amd", "cuda", name, arch, 64 << 30)
    return dataclasses.replace(MACHINES["mi300x"], accelerators=(gpu,))


@pytest.mark.parametrize(
    "name,arch,status,reason",
    [
        ("AMD Instinct MI250X", "gfx90a", "experimental", "supported, not validated (CDNA2"),
        ("AMD Radeon RX 7800 XT", "gfx1101", "experimental", "not validated (RDNA3/RDNA4)"),
        ("AMD Radeon RX 9070 XT", "gfx1201", "experimental", "not validated (RDNA3/RDNA4)"),
        ("AMD Instinct MI100", "gfx908", "unavailable", "supported architectures are gfx942"),
        ("AMD Radeon RX 6900 XT", "gfx1030", "unavailable", "gfx90a and gfx1100+ (experimental)"),
        ("AMD Instinct MI300A (early)", "gfx940", "unavailable", "gfx942/gfx950 (validated)"),
    ],
)
def test_architecture_from_the_device_properties(name, arch, status, reason):
    a = probe(_amd(name, arch))
    assert str(a.status) == status
    assert a.reasons[0].startswith(f"{name} ({arch}): ") and reason in a.reasons[0], a.reasons


@pytest.mark.parametrize(
    "info,reason",
    [
        (DeviceInfo("x86_64"), "torch is not installed"),
        (
            DeviceInfo("x86_64", torch=TorchBuild("2.13.0+cu130", cuda="13.0")),
            "torch 2.13.0+cu130 is not a ROCm build (torch.version.hip is None)",
        ),
        (
            DeviceInfo("x86_64", torch=TorchBuild("2.13.0+rocm7.0", hip="7.0.0")),
            "no AMD GPU visible to torch (HIP 7.0.0)",
        ),
    ],
    ids=["no-torch", "cuda-torch", "hip-torch-no-gpu"],
)
def test_unavailable_says_why(info, reason):
    a = probe(info)
    assert str(a.status) == "unavailable" and a.reasons == (reason,)

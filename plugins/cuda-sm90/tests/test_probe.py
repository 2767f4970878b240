"""The cuda-sm90 probe against DeviceInfo for real machine classes (no hardware needed)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from plugin_api.machines import MACHINES
from plugin_api_cuda_sm90.probe import probe
from plugin_api_cuda_sm90.versions import VALIDATED

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


@pytest.mark.parametrize(
    "flashinfer,reason",
    [
        (None, "flashinfer-python is not installed"),
        ("0.6.17", "flashinfer-python 0.6.17 is outside the validated range"),
        ("0.7.5", "flashinfer-python 0.7.5 is outside the validated range"),
    ],
)
@pytest.mark.parametrize("machine", ["h200", "b200"])
def test_flashinfer_missing_or_out_of_range(machine: str, flashinfer: str | None, reason: str):
    info = MACHINES[machine]
    libs = {k: v for k, v in info.libraries if k != "flashinfer-python"}
    if flashinfer is not None:
        libs["flashinfer-python"] = flashinfer
    a = probe(dataclasses.replace(info, libraries=tuple(libs.items())))
    assert str(a.status) == "unavailable"
    assert any(reason in r for r in a.reasons), a.reasons
    assert any("compute capability" in r for r in a.reasons), "the GPU is still named"


def test_validated_names_the_flashinfer_version() -> None:
    a = probe(MACHINES["h200"])
    assert any("flashinfer-python 0.7.4" in r for r in a.reasons), a.reasons


def test_install_extra_and_makefile_pin_the_validated_range() -> None:
    root = Path(__file__).parents[1]
    found = re.search(
        r'^flashinfer = \["(flashinfer-python[^"]*)"\]', (root / "pyproject.toml").read_text(), re.M
    )
    assert found, "pyproject.toml lost its flashinfer extra"
    req = found.group(1)
    assert SpecifierSet(req.removeprefix("flashinfer-python")) == VALIDATED
    make = (root.parents[1] / "Makefile").read_text()
    assert f"'{req}'" in make, "the Makefile installs another flashinfer than the extra"

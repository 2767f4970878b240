"""Quant and state on the host's Triton kernels: what the plugin declares for them on an H200
(validated), a B200 (experimental) and a machine whose Triton is missing or too old, from
``DeviceInfo`` alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plugin_api.contract import OpFamily
from plugin_api.contract.decision import ImplPath
from plugin_api.machines import MACHINES
from plugin_api.ops.attention import FP8
from plugin_api.ops.quant import QuantSpec
from plugin_api.ops.state import StateSpec
from plugin_api_cuda_sm90.descriptor import DESCRIPTOR
from plugin_api_cuda_sm90.hooks import HOOKS
from plugin_api_cuda_sm90.probe import TRITON, probe

SPECS = {
    OpFamily.QUANT: QuantSpec(7168, 128, torch.bfloat16, FP8, True, True),
    OpFamily.STATE: StateSpec(((5376, 3), (80, 64, 128)), (torch.bfloat16, torch.float32)),
}


def _with_triton(machine: str, version: str | None):
    info = MACHINES[machine]
    libs = {k: v for k, v in info.libraries if k != "triton"}
    if version is not None:
        libs["triton"] = version
    return dataclasses.replace(info, libraries=tuple(libs.items()))


def test_families_are_declared_statically():
    assert [str(f) for f in DESCRIPTOR.families] == ["attention", "gemm", "quant", "state"]
    assert "pytorch-triton" in DESCRIPTOR.libraries  # the nightlies' name for triton


def test_the_kernels_run_on_cuda_without_declaring_graphs():
    assert (TRITON.device_type, TRITON.distributions) == ("cuda", ("triton", "pytorch-triton"))
    assert TRITON.graph_capture is None  # attention is FlashInfer's, with its own graph table


@pytest.mark.parametrize("machine,status", [("h200", "validated"), ("b200", "experimental")])
@pytest.mark.parametrize("family", list(SPECS), ids=str)
def test_served_by_triton(machine, status, family):
    info = MACHINES[machine]
    a = probe(info)
    assert str(a.status) == status and a.reasons[-1] == "Triton kernels (triton 3.9.0)"
    (impl,) = HOOKS.plugin_api_implementations(family)
    assert impl.path is ImplPath.TRITON and impl.target is TRITON
    d = impl.supports(SPECS[family], info)
    assert d.ok and d.reasons[0] == "Triton kernels (triton 3.9.0)"


@pytest.mark.parametrize(
    "version,reason",
    [
        (None, "no Triton for cuda: none of triton, pytorch-triton is installed"),
        ("2.3.1", "triton 2.3.1 is older than the kernels need (3.0+)"),
    ],
)
def test_without_a_usable_triton_they_fall_back_visibly(version, reason):
    info = _with_triton("h200", version)
    a = probe(info)
    assert str(a.status) == "validated"  # attention and GEMM do not need Triton
    assert a.reasons[-1] == f"{reason}: quant and state fall back to the reference"
    for family, spec in SPECS.items():
        (impl,) = HOOKS.plugin_api_implementations(family)
        d = impl.supports(spec, info)
        assert not d.ok and d.reasons == (reason,)

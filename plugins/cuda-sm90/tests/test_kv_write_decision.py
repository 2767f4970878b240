"""The K/V write is the host's Triton kernel, with no torch path beside it: where the machine
has no usable Triton, attention says so in its decision (a visible fallback to the reference,
an error under strict), from ``DeviceInfo`` alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plugin_api.contract.graphs import GraphLevel
from plugin_api.device_info import DeviceInfo
from plugin_api.machines import MACHINES
from plugin_api.ops.attention import AttentionSpec
from plugin_api_cuda_sm90.attention import FlashInferAttention

SPEC = AttentionSpec(32, 8, 128, torch.bfloat16, block_size=16)
WRITE = "the K/V cache write is the host's Triton kernel"


def with_triton(machine: str, version: str | None) -> DeviceInfo:
    info = MACHINES[machine]
    libs = {k: v for k, v in info.libraries if k != "triton"}
    if version is not None:
        libs["triton"] = version
    return dataclasses.replace(info, libraries=tuple(libs.items()))


@pytest.mark.parametrize(
    "version,reason",
    [
        (None, "no Triton for cuda: none of triton, pytorch-triton is installed"),
        ("2.3.1", "triton 2.3.1 is older than the kernels need (3.0+)"),
    ],
)
@pytest.mark.parametrize("machine", ["h200", "b200"])
def test_no_usable_triton_refuses_specs_that_write(
    machine: str, version: str | None, reason: str
) -> None:
    impl = FlashInferAttention()
    info = with_triton(machine, version)
    d = impl.supports(SPEC, info)
    assert not d.ok and d.reasons == (f"{reason}: {WRITE}",)
    graphs = impl.graph_support(SPEC, info)
    assert graphs.level is GraphLevel.NEVER and WRITE in graphs.reason


def test_kv_sharing_layers_write_nothing_and_need_no_triton() -> None:
    impl = FlashInferAttention()
    info = with_triton("h200", None)
    assert impl.supports(dataclasses.replace(SPEC, kv_sharing=True), info).ok


def test_a_usable_triton_adds_no_reason() -> None:
    d = FlashInferAttention().supports(SPEC, MACHINES["h200"])
    assert d.ok and not any("Triton" in r for r in d.reasons), d.reasons

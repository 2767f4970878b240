"""The Triton implementations' decisions and launch tables: pure, no triton needed.

The kernels themselves are tested in ``tests/triton_kernels`` (interpreter or accelerator).
"""

from __future__ import annotations

import pytest
import torch

from plugin_api.contract.decision import Decision
from plugin_api.contract.graphs import GraphLevel
from plugin_api.device_info import DeviceInfo, TorchBuild
from plugin_api.gpu.triton_target import TritonTarget
from plugin_api.ops.attention import FP8, AttentionSpec
from plugin_api.ops.quant import QuantSpec
from plugin_api.ops.state import StateSpec
from plugin_api.triton.impl import TritonAttention, TritonQuant, TritonState
from plugin_api.triton.launch import (
    DEFAULT,
    TABLES,
    AttentionLaunch,
    GemmTile,
    LaunchTable,
    ScaledMmLaunch,
    lookup,
)


def _capture(info: DeviceInfo) -> Decision:
    if info.fact("test.graphs") == "yes":
        return Decision.accept("test device captures graphs")
    return Decision.reject("test device: no graph capture")


TARGET = TritonTarget("xpu", ("pytorch-triton-xpu", "triton"), _capture)


def _info(libraries: dict[str, str], **facts: str) -> DeviceInfo:
    return DeviceInfo(
        "x86_64",
        torch=TorchBuild("2.13.0+xpu", xpu=True),
        libraries=tuple(libraries.items()),
        facts=tuple(facts.items()),
    )


WITH_TRITON = _info({"pytorch-triton-xpu": "3.9.0"})
SPEC = AttentionSpec(8, 2, 128)


@pytest.mark.parametrize(
    "libraries,ok,reason",
    [
        ({"pytorch-triton-xpu": "3.9.0"}, True, "Triton kernels (pytorch-triton-xpu 3.9.0)"),
        ({"triton": "3.1.0"}, True, "Triton kernels (triton 3.1.0)"),
        ({"triton": "2.3.1"}, False, "triton 2.3.1 is older than the kernels need (3.0+)"),
        (
            {},
            False,
            "no Triton for xpu: none of pytorch-triton-xpu, triton is installed",
        ),
    ],
)
def test_triton_availability_comes_from_device_info(libraries, ok, reason):
    d = TARGET.triton(_info(libraries))
    assert d.ok is ok and d.reasons == (reason,)
    for impl, spec in (
        (TritonAttention(TARGET), SPEC),
        (TritonQuant(TARGET), QuantSpec(512, 128, torch.bfloat16, FP8, True, True)),
        (TritonState(TARGET), StateSpec(((4, 3),), (torch.float32,))),
    ):
        got = impl.supports(spec, _info(libraries))
        assert got.ok is ok and reason in got.reasons


@pytest.mark.parametrize(
    "changes,reason",
    [
        (dict(dcp_size=2), "dcp_size=2: the kernel attends one rank's whole cache"),
        (dict(query_dtype=FP8), "no fp8-query path"),
        (dict(head_size=512), "head_size=512 exceeds 256"),
    ],
)
def test_attention_rejects_what_the_kernel_cannot_do(changes, reason):
    spec = AttentionSpec(**{"num_heads": 8, "num_kv_heads": 2, "head_size": 128, **changes})
    d = TritonAttention(TARGET).supports(spec, WITH_TRITON)
    assert not d.ok and any(reason in r for r in d.reasons), d.reasons


@pytest.mark.parametrize(
    "changes",
    [
        {},
        dict(has_sinks=True, sliding_window=128, num_speculative_tokens=3),
        dict(kv_cache_dtype=FP8, logits_soft_cap=30.0),
        dict(causal=False),
        dict(kv_sharing=True, head_size=256, block_size=32),
    ],
)
def test_attention_accepts_every_feature_of_the_op(changes):
    spec = AttentionSpec(**{"num_heads": 8, "num_kv_heads": 2, "head_size": 128, **changes})
    assert TritonAttention(TARGET).supports(spec, WITH_TRITON).ok


def test_graph_level_follows_the_targets_capture_decision():
    impl = TritonAttention(TARGET)
    never = impl.graph_support(SPEC, WITH_TRITON)
    assert never.level == GraphLevel.NEVER and never.reason == "test device: no graph capture"
    always = impl.graph_support(SPEC, WITH_TRITON.with_facts({"test.graphs": "yes"}))
    assert always.level == GraphLevel.ALWAYS
    assert always.reason.startswith("test device captures graphs; one kernel for mixed batches")


def test_graph_level_is_never_for_a_spec_the_kernels_do_not_serve():
    info = WITH_TRITON.with_facts({"test.graphs": "yes"})
    d = TritonAttention(TARGET).graph_support(AttentionSpec(8, 2, 128, dcp_size=2), info)
    assert d.level == GraphLevel.NEVER
    assert d.reason.startswith("not served here: dcp_size=2: the kernel attends one rank's")


def test_a_target_without_graph_capture_declares_never():
    bare = TritonTarget("cuda", ("triton",))
    d = TritonAttention(bare).graph_support(SPEC, _info({"triton": "3.9.0"}))
    assert d.level == GraphLevel.NEVER
    assert d.reason == "no graph capture is declared for the Triton kernels on cuda"


def test_probe_line_names_the_families_that_fall_back():
    assert TARGET.probe_line(WITH_TRITON, "quant") == "Triton kernels (pytorch-triton-xpu 3.9.0)"
    assert TARGET.probe_line(_info({}), "quant and state") == (
        "no Triton for xpu: none of pytorch-triton-xpu, triton is installed: "
        "quant and state fall back to the reference"
    )


def test_launch_table_lookup_falls_back_by_device_type_then_default():
    assert lookup("xpu:pvc") is TABLES["xpu:pvc"]
    assert lookup("xpu:bmg") is TABLES["xpu"]  # no Arc-specific entry: the xpu one
    assert lookup("cuda:sm_90") is TABLES["cuda:sm_90"]
    assert lookup("cuda:sm_100") is DEFAULT  # no Blackwell entry, no "cuda" entry
    for arch in ("gfx942", "gfx950", "gfx1100"):
        assert lookup(f"cuda:{arch}") is TABLES[f"cuda:{arch}"]
    assert lookup("cuda:gfx90a") is DEFAULT
    assert lookup("cpu") is TABLES["cpu"]


def test_launch_tables_are_checked():
    with pytest.raises(ValueError, match=r"attention.block_m=24 must be a power of two >= 16"):
        LaunchTable(DEFAULT.quant, AttentionLaunch(24, 32, 4, 2), DEFAULT.copy)


def test_scaled_mm_tiles_are_checked_and_chosen_by_m():
    bad = ScaledMmLaunch(GemmTile(16, 32, 16, 4, 2), DEFAULT.scaled_mm.prefill)
    with pytest.raises(
        ValueError, match=r"scaled_mm.decode.block_k=16 must be a power of two >= 32"
    ):
        LaunchTable(DEFAULT.quant, DEFAULT.attention, DEFAULT.copy, bad)
    sm90 = TABLES["cuda:sm_90"].scaled_mm
    assert sm90.tile_for(1) is sm90.tile_for(16) is sm90.decode  # decode: one 16-row tile
    assert sm90.tile_for(17) is sm90.prefill

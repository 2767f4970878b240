"""What the xpu plugin declares on each machine: probe verdict, op families, CUDA-graph level,
IPEX status and the fp32 LM head, all from ``DeviceInfo`` (real for this machine)."""

from __future__ import annotations

import pytest
import torch

from plugin_api.contract.graphs import GraphLevel
from plugin_api.device_info import DeviceInfo, TorchBuild, read_device_info
from plugin_api.gpu.torch_facts import GRAPH_CAPTURE, MM_OUT_DTYPE
from plugin_api.machines import MACHINES
from plugin_api.ops.attention import AttentionSpec
from plugin_api.ops.gemm import GemmSpec
from plugin_api.triton.impl import TritonAttention
from plugin_api_xpu import facts
from plugin_api_xpu.descriptor import DESCRIPTOR
from plugin_api_xpu.gemm import implementations as gemms
from plugin_api_xpu.probe import TRITON, ipex_status, probe

LM_HEAD = GemmSpec(128256, 4096, torch.bfloat16, torch.float32, "lm_head")
KEY = facts.FACTS.key
CAPTURES = "yes: torch 2.13.0+xpu captures and replays XPU graphs (torch.xpu.XPUGraph)"
YES = {KEY(GRAPH_CAPTURE): CAPTURES, KEY(MM_OUT_DTYPE): "yes: torch 2.13.0+xpu computes it"}


def declarations(info: DeviceInfo) -> dict[str, object]:
    a = probe(info)
    graph = TritonAttention(TRITON).graph_support(AttentionSpec(32, 8, 128), info)
    (gemm,) = gemms()
    lm_head = gemm.supports(LM_HEAD, info)
    return {
        "status": str(a.status),
        "reasons": a.reasons,
        "graph": graph,
        "ipex": ipex_status(info),
        "lm_head": lm_head,
    }


def this_machine() -> DeviceInfo:
    return read_device_info(DESCRIPTOR.libraries).with_facts(facts.read())


def test_families_are_declared_statically():
    assert [str(f) for f in DESCRIPTOR.families] == ["attention", "gemm", "quant", "state"]


def test_max_1550_as_described():
    """A what-if description carries no machine facts: graphs and the fp32 LM head are not
    claimed, and each says why."""
    d = declarations(MACHINES["max-1550"])
    assert d["status"] == "validated"
    assert d["reasons"] == (
        "Intel(R) Data Center GPU Max 1550 (Data Center GPU Max)",
        "Triton kernels (pytorch-triton-xpu 3.9.0)",
        "IPEX not installed (optional; upstream torch.xpu + Triton serve every op)",
    )
    assert d["graph"].level == GraphLevel.NEVER
    assert "fact 'xpu.graph_capture' is read from the installed torch" in d["graph"].reason
    assert not d["lm_head"].ok and "fact 'xpu.mm_out_dtype'" in d["lm_head"].because()


def test_max_1550_with_a_capable_torch():
    d = declarations(MACHINES["max-1550"].with_facts(YES))
    assert d["status"] == "validated"
    assert d["graph"].level == GraphLevel.ALWAYS
    assert d["graph"].reason.startswith(
        "XPU graph capture: torch 2.13.0+xpu captures and replays XPU graphs "
        "(torch.xpu.XPUGraph); one kernel"
    )
    assert d["lm_head"].reasons == (
        "bf16 -> fp32: torch.mm(out_dtype=float32) on XPU: torch 2.13.0+xpu computes it",
    )


def test_arc_b580_with_an_older_torch():
    info = MACHINES["arc-b580"].with_facts(
        {
            KEY(GRAPH_CAPTURE): "no: torch 2.13.0+xpu has no torch.xpu.XPUGraph",
            KEY(MM_OUT_DTYPE): "no: torch 2.13.0+xpu raises for it on XPU",
        }
    )
    d = declarations(info)
    assert d["status"] == "validated" and d["reasons"][0].endswith("(Arc B-series)")
    assert d["graph"].level == GraphLevel.NEVER
    assert d["graph"].reason == "XPU graph capture: torch 2.13.0+xpu has no torch.xpu.XPUGraph"
    assert d["lm_head"].because() == (
        "bf16 -> fp32 needs the fp32 accumulator: "
        "torch.mm(out_dtype=float32) on XPU: torch 2.13.0+xpu raises for it on XPU"
    )


def test_torch_without_xpu():
    d = declarations(DeviceInfo("x86_64", torch=TorchBuild("2.13.0+cpu")))
    assert d["status"] == "unavailable"
    assert d["reasons"] == (
        "torch 2.13.0+cpu was built without XPU support (torch.xpu.is_available() is False)",
    )


def test_this_machine():
    info = this_machine()
    d = declarations(info)
    if info.accelerators_of("intel"):
        pytest.skip("this machine has an Intel GPU: the verdicts above are about other ones")
    assert d["status"] == "unavailable" and "torch.xpu.is_available() is False" in d["reasons"][-1]
    if info.torch.xpu:
        want = f"no: no XPU device visible to torch {torch.__version__}"
    else:
        want = f"no: torch {torch.__version__} is not built for XPU"
    assert info.fact(KEY(MM_OUT_DTYPE)) == want and info.fact(KEY(GRAPH_CAPTURE)) == want
    assert d["graph"].level == GraphLevel.NEVER and d["graph"].reason.endswith(want[4:])


def test_no_triton_means_visible_fallbacks():
    info = MACHINES["max-1550"]
    bare = DeviceInfo.from_dict(info.to_dict() | {"libraries": {"torch": "2.13.0"}})
    a = probe(bare)
    assert str(a.status) == "validated"  # GEMM still runs; the rest falls back, warned
    assert a.reasons[1] == (
        "no Triton for xpu: none of pytorch-triton-xpu, triton is installed: "
        "attention, quant and state fall back to the reference"
    )


@pytest.mark.parametrize(
    "ipex,imported,expect",
    [
        ("2.8.10+xpu", None, "IPEX 2.8.10+xpu is built for torch 2.8, not 2.13.0+xpu: not used"),
        (
            "2.13.10+xpu",
            "no: ImportError: undefined symbol: _ZN3c10",
            "does not import (no: ImportError: undefined symbol: _ZN3c10): not used",
        ),
        ("2.13.10+xpu", "yes: imports cleanly", "no op of this plugin routes through it"),
    ],
)
def test_ipex_is_reported_never_required(ipex, imported, expect):
    base = MACHINES["max-1550"].to_dict()
    info = DeviceInfo.from_dict(
        base | {"libraries": base["libraries"] | {"intel-extension-for-pytorch": ipex}}
    )
    if imported is not None:
        info = info.with_facts({facts.IPEX_IMPORT: imported})
    assert expect in ipex_status(info)
    assert str(probe(info).status) == "validated"

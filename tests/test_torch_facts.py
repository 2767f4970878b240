"""Machine facts about torch on a GPU platform (``plugin_api.gpu.torch_facts``): their keys, how a
fact becomes a decision, and the trials that produce them, run here (no GPU: nothing may run on
a device, and each fact says why)."""

from __future__ import annotations

import pytest
import torch

from plugin_api.device_info import TorchBuild
from plugin_api.gpu.device_graphs import graph_module
from plugin_api.gpu.device_trials import int_mm_on, mm_out_dtype_on
from plugin_api.gpu.platforms import CUDA, ROCM, XPU
from plugin_api.gpu.torch_facts import GRAPH_CAPTURE, INT_MM, MM_OUT_DTYPE, NAMES, TorchFacts
from plugin_api.machines import MACHINES
from plugin_api.reference.gemm import has_out_dtype_mm

FACTS = TorchFacts("rocm", ROCM)


def test_keys_are_namespaced_and_checked():
    assert FACTS.key(INT_MM) == "rocm.int_mm"
    with pytest.raises(ValueError, match=r"unknown fact 'mm_dtype'; known: graph_capture"):
        FACTS.key("mm_dtype")


@pytest.mark.parametrize(
    "value,ok,reason",
    [
        ("yes: torch 2.13.0 computes it", True, "torch._int_mm on ROCm: torch 2.13.0 computes it"),
        ("no: torch._int_mm raised", False, "torch._int_mm on ROCm: torch._int_mm raised"),
        ("no", False, "torch._int_mm on ROCm: no"),
        (
            None,
            False,
            "torch._int_mm on ROCm: not established for this machine description (fact "
            "'rocm.int_mm' is read from the installed torch on the real machine)",
        ),
    ],
)
def test_a_fact_becomes_a_decision_with_its_detail(value, ok, reason):
    info = MACHINES["mi300x"]
    if value is not None:
        info = info.with_facts({"rocm.int_mm": value})
    d = FACTS.int_mm(info)
    assert d.ok is ok and d.reasons == (reason,)


def test_what_each_decision_is_called():
    info = MACHINES["mi300x"]
    assert FACTS.graph_capture(info).because().startswith("HIP graph capture: not established")
    assert FACTS.mm_out_dtype(info).because().startswith("torch.mm(out_dtype=float32) on ROCm")
    assert TorchFacts("xpu", XPU).graph_capture(info).because().startswith("XPU graph capture")


def test_triton_target_of_a_platform():
    target = FACTS.triton_target()
    assert (target.device_type, target.distributions) == ("cuda", ROCM.tritons)
    assert target.graph_capture == FACTS.graph_capture
    assert CUDA.triton_target().graph_capture is None


def test_platforms_know_their_torch_builds():
    hip, cuda = TorchBuild("2.13.0+rocm7.0", hip="7.0.0"), TorchBuild("2.13.0+cu130", cuda="13.0")
    assert ROCM.built_into(hip) and not ROCM.built_into(cuda)
    assert CUDA.built_into(cuda) and not CUDA.built_into(hip)
    assert XPU.built_into(TorchBuild("2.13.0+xpu", xpu=True)) and not XPU.built_into(None)


@pytest.mark.parametrize("platform", [CUDA, ROCM, XPU], ids=lambda p: p.name)
def test_trials_run_nothing_without_the_platform(platform):
    facts = TorchFacts("t", platform).read(*NAMES)
    built = platform.built_into(
        TorchBuild(
            torch.__version__,
            cuda=torch.version.cuda,
            hip=torch.version.hip,
            xpu=bool(getattr(torch._C, "_has_xpu", False)),
        )
    )
    if built and graph_module(platform.device_type).is_available():
        pytest.skip(f"this machine has a {platform.name} device: the trials ran on it")
    v = torch.__version__
    why = (
        f"no: no {platform.name} device visible to torch {v}"
        if built
        else f"no: torch {v} is not built for {platform.name}"
    )
    assert facts == {f"t.{GRAPH_CAPTURE}": why, f"t.{MM_OUT_DTYPE}": why, f"t.{INT_MM}": why}


def test_only_cuda_and_xpu_have_graphs():
    with pytest.raises(ValueError, match=r"device_type='cpu' has no graph API in torch"):
        graph_module("cpu")


def test_the_gemm_trials_themselves_on_the_cpu():
    """The trial bodies run on any device; on the CPU, torch 2.13 has an exact torch._int_mm
    and no mm(out_dtype=float32), and the trials say exactly that."""
    cpu, v = torch.device("cpu"), torch.__version__
    assert int_mm_on(cpu, "CPU") == f"yes: torch {v} computes it"
    want = f"no: torch {v} raises for it on CPU"
    if has_out_dtype_mm(cpu):
        want = f"yes: torch {v} computes it"
    assert mm_out_dtype_on(cpu, "CPU") == want

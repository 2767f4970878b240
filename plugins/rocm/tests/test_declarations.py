"""What the rocm plugin declares on each machine: probe verdict, op families, the HIP-graph level
per spec with its reason, and GEMM acceptance, all from ``DeviceInfo`` (real for this machine).

MI300X (gfx942), MI355X (gfx950) and a Radeon RX 7900 XTX (gfx1100) are described by
``plugin_api.machines``; the facts the real machine would add (``rocm.*``) are given per test,
as the installed torch would report them, including the negative answers.
"""

from __future__ import annotations

import json

import pytest
import torch

from plugin_api.backend import ImplCandidate, Resolution, resolve_op
from plugin_api.cli import main
from plugin_api.contract import OpFamily
from plugin_api.contract.graphs import GraphLevel
from plugin_api.device_info import DeviceInfo, read_device_info
from plugin_api.gpu.torch_facts import GRAPH_CAPTURE, INT_MM, MM_OUT_DTYPE
from plugin_api.machines import MACHINES
from plugin_api.ops.attention import FP8, AttentionSpec
from plugin_api.ops.gemm import GemmSpec
from plugin_api.ops.quant import QuantSpec
from plugin_api.ops.state import StateSpec
from plugin_api.reference import gemm as reference_gemm
from plugin_api_rocm.descriptor import DESCRIPTOR
from plugin_api_rocm.facts import FACTS, read
from plugin_api_rocm.hooks import HOOKS
from plugin_api_rocm.probe import probe

BF16 = torch.bfloat16
KEY = FACTS.key
GEMM = OpFamily.GEMM
ATTENTION = AttentionSpec(32, 8, 128, BF16, block_size=16)
LM_HEAD = GemmSpec(128256, 4096, BF16, torch.float32, "lm_head")
W8A8 = GemmSpec(4096, 14336, torch.int8, BF16)
CAPTURES = "yes: torch 2.13.0+rocm7.0 captures and replays HIP graphs (torch.cuda.CUDAGraph)"
YES = {
    KEY(GRAPH_CAPTURE): CAPTURES,
    KEY(MM_OUT_DTYPE): "yes: torch 2.13.0+rocm7.0 computes it",
    KEY(INT_MM): "yes: torch 2.13.0+rocm7.0 computes it",
}


def impl(family: str):
    (found,) = HOOKS.plugin_api_implementations(OpFamily(family))
    return found


def gemm(spec: GemmSpec, info: DeviceInfo) -> Resolution:
    """The host's resolution over this plugin's GEMM implementations (``triton`` for int8, then
    ``torch-rocm``), the reference as the fallback."""
    own = [ImplCandidate(i, "rocm", False) for i in HOOKS.plugin_api_implementations(GEMM)]
    ref = [ImplCandidate(i, "reference", True) for i in reference_gemm.implementations()]
    return resolve_op(GEMM, spec, own + ref, info)


def _without_triton(info: DeviceInfo) -> DeviceInfo:
    return DeviceInfo.from_dict(info.to_dict() | {"libraries": {"torch": "2.13.0"}})


def served_by(r: Resolution) -> str | None:
    """The implementation that serves the spec on this plugin (None: the reference does)."""
    p = r.provenance
    return None if p is None or p.fallback else p.impl


def why_not(r: Resolution, name: str) -> str:
    """What the implementation ``name`` answered."""
    (verdict,) = [v for v in r.trace if v.impl == name]
    return verdict.reason


def declarations(info: DeviceInfo, spec: AttentionSpec = ATTENTION) -> dict[str, object]:
    a = probe(info)
    return {
        "status": str(a.status),
        "reasons": a.reasons,
        "attention": impl("attention").supports(spec, info),
        "graph": impl("attention").graph_support(spec, info),
        "quant": impl("quant").supports(QuantSpec(7168, 128, BF16, FP8, True, True), info),
        "state": impl("state").supports(StateSpec(((4, 3),), (torch.float32,)), info),
        "lm_head": gemm(LM_HEAD, info),
        "w8a8": gemm(W8A8, info),
    }


def test_families_are_declared_statically():
    assert [str(f) for f in DESCRIPTOR.families] == ["attention", "gemm", "quant", "state"]
    assert DESCRIPTOR.device_kinds == ("rocm",)
    assert "pytorch-triton-rocm" in DESCRIPTOR.libraries  # read into DeviceInfo on the machine


def test_mi300x_as_described():
    """A what-if description carries no machine facts: the Triton families are served, graphs,
    the fp32 LM head and int8 are not claimed, and each says why."""
    d = declarations(MACHINES["mi300x"])
    assert d["status"] == "validated"
    assert d["reasons"] == (
        "AMD Instinct MI300X (gfx942): a validated architecture (CDNA3: MI300X/MI325X)",
        "Triton kernels (triton 3.9.0)",
    )
    assert d["attention"].ok and d["quant"].ok and d["state"].ok
    assert d["graph"].level == GraphLevel.NEVER
    assert d["graph"].reason == (
        "HIP graph capture: not established for this machine description (fact "
        "'rocm.graph_capture' is read from the installed torch on the real machine)"
    )
    assert served_by(d["lm_head"]) is None
    assert "fact 'rocm.mm_out_dtype'" in why_not(d["lm_head"], "torch-rocm")
    # int8 needs no fact: the Triton kernel serves it (torch._int_mm would need one)
    assert served_by(d["w8a8"]) == "triton"
    assert "fact 'rocm.int_mm'" in why_not(d["w8a8"], "torch-rocm")


@pytest.mark.parametrize(
    "machine,first_reason",
    [
        ("mi300x", "AMD Instinct MI300X (gfx942): a validated architecture (CDNA3: MI300X/MI325X)"),
        ("mi355x", "AMD Instinct MI355X (gfx950): a validated architecture (CDNA4: MI350X/MI355X)"),
    ],
)
def test_instinct_with_a_capable_torch(machine, first_reason):
    d = declarations(MACHINES[machine].with_facts(YES))
    assert d["status"] == "validated" and d["reasons"][0] == first_reason
    assert d["graph"].level == GraphLevel.ALWAYS
    assert d["graph"].reason.startswith(
        "HIP graph capture: torch 2.13.0+rocm7.0 captures and replays HIP graphs "
        "(torch.cuda.CUDAGraph); one kernel for mixed batches"
    )
    assert served_by(d["lm_head"]) == "torch-rocm"
    assert why_not(d["lm_head"], "torch-rocm") == (
        "chosen: bf16 -> fp32: torch.mm(out_dtype=float32) on ROCm: torch 2.13.0+rocm7.0 "
        "computes it"
    )
    assert served_by(d["w8a8"]) == "triton"
    assert why_not(d["w8a8"], "torch-rocm") == "also accepts, lower preference than triton"
    assert served_by(gemm(W8A8, _without_triton(MACHINES[machine].with_facts(YES)))) == "torch-rocm"


def test_radeon_7900xtx_with_a_torch_lacking_both_gemm_features():
    info = MACHINES["radeon-7900xtx"].with_facts(
        {
            KEY(GRAPH_CAPTURE): CAPTURES,
            KEY(MM_OUT_DTYPE): "no: torch 2.13.0+rocm7.0 raises for it on ROCm",
            KEY(
                INT_MM
            ): "no: torch._int_mm raised on ROCm (RuntimeError: hipblaslt: not supported)",
        }
    )
    d = declarations(info)
    assert d["status"] == "experimental"
    assert d["reasons"] == (
        "AMD Radeon RX 7900 XTX (gfx1100): supported, not validated (RDNA3/RDNA4)",
        "Triton kernels (triton 3.9.0)",
    )
    assert d["graph"].level == GraphLevel.ALWAYS
    assert served_by(d["lm_head"]) is None
    assert why_not(d["lm_head"], "torch-rocm") == (
        "bf16 -> fp32 needs the fp32 accumulator: torch.mm(out_dtype=float32) on ROCm: "
        "torch 2.13.0+rocm7.0 raises for it on ROCm"
    )
    assert served_by(d["w8a8"]) == "triton"  # Triton does not need torch._int_mm
    assert why_not(d["w8a8"], "torch-rocm") == (
        "int8 scaled_mm needs torch._int_mm: torch._int_mm on ROCm: torch._int_mm raised on "
        "ROCm (RuntimeError: hipblaslt: not supported)"
    )


def test_a_failed_capture_trial_means_no_graphs():
    failed = "no: capturing a HIP graph failed (RuntimeError: hipErrorStreamCaptureUnsupported)"
    d = declarations(MACHINES["mi300x"].with_facts(YES | {KEY(GRAPH_CAPTURE): failed}))
    assert d["graph"].level == GraphLevel.NEVER
    assert d["graph"].reason == (
        "HIP graph capture: capturing a HIP graph failed (RuntimeError: "
        "hipErrorStreamCaptureUnsupported)"
    )


@pytest.mark.parametrize(
    "changes,reason",
    [
        (
            dict(dcp_size=2),
            "not served here: dcp_size=2: the kernel attends one rank's whole cache",
        ),
        (dict(head_size=512), "not served here: head_size=512 exceeds 256"),
        (dict(query_dtype=FP8), "not served here: query_dtype=torch.float8_e4m3fn differs"),
    ],
)
def test_graph_level_is_per_spec(changes, reason):
    """A spec the kernels do not serve gets NEVER with their reason, even where HIP graphs work;
    every served feature keeps ALWAYS."""
    info = MACHINES["mi300x"].with_facts(YES)
    served = AttentionSpec(8, 2, 128, BF16, kv_cache_dtype=FP8, sliding_window=64, has_sinks=True)
    assert declarations(info, served)["graph"].level == GraphLevel.ALWAYS
    spec = AttentionSpec(**{"num_heads": 8, "num_kv_heads": 2, "head_size": 128, **changes})
    d = declarations(info, spec)
    assert not d["attention"].ok
    assert d["graph"].level == GraphLevel.NEVER and d["graph"].reason.startswith(reason)


@pytest.mark.parametrize(
    "n,k,multiple_of_8", [(4096, 14336, True), (130, 512, False), (96, 100, False)], ids=str
)
def test_int8_shapes(n, k, multiple_of_8):
    """Triton serves int8 at any N and K; without it ``torch._int_mm`` needs multiples of 8."""
    spec = GemmSpec(n, k, torch.int8, BF16)
    info = MACHINES["mi300x"].with_facts(YES)
    assert served_by(gemm(spec, info)) == "triton"
    r = gemm(spec, _without_triton(info))
    assert served_by(r) == ("torch-rocm" if multiple_of_8 else None), r.trace_text()
    assert "no Triton for cuda" in why_not(r, "triton")
    if not multiple_of_8:
        assert "torch._int_mm needs N and K multiples of 8" in why_not(r, "torch-rocm")


def test_no_triton_means_visible_fallbacks():
    d = declarations(_without_triton(MACHINES["mi300x"]))
    assert d["status"] == "validated"  # GEMM still runs; the rest falls back, warned
    assert d["reasons"][1] == (
        "no Triton for cuda: none of pytorch-triton-rocm, triton is installed: "
        "attention, quant and state fall back to the reference"
    )
    assert not d["attention"].ok and not d["quant"].ok and not d["state"].ok
    assert served_by(d["w8a8"]) is None  # no Triton, and no rocm.int_mm fact in a what-if
    assert "no Triton for cuda" in why_not(d["w8a8"], "triton")


def test_this_machine():
    info = read_device_info(DESCRIPTOR.libraries).with_facts(read())
    if info.accelerators_of("amd"):
        pytest.skip("this machine has an AMD GPU: the verdicts above are about other ones")
    d = declarations(info)
    assert d["status"] == "unavailable"
    if info.torch.hip is None:
        assert d["reasons"] == (
            f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None)",
        )
        want = f"no: torch {torch.__version__} is not built for ROCm"
    else:
        want = f"no: no ROCm device visible to torch {torch.__version__}"
    assert {k: info.fact(k) for k in YES} == {k: want for k in YES}  # nothing ran on a device
    assert d["graph"].level == GraphLevel.NEVER and served_by(d["lm_head"]) is None
    assert why_not(d["w8a8"], "torch-rocm").endswith(want.removeprefix("no: "))


def _doctor(capsys: pytest.CaptureFixture[str], monkeypatch, device_info: str) -> dict:
    for name in ("PLUGIN_API_BACKEND", "PLUGIN_API_PLUGINS", "PLUGIN_API_STRICT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["doctor", "--json", "--device-info", device_info]) == 0
    return json.loads(capsys.readouterr().out)


def _chosen(data: dict) -> dict[str, dict]:
    llama = next(m for m in data["ops"] if m["model"] == "llama-3-8b")
    found = {layer["name"]: layer["chosen"] for layer in llama["layers"]}
    for m in data["ops"]:  # the fp8 block quant and the SSM state
        found |= {layer["name"]: layer["chosen"] for layer in m["layers"] if "graph" not in layer}
    return found


def test_doctor_on_an_mi300x(capsys, monkeypatch):
    data = _doctor(capsys, monkeypatch, "mi300x")
    (rec,) = [p for p in data["plugins"] if p["id"] == "rocm"]
    assert rec["state"] == "validated"
    assert rec["families"] == ["attention", "gemm", "quant", "state"]
    assert data["selection"]["backend"] == "rocm"
    chosen = _chosen(data)
    for layer in ("attention", "activation quant (w8a8)", "activation group quant", "ssm state"):
        assert chosen[layer] == {
            "impl": "triton",
            "path": "triton",
            "backend": "rocm",
            "fallback": False,
        }, layer
    assert chosen["qkv_proj"]["impl"] == "torch-rocm"
    # no facts in a what-if: the fp32 LM head falls back to the reference, visibly; int8 needs
    # none (Triton serves it)
    assert chosen["lm_head"]["fallback"]
    assert chosen["down_proj (w8a8)"] == dict(chosen["attention"], impl="triton")
    llama = next(m for m in data["ops"] if m["model"] == "llama-3-8b")
    assert llama["graph"]["level"] == "NEVER" and "rocm.graph_capture" in llama["graph"]["reason"]


def test_doctor_on_an_mi300x_file_with_its_facts(capsys, monkeypatch, tmp_path):
    f = tmp_path / "mi300x.json"
    f.write_text(MACHINES["mi300x"].with_facts(YES).to_json())
    data = _doctor(capsys, monkeypatch, str(f))
    chosen = _chosen(data)
    assert chosen["lm_head"]["impl"] == "torch-rocm" and not chosen["lm_head"]["fallback"]
    assert chosen["down_proj (w8a8)"]["impl"] == "triton"
    graphs = {m["model"]: m["graph"]["level"] for m in data["ops"] if "graph" in m}
    assert set(graphs.values()) == {"ALWAYS"}, graphs

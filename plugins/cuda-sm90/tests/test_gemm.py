"""The GEMM implementations (the host's Triton int8 ``scaled_mm``, then the host's ``TorchGemm``
with this plugin's architecture and torch-version rules): which one the host's resolution
picks for each spec (pure, from ``DeviceInfo``), and run-time feature detection. The torch
paths are the host's (``plugin_api.gpu.torch_gemm``), run against the oracles in
``tests/test_torch_gemm.py``; the Triton kernel runs in ``tests/triton_kernels/test_scaled_mm.py``.
On a CUDA GPU, the int8 path runs under torch's sync-debug mode and replays in a CUDA graph."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plugin_api.backend import Backend, ImplCandidate, Resolution, backend_for, resolve_op
from plugin_api.contract import OpFamily
from plugin_api.contract.decision import ImplPath
from plugin_api.contract.provenance import record_ops
from plugin_api.device_info import DeviceInfo, TorchBuild
from plugin_api.errors import SelectionError, UnsupportedSpec
from plugin_api.gpu.device_graphs import capture
from plugin_api.gpu.torch_gemm import out_dtype_mm
from plugin_api.machines import MACHINES
from plugin_api.ops import gemm
from plugin_api.ops.gemm import GemmSpec
from plugin_api.ops.protocols import checked
from plugin_api.ops.quant import per_token_group_quant
from plugin_api.reference import gemm as reference_gemm
from plugin_api.triton.impl.gemm import MAX_K
from plugin_api_cuda_sm90.gemm import implementations
from plugin_api_cuda_sm90.probe import TRITON

H200 = MACHINES["h200"]
LM_HEAD = GemmSpec(248320, 4096, torch.bfloat16, torch.float32, "lm_head")
INT8_O_PROJ = GemmSpec(4096, 4096, torch.int8, torch.bfloat16)
TRITON_GEMM, GEMM = implementations()


def _without_triton(info: DeviceInfo) -> DeviceInfo:
    libs = tuple((k, v) for k, v in info.libraries if k not in TRITON.distributions)
    return dataclasses.replace(info, libraries=libs)


def _resolve(spec: GemmSpec, info: DeviceInfo) -> Resolution:
    """The host's resolution over this plugin's implementations, the reference as fallback."""
    own = [ImplCandidate(i, "cuda-sm90", False) for i in implementations()]
    ref = [ImplCandidate(i, "reference", True) for i in reference_gemm.implementations()]
    return resolve_op(OpFamily.GEMM, spec, own + ref, info)


def _chosen(r: Resolution) -> tuple[str, bool]:
    assert r.provenance is not None, r.trace_text()
    return r.provenance.impl, r.provenance.fallback


def test_the_order_is_triton_then_torch() -> None:
    assert [(i.name, i.path) for i in implementations()] == [
        ("triton", ImplPath.TRITON),
        ("torch-cublas", ImplPath.TORCH),
    ]
    assert TRITON_GEMM.target is TRITON
    # what the host's conform stage checks when the plugin loads on a GPU
    assert len(checked("cuda-sm90", OpFamily.GEMM, implementations())) == 2


@pytest.mark.parametrize(
    "n,k", [(4096, 14336), (130, 512), (96, 100), (67, 200)], ids=lambda v: str(v)
)
def test_int8_goes_to_triton_any_n_and_k(n: int, k: int) -> None:
    r = _resolve(GemmSpec(n, k, torch.int8, torch.bfloat16), H200)
    assert _chosen(r) == ("triton", False)
    assert "one launch" in r.trace[0].reason and r.trace[0].reason.startswith("chosen")
    assert "Triton kernels (triton 3.9.0)" in r.trace[0].reason


@pytest.mark.parametrize(
    "spec",
    [
        LM_HEAD,
        GemmSpec(4096, 4096, torch.bfloat16, torch.bfloat16),
        GemmSpec(96, 100, torch.float16, torch.float16),
        GemmSpec(64, 32, torch.float32, torch.float32),
    ],
    ids=lambda s: s.describe(),
)
def test_float_specs_go_to_torch(spec: GemmSpec) -> None:
    r = _resolve(spec, H200)
    assert _chosen(r) == ("torch-cublas", False)
    assert not r.trace[0].accepted
    assert r.trace[0].reason.endswith("the Triton GEMM serves int8 scaled_mm only")


def test_without_triton_int8_goes_to_torch_int_mm_named_in_the_trace() -> None:
    """No Triton: torch._int_mm serves aligned int8 specs (the trace says why Triton did not);
    unaligned ones have no implementation here and fall back to the reference."""
    info = _without_triton(H200)
    r = _resolve(INT8_O_PROJ, info)
    assert _chosen(r) == ("torch-cublas", False)
    assert r.trace[0].reason == "no Triton for cuda: none of triton, pytorch-triton is installed"
    assert "torch._int_mm" in r.trace[1].reason
    r = _resolve(GemmSpec(96, 100, torch.int8, torch.bfloat16), info)
    assert _chosen(r) == ("reference", True)
    assert "multiples of 8" in r.trace[1].reason


def test_old_triton_is_refused_by_version() -> None:
    libs = dict(H200.libraries) | {"triton": "2.3.1"}
    r = _resolve(INT8_O_PROJ, dataclasses.replace(H200, libraries=tuple(libs.items())))
    assert _chosen(r) == ("torch-cublas", False)
    assert r.trace[0].reason == "triton 2.3.1 is older than the kernels need (3.0+)"


def test_k_beyond_the_int32_bound_goes_to_torch() -> None:
    assert MAX_K == 131071  # 131072 products of -128 * -128 reach 2^31
    assert TRITON_GEMM.supports(GemmSpec(64, MAX_K, torch.int8, torch.bfloat16), H200).ok
    r = _resolve(GemmSpec(64, MAX_K + 1, torch.int8, torch.bfloat16), H200)
    assert r.trace[0].reason == (
        "int8 scaled_mm: K=131072 could overflow the int32 accumulator (K <= 131071)"
    )
    assert _chosen(r) == ("torch-cublas", False)  # TorchGemm states no K bound


def test_lm_head_accepted_on_h200() -> None:
    d = GEMM.supports(LM_HEAD, H200)
    assert d.ok and "out_dtype=float32" in d.reasons[0]


def test_lm_head_refused_on_old_torch() -> None:
    old = dataclasses.replace(H200, torch=TorchBuild("2.7.1+cu126", cuda="12.6"))
    d = GEMM.supports(LM_HEAD, old)
    assert not d.ok and "torch >= 2.8" in d.reasons[0] and "2.7.1+cu126" in d.reasons[0]


@pytest.mark.parametrize(
    "n,k,ok", [(4096, 14336, True), (130, 512, False), (96, 100, False)], ids=str
)
def test_torch_int8_alignment(n: int, k: int, ok: bool) -> None:
    d = GEMM.supports(GemmSpec(n, k, torch.int8, torch.bfloat16), H200)
    assert d.ok == ok, d.reasons
    if not ok:
        assert "multiples of 8" in d.reasons[0]


def test_no_gpu_no_gemm() -> None:
    d = GEMM.supports(LM_HEAD, MACHINES["xeon-cpu"])
    assert not d.ok and "no SM90/SM100/SM12x" in d.reasons[0]


def test_missing_out_dtype_mm_is_refused_not_emulated() -> None:
    """torch 2.13 on CPU lacks aten::mm.dtype: prepare must refuse, never upcast."""
    works, _ = out_dtype_mm(torch.device("cpu"))
    if works:
        pytest.skip("this torch computes mm(out_dtype=float32) on CPU; nothing to refuse")
    w = torch.randn(64, 32).to(torch.bfloat16)
    with pytest.raises(UnsupportedSpec, match=r"no torch.mm\(out_dtype=float32\)"):
        GEMM.prepare(GemmSpec(64, 32, torch.bfloat16, torch.float32), w, None)


def test_triton_mm_is_never_routed_a_float_spec() -> None:
    spec = GemmSpec(64, 32, torch.bfloat16, torch.bfloat16)
    assert not TRITON_GEMM.supports(spec, H200).ok
    with pytest.raises(UnsupportedSpec, match="serves int8 scaled_mm only"):
        TRITON_GEMM.mm(spec, torch.zeros(1, 32), None, None, torch.zeros(1, 64))


@pytest.fixture(scope="module")
def cuda_backend() -> Backend:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the int8 path runs on an SM90 GPU (gpu_check.sh, kit stage)")
    try:
        return backend_for("cuda-sm90")
    except SelectionError as e:
        pytest.skip(f"cuda-sm90 cannot run here: {e}")


@pytest.mark.parametrize("m", [1, 16, 40])
def test_int8_path_has_no_host_sync_and_replays_in_a_graph(cuda_backend: Backend, m: int) -> None:
    """The W8A8 layer's two ops (per-token quant, then scaled_mm) into preallocated buffers:
    no host sync (torch's sync-debug mode raises on one), a CUDA graph of them replays on new
    activations, and both results equal the reference's bit for bit."""
    be, dev = cuda_backend, torch.device("cuda")
    n, k = 200, 4096
    g = torch.Generator().manual_seed(m)
    w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    w_scale = torch.rand(n, generator=g) * 1e-3 + 1e-4
    packed = gemm.prepare(w_q.to(dev), weight_scale=w_scale.to(dev), backend=be)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(dev)
    x_q = torch.empty((m, k), dtype=torch.int8, device=dev)
    x_scale = torch.empty((m, 1), dtype=torch.float32, device=dev)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=dev)

    def layer() -> None:
        per_token_group_quant(x, k, torch.int8, out=x_q, out_scales=x_scale, backend=be)
        gemm.scaled_mm(x_q, x_scale, packed, out=out)

    def expected() -> torch.Tensor:
        ref = backend_for("reference")  # eager torch on the device the reference selected
        q, s = per_token_group_quant(x.to(ref.device), k, torch.int8, backend=ref)
        w = w_q.to(ref.device)
        p = gemm.prepare(w, weight_scale=w_scale.to(ref.device), backend=ref)
        return gemm.scaled_mm(q, s, p).cpu()

    layer()  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with record_ops() as calls:
            layer()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [(c.impl, c.path, c.fallback) for c in calls] == [("triton", ImplPath.TRITON, False)] * 2
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), expected())
    graph = capture(layer, "cuda")
    x.copy_(torch.randn(m, k, generator=g).to(torch.bfloat16))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), expected())

"""Fused weights: ``prepare([w_q, w_k, w_v])`` prepares one ``[sum N_i, K]`` weight and
``packed.split(y)`` gives each part's output as a view of the fused one. The parts must equal
what each weight prepared on its own gives on the same backend; bad sequences are refused,
naming the argument and the part, before anything is prepared."""

from __future__ import annotations

import platform

import pytest
import torch

import plugin_api as pa
from plugin_api.conformance import oracle
from plugin_api.conformance.test_gemm import TOLERANCE
from plugin_api.device_info import read_device_info

BF16, FP16, FP32, INT8 = torch.bfloat16, torch.float16, torch.float32, torch.int8
K = 256
QKV = (256, 64, 64)  # GQA's q/k/v (4096/1024/1024) scaled down
BACKENDS = ["reference", "cpu-arm-acl"]
# Every output column is its own dot product over K, so a backend whose kernels keep their
# K order whatever N is gives the fused parts bit for bit. Measured so on x86 with AVX-512 BF16
# and no AMX (oneDNN, panels, GEMV), and for torch's gemms under `reference` on x86 without AMX.
# Where AMX tiles run the 16-bit products (oneDNN's and torch's alike: a bf16 -> fp32 M=1 part
# was 4.8e-7 off on a Xeon with AMX), on x86 without AVX-512 (torch's f32 gemm on its AVX2 path
# gave parts 4.8e-7 to 1.7e-6 off on an Intel core capped to AVX2; AVX2's f32 gemm may split K
# across threads by shape), and on Arm (ACL), the kernels may differ by N, so the parts get the
# kit's tolerance.
_FLAGS = read_device_info().cpu_flags
_X86 = platform.machine() in ("x86_64", "AMD64")
_AMX = "amx_bf16" in _FLAGS
_X86_AVX512_BF16 = _X86 and "avx512_bf16" in _FLAGS
_X86_AVX2_ONLY = _X86 and "avx512f" not in _FLAGS


def _bitwise(backend_id: str, dtype: torch.dtype) -> bool:
    if (_AMX and dtype != FP32) or _X86_AVX2_ONLY:
        return False
    return backend_id == "reference" or _X86_AVX512_BF16


def _weights(dtype: torch.dtype, parts: tuple[int, ...] = QKV, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, K, generator=g) / K**0.5).to(dtype) for n in parts]


def _same(got: torch.Tensor, want: torch.Tensor, backend_id: str, dtype: torch.dtype) -> None:
    if _bitwise(backend_id, dtype):
        assert torch.equal(got, want), float((got.double() - want.double()).abs().max())
    else:
        torch.testing.assert_close(got, want, **TOLERANCE[want.dtype])


def _shares_storage(views: tuple[torch.Tensor, ...], y: torch.Tensor, parts) -> None:
    start = 0
    for v, n in zip(views, parts, strict=True):
        assert v.data_ptr() == y.data_ptr() + start * y.element_size()  # y[:, start:start+n]
        assert v.stride() == y.stride() and v.shape == (*y.shape[:-1], n)
        assert v.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
        start += n


@pytest.mark.parametrize("backend_id", BACKENDS)
@pytest.mark.parametrize(
    "dtype,out_dtype", [(FP32, FP32), (BF16, BF16), (BF16, FP32)], ids=["fp32", "bf16", "bf16-f32"]
)
@pytest.mark.parametrize("m", [1, 5, 37])
def test_fused_parts_are_each_weights_own_mm(backend_id, dtype, out_dtype, m):
    be = pa.backend_for(backend_id)
    ws = _weights(dtype)
    fused = pa.prepare(ws, out_dtype=out_dtype, backend=be)
    assert fused.parts == QKV and fused.spec.n == sum(QKV) and fused.spec.k == K
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m)).to(dtype)
    y = pa.mm(x, fused)
    views = fused.split(y)
    _shares_storage(views, y, QKV)
    for v, w in zip(views, ws, strict=True):
        alone = pa.mm(x, pa.prepare(w, out_dtype=out_dtype, backend=be))
        _same(v, alone, backend_id, dtype)
        torch.testing.assert_close(v.double(), oracle.gemm(x, w), **TOLERANCE[out_dtype])


def test_fused_fp32_on_the_reference_is_exact():
    """Integer-valued fp32 data: every sum is exact, so each part equals the exact product."""
    g = torch.Generator().manual_seed(3)
    ws = [torch.randint(-8, 8, (n, K), generator=g).float() for n in QKV]
    x = torch.randint(-8, 8, (7, K), generator=g).float()
    fused = pa.prepare(ws, backend=pa.backend_for("reference"))
    for v, w in zip(fused.split(pa.mm(x, fused)), ws, strict=True):
        assert torch.equal(v, x @ w.t())


@pytest.mark.parametrize("backend_id", BACKENDS)
def test_fused_bias_and_out(backend_id):
    """Per-part biases joined once; a caller's ``out`` is the fused output the views are of."""
    be = pa.backend_for(backend_id)
    ws = _weights(BF16, seed=1)
    biases = [torch.randn(n).to(BF16) for n in QKV]
    fused = pa.prepare(ws, out_dtype=FP32, backend=be)
    bias = fused.fused_bias(biases)
    assert bias.shape == (sum(QKV),) and bias.dtype == BF16
    x = torch.randn(9, K).to(BF16)
    out = torch.empty(9, sum(QKV))
    assert pa.mm(x, fused, bias=bias, out=out) is out
    views = fused.split(out)
    _shares_storage(views, out, QKV)
    for v, w, b in zip(views, ws, biases, strict=True):
        alone = pa.mm(x, pa.prepare(w, out_dtype=FP32, backend=be), bias=b)
        _same(v, alone, backend_id, BF16)


@pytest.mark.parametrize("backend_id", BACKENDS)
def test_views_feed_the_next_gemm(backend_id):
    """A part's view (row stride N > its width) is a valid ``x`` for the next GEMM as it is."""
    be = pa.backend_for(backend_id)
    gate_up = pa.prepare(_weights(FP32, (K, K), seed=2), backend=be)  # [w_gate, w_up]
    down = pa.prepare(_weights(FP32, (64,), seed=3), backend=be)
    gate, up = gate_up.split(pa.mm(torch.randn(4, K), gate_up))
    assert gate.stride() == (2 * K, 1)
    torch.testing.assert_close(pa.mm(gate, down), pa.mm(gate.contiguous(), down), rtol=0, atol=0)
    assert torch.equal(pa.mm(up, down), pa.mm(up.contiguous(), down))


@pytest.mark.parametrize("backend_id", BACKENDS)
@pytest.mark.parametrize("out_dtype", [BF16, FP32])
def test_fused_int8_with_per_part_scales(backend_id, out_dtype):
    be = pa.backend_for(backend_id)
    g = torch.Generator().manual_seed(4)
    ws = [torch.randint(-128, 128, (n, K), generator=g, dtype=INT8) for n in QKV]
    scales = [torch.rand(n, generator=g) * 0.01 + 1e-3 for n in QKV]
    x_q = torch.randint(-128, 128, (6, K), generator=g, dtype=INT8)
    x_s = torch.rand(6, generator=g) * 0.01 + 1e-3
    fused = pa.prepare(ws, weight_scale=scales, out_dtype=out_dtype, backend=be)
    assert fused.spec.scaled and fused.parts == QKV
    y = pa.scaled_mm(x_q, x_s, fused)
    views = fused.split(y)
    _shares_storage(views, y, QKV)
    for v, w, s in zip(views, ws, scales, strict=True):
        alone = pa.prepare(w, weight_scale=s, out_dtype=out_dtype, backend=be)
        assert torch.equal(v, pa.scaled_mm(x_q, x_s, alone))  # int32 accumulators: exact
        want = oracle.scaled_gemm(x_q, x_s, w, s)
        torch.testing.assert_close(v.double(), want, **TOLERANCE[out_dtype])


def test_one_weight_is_one_part_and_a_list_of_one_is_the_same():
    be = pa.backend_for("reference")
    (w,) = _weights(FP32, (96,))
    alone, listed = pa.prepare(w, backend=be), pa.prepare([w], backend=be)
    assert alone.parts == listed.parts == (96,)
    y = pa.mm(torch.randn(3, K), alone)
    (view,) = alone.split(y)
    assert view.data_ptr() == y.data_ptr() and view.shape == y.shape


def test_usage_applies_to_the_whole_fused_weight():
    fused = pa.prepare(
        _weights(BF16, (100, 28)),
        out_dtype=FP32,
        usage="lm_head",
        backend=pa.backend_for("reference"),
    )
    assert fused.spec == pa.GemmSpec(128, K, BF16, FP32, "lm_head")


# ---- refused inputs: each names the argument and the part ---------------------------------------


def _meta(n: int, dtype: torch.dtype = FP32) -> torch.Tensor:
    return torch.empty(n, K, dtype=dtype, device="meta")


def _bad_cases():
    w0, w1 = _weights(FP32, (8, 4))
    i0, i1 = (torch.zeros(n, K, dtype=INT8) for n in (8, 4))
    s0, s1 = torch.ones(8), torch.ones(4)
    return [
        ("empty", dict(weight=[]), ValueError, "weight is an empty sequence"),
        (
            "k",
            dict(weight=[w0, w1, torch.zeros(4, 512)]),
            ValueError,
            f"weight[2] has K=512, weight[0] has K={K}",
        ),
        ("dtype", dict(weight=[w0, w1.to(BF16)]), TypeError, "weight[1].dtype=torch.bfloat16"),
        ("device", dict(weight=[w0, _meta(4)]), ValueError, "weight[1] is on meta"),
        ("ndim", dict(weight=[w0, torch.zeros(K)]), ValueError, "weight[1] must have 2 dims"),
        ("not-a-tensor", dict(weight=[w0, "w_k"]), TypeError, "weight[1] must be a torch.Tensor"),
        (
            "empty-part",
            dict(weight=[w0, torch.zeros(0, K)]),
            ValueError,
            "weight[1] has an empty dimension, shape (0, 256)",
        ),
        ("not-a-sequence", dict(weight=3), TypeError, "weight must be a sequence of tensors"),
        ("usage", dict(weight=[w0, w1], usage="head"), ValueError, "usage='head' is not one of"),
        (
            "out-dtype",
            dict(weight=[w0, w1], out_dtype=BF16),
            TypeError,
            "out_dtype=torch.bfloat16 with a torch.float32 weight",
        ),
        (
            "scales-count",
            dict(weight=[i0, i1], weight_scale=[s0]),
            ValueError,
            "weight_scale has 1 tensors, weight has 2",
        ),
        (
            "scale-size",
            dict(weight=[i0, i1], weight_scale=[s0, s0]),
            ValueError,
            "weight_scale[1].shape[0]=8, expected 4",
        ),
        (
            "scale-dtype",
            dict(weight=[i0, i1], weight_scale=[s0, s1.double()]),
            TypeError,
            "weight_scale[1].dtype=torch.float64",
        ),
        (
            "scale-one-tensor",
            dict(weight=[i0, i1], weight_scale=torch.ones(12)),
            TypeError,
            "weight_scale must be a sequence of tensors",
        ),
        ("no-scales", dict(weight=[i0, i1]), ValueError, "one [N_i] fp32 tensor per weight"),
        (
            "scales-for-float",
            dict(weight=[w0, w1], weight_scale=[s0, s1]),
            ValueError,
            "weight_scale is only for int8 weights",
        ),
        (
            "scale-list-for-one-weight",
            dict(weight=i0, weight_scale=[s0]),
            TypeError,
            "weight_scale is a list but weight is one tensor",
        ),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_fused_weights_are_refused(case):
    _, kwargs, error, message = case
    with pytest.raises(error, match=r"^gemm\.prepare: ") as info:
        pa.prepare(**kwargs, backend=pa.backend_for("reference"))
    assert message in str(info.value)


def test_bad_biases_and_outputs_are_refused():
    fused = pa.prepare(_weights(FP32, (8, 4)), backend=pa.backend_for("reference"))
    x = torch.randn(2, K)
    with pytest.raises(TypeError, match=r"gemm.mm: bias is a list; .*packed.fused_bias"):
        pa.mm(x, fused, bias=[torch.zeros(8), torch.zeros(4)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"fused_bias: bias has 1 tensors, the weight has 2 parts"):
        fused.fused_bias([torch.zeros(12)])
    with pytest.raises(ValueError, match=r"bias\[1\]\.shape\[0\]=8, expected 4"):
        fused.fused_bias([torch.zeros(8), torch.zeros(8)])
    with pytest.raises(
        TypeError, match=r"bias\[1\]\.dtype=torch.bfloat16, bias\[0\] is torch.float32"
    ):
        fused.fused_bias([torch.zeros(8), torch.zeros(4, dtype=BF16)])
    with pytest.raises(
        ValueError, match=r"split: y.shape=\(2, 8\), expected the last dim to be N=12"
    ):
        fused.split(torch.zeros(2, 8))
    with pytest.raises(TypeError, match=r"split: y must be a torch\.Tensor"):
        fused.split([1.0])  # type: ignore[arg-type]

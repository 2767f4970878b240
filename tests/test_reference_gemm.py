"""The reference GEMM's bf16/fp16 output is the fp32 accumulator rounded once on every platform:
``rounds_once`` tells a torch matmul that does so from one that rounds partial sums, and where
torch's does not, the reference runs an fp32 matmul and rounds once itself."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from plugin_api.contract.provenance import record_kernels
from plugin_api.ops.gemm import GemmSpec
from plugin_api.reference.gemm import UPCAST_KERNEL, ReferenceGemm, rounds_once

CPU = torch.device("cpu")
LOW = [torch.bfloat16, torch.float16]


def partials_rounded(chunk: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A matmul that accumulates each ``chunk`` of K in fp32 and adds the partial results in
    the operands' dtype."""

    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        acc = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype)
        for k0 in range(0, a.shape[1], chunk):
            part = a[:, k0 : k0 + chunk].float() @ b[k0 : k0 + chunk].float()
            acc = (acc.float() + part.to(a.dtype).float()).to(a.dtype)
        return acc

    return matmul


@pytest.mark.parametrize("dtype", LOW, ids=["bf16", "fp16"])
def test_rounds_once_tells_an_fp32_accumulator_from_rounded_partials(dtype):
    def fp32_accumulator(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.float() @ b.float()).to(a.dtype)

    def fp32_accumulator_reversed_k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.float().flip(1) @ b.float().flip(0)).to(a.dtype)  # another summation order

    assert rounds_once(CPU, dtype, fp32_accumulator)
    assert rounds_once(CPU, dtype, fp32_accumulator_reversed_k)
    for chunk in (64, 256, 1024):
        assert not rounds_once(CPU, dtype, partials_rounded(chunk)), chunk


@pytest.mark.parametrize("dtype", LOW, ids=["bf16", "fp16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_where_torch_does_not_round_once_the_reference_does(dtype, with_bias):
    gemm = ReferenceGemm(probe=lambda device, dt: False)  # a platform like that one
    g = torch.Generator().manual_seed(1)
    m, n, k = 23, 257, 1024
    w = torch.randn(n, k, generator=g).to(dtype)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    spec = GemmSpec(weight_dtype=dtype, out_dtype=dtype, n=n, k=k)
    payload = gemm.prepare(spec, w, None)
    assert payload.weight_t32 is not None
    out = torch.full((m, n), float("nan"), dtype=dtype)
    with record_kernels() as kernels:
        gemm.mm(spec, x, payload, bias, out)
    acc = x.float() @ w.float().t() + (0 if bias is None else bias.float())
    assert torch.equal(out, acc.to(dtype)) and kernels == [UPCAST_KERNEL]


@pytest.mark.parametrize("dtype", LOW, ids=["bf16", "fp16"])
def test_the_probe_decides_the_path_on_this_machine(dtype):
    spec = GemmSpec(weight_dtype=dtype, out_dtype=dtype, n=8, k=16)
    payload = ReferenceGemm().prepare(spec, torch.randn(8, 16).to(dtype), None)
    assert (payload.weight_t32 is None) == rounds_once(CPU, dtype)

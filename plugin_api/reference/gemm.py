"""Reference GEMM: torch matmuls whose fp32 accumulation is exact by construction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.contract.provenance import note_kernel
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.gemm import GemmSpec


@dataclass(frozen=True, slots=True)
class ReferenceWeight:
    weight: torch.Tensor  # [N, K] as given
    # [K, N] fp32 copy: for fp32 output without out_dtype mm, and for bf16/fp16 output where
    # torch's matmul in that dtype is not the fp32 accumulator rounded once (rounds_once)
    weight_t32: torch.Tensor | None
    weight_scale: torch.Tensor | None


# What mm notes (note_kernel) when it computes a bf16/fp16 output as an fp32 matmul
UPCAST_KERNEL = "reference: fp32 matmul of upcast operands, rounded once"


def has_out_dtype_mm(device: torch.device) -> bool:
    """Whether this torch computes ``torch.mm(bf16, bf16, out_dtype=float32)`` on ``device``."""
    a = torch.zeros((1, 8), dtype=torch.bfloat16, device=device)
    try:
        torch.mm(a, a.t(), out_dtype=torch.float32)
    except (NotImplementedError, RuntimeError, TypeError):
        return False
    return True


def rounds_once(
    device: torch.device,
    dtype: torch.dtype,
    matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.mm,
) -> bool:
    """Whether ``matmul`` (``torch.mm``) in ``dtype`` (bf16 or fp16) on ``device`` gives the
    fp32 accumulator rounded once, as the contract's low-precision output is.

    The operands make every partial sum exact in fp32 but not in ``dtype`` (multiples of 1/32
    below 2^17; each weight row positive in its first half of K and negative in the second, so
    partial sums grow large before they cancel): an fp32 accumulator, in any order and split,
    gives the exact result, rounded once here; a kernel that rounds partial sums to ``dtype``
    does not. The shape has an odd N and a long K, where torch 2.9.1's aarch64 bf16 matmul was
    seen off by many units in the last place (on an emulated Neoverse V2)."""
    g = torch.Generator().manual_seed(0)
    m, n, k = 23, 257, 4096
    # 1 to 15.9375 in steps of 1/16: 8 significant bits, exact in bf16 and fp16; products with
    # x are multiples of 1/32 up to 32, partial sums below 2^17: 22 bits, exact in fp32
    w = torch.randint(16, 256, (n, k), generator=g, dtype=torch.float64) / 16
    w[:, k // 2 :] *= -1
    x = 2.0 ** torch.randint(-1, 2, (m, k), generator=g).to(torch.float64)  # 0.5, 1, 2
    exact = (x @ w.t()).to(dtype)
    got = matmul(x.to(dtype).to(device), w.to(dtype).to(device).t())
    return bool(torch.equal(got.cpu(), exact))


class ReferenceGemm:
    name = "reference"
    path = ImplPath.REFERENCE

    def __init__(self, probe: Callable[[torch.device, torch.dtype], bool] = rounds_once) -> None:
        """``probe``: whether torch's matmul in a low-precision dtype rounds once on a device
        (``rounds_once``; a test may state the answer for a platform it does not have)."""
        self._out_dtype_mm: dict[str, bool] = {}
        self._probe = probe
        self._rounds_once: dict[tuple[str, torch.dtype], bool] = {}

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision:
        return Decision.accept("eager torch, exact fp32 accumulation")

    def _fp32_native(self, device: torch.device) -> bool:
        if device.type not in self._out_dtype_mm:
            self._out_dtype_mm[device.type] = has_out_dtype_mm(device)
        return self._out_dtype_mm[device.type]

    def _low_precision_native(self, device: torch.device, dtype: torch.dtype) -> bool:
        key = (device.type, dtype)
        if key not in self._rounds_once:
            self._rounds_once[key] = self._probe(device, dtype)
        return self._rounds_once[key]

    def prepare(
        self, spec: GemmSpec, weight: torch.Tensor, weight_scale: torch.Tensor | None
    ) -> ReferenceWeight:
        upcast = None
        wants_acc = spec.out_dtype == torch.float32 and spec.weight_dtype != torch.float32
        if wants_acc and not spec.scaled and not self._fp32_native(weight.device):
            # bf16/fp16 products are exact in fp32, so an fp32 matmul of the upcast weight
            # gives the fp32 accumulator the contract asks for.
            upcast = weight.float().t().contiguous()
        low = spec.out_dtype in (torch.bfloat16, torch.float16) and weight.dtype == spec.out_dtype
        if low and not self._low_precision_native(weight.device, weight.dtype):
            upcast = weight.float().t().contiguous()
        return ReferenceWeight(weight, upcast, weight_scale)

    def mm(
        self,
        spec: GemmSpec,
        x: torch.Tensor,
        payload: ReferenceWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        w = payload.weight
        if spec.out_dtype == torch.float32 and w.dtype != torch.float32:
            if payload.weight_t32 is not None:
                torch.mm(x.float(), payload.weight_t32, out=out)
            else:
                out.copy_(torch.mm(x, w.t(), out_dtype=torch.float32))
            if bias is not None:
                out.add_(bias.float())
            return
        if payload.weight_t32 is not None:  # torch's matmul in out's dtype does not round once
            note_kernel(UPCAST_KERNEL)
            acc = torch.mm(x.float(), payload.weight_t32)
            if bias is not None:
                acc.add_(bias.float())
            out.copy_(acc)
            return
        if bias is None:
            torch.mm(x, w.t(), out=out)
        else:
            torch.addmm(bias.to(out.dtype), x, w.t(), out=out)

    def scaled_mm(
        self,
        spec: GemmSpec,
        x_q: torch.Tensor,
        x_scale: torch.Tensor,
        payload: ReferenceWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        w = payload.weight
        assert payload.weight_scale is not None
        # int8 products summed in fp64 are exact for any K below 2^37, on every device and ISA;
        # torch._int_mm on a CPU is a scalar loop without AVX512-VNNI, and saturates under a cap
        acc = (x_q.double() @ w.double().t()).float()
        y = acc * x_scale.view(-1, 1) * payload.weight_scale.view(1, -1)
        if bias is not None:
            y = y + bias.float()
        out.copy_(y)


def implementations() -> tuple[ReferenceGemm]:
    return (ReferenceGemm(),)

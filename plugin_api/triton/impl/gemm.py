"""int8 W8A8 ``scaled_mm`` through the Triton kernel in ``plugin_api.triton.scaled_mm``.

Float specs are not this implementation's: it rejects them with the reason, so a plugin lists
it beside the implementation that serves ``mm`` (cuda-sm90: ``TorchGemm``) and the host's
resolution (the first implementation that accepts) sends each spec to its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...contract.decision import Decision, ImplPath
from ...device_info import DeviceInfo
from ...errors import UnsupportedSpec
from ...gpu.triton_target import TritonTarget
from ...ops.checks import short_dtype
from ...ops.gemm import GemmSpec

# |x_q * w_q| <= 128 * 128, so an int32 sum of K products cannot overflow while K <= this
MAX_K = (2**31 - 1) // (128 * 128)


@dataclass(frozen=True, slots=True)
class TritonInt8Weight:
    weight: torch.Tensor  # [N, K] int8, K contiguous (the kernel reads K-major tiles of it)
    weight_scale: torch.Tensor  # [N] fp32, contiguous


class TritonScaledMm:
    """int8 ``scaled_mm``, any N and K up to ``MAX_K``: one launch, int32 accumulation, the fp32
    scale epilogue rounded as the reference rounds it, no allocation and no host sync."""

    name = "triton"
    path = ImplPath.TRITON

    def __init__(self, target: TritonTarget) -> None:
        self.target = target

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision:
        if not spec.scaled:
            w, o = short_dtype(spec.weight_dtype), short_dtype(spec.out_dtype)
            return Decision.reject(f"{w} -> {o}: the Triton GEMM serves int8 scaled_mm only")
        if spec.k > MAX_K:
            return Decision.reject(
                f"int8 scaled_mm: K={spec.k} could overflow the int32 accumulator (K <= {MAX_K})"
            )
        return Decision.all_of(
            self.target.triton(info),
            Decision.accept(
                "int8 scaled_mm in one launch: int32 accumulation, fp32 scales rounded as the "
                "reference rounds them, any N and K"
            ),
        )

    def prepare(
        self, spec: GemmSpec, weight: torch.Tensor, weight_scale: torch.Tensor | None
    ) -> TritonInt8Weight:
        if weight_scale is None:  # the host requires it for int8; say so if a caller did not
            raise UnsupportedSpec(
                f"gemm {spec.describe()}: an int8 weight needs its weight_scale [N] fp32"
            )
        # one copy at load time at most: the kernel wants K contiguous and scales packed
        return TritonInt8Weight(weight.contiguous(), weight_scale.contiguous())

    def mm(
        self,
        spec: GemmSpec,
        x: torch.Tensor,
        payload: TritonInt8Weight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        # supports() never accepts a float spec, so the host never routes mm here
        raise UnsupportedSpec(f"gemm {spec.describe()}: the Triton GEMM serves int8 scaled_mm only")

    def scaled_mm(
        self,
        spec: GemmSpec,
        x_q: torch.Tensor,
        x_scale: torch.Tensor,
        payload: TritonInt8Weight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        from .. import scaled_mm

        scaled_mm.scaled_mm(x_q, x_scale, payload.weight, payload.weight_scale, bias, out)

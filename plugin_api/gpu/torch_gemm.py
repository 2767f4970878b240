"""GEMM through torch on an accelerator (the vendor BLAS underneath), shared by the GPU plugins.

- Float weights: ``torch.mm``/``addmm`` in the weight dtype, fp32 accumulation.
- The LM head (bf16 x bf16 -> fp32): ``torch.mm(..., out_dtype=torch.float32)`` returns the fp32
  accumulator itself. Where torch lacks it, the spec is refused: an upcast-then-matmul is neither
  the same kernel nor the same cost, and an upcast of a rounded result is not the accumulator.
- int8 W8A8 ``scaled_mm``: ``torch._int_mm`` (int32 accumulation), then the fp32 scales.

``TorchGemm`` is the one class every GPU plugin instantiates. Its acceptance takes the plugin's
*evidence* per feature, each a ``DeviceInfo -> Decision`` (or ``None`` where the feature is never
offered): ``cuda-sm90`` passes architecture and torch-version rules, which answer a what-if
``DeviceInfo`` too; ``rocm`` and ``xpu`` pass their ``TorchFacts`` decisions, read on the real
machine. ``prepare`` then checks on the weight's device that torch computes what was accepted,
and refuses otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..contract.decision import Decision, ImplPath
from ..device_info import DeviceInfo
from ..errors import UnsupportedSpec
from ..ops.checks import short_dtype
from ..ops.gemm import GemmSpec
from ..reference.gemm import has_out_dtype_mm
from .platforms import Platform

INT_MM_ALIGN = 8  # torch._int_mm on CUDA/ROCm: K and N multiples of 8
INT_MM_MIN_M = 17  # ... and more than 16 rows; shorter inputs are zero-padded

# A plugin's evidence for one feature on the machine a DeviceInfo describes.
Evidence = Callable[[DeviceInfo], Decision]


@dataclass(frozen=True, slots=True)
class TorchWeight:
    weight_t: torch.Tensor  # [K, N] view of the [N, K] weight (the BLAS reads it transposed)
    weight_scale: torch.Tensor | None  # [N] fp32 for int8
    out_dtype_into_out: bool  # torch.mm(..., out_dtype=, out=) works on this torch


def wants_accumulator(spec: GemmSpec) -> bool:
    """A bf16/fp16 weight with an fp32 output: the fp32 accumulator is the result."""
    return (
        not spec.scaled and spec.out_dtype == torch.float32 and spec.weight_dtype != torch.float32
    )


def int_mm_shape(spec: GemmSpec) -> Decision:
    """``torch._int_mm`` needs N and K multiples of 8 (rows are padded at run time)."""
    bad = [f"{n}={v}" for n, v in (("N", spec.n), ("K", spec.k)) if v % INT_MM_ALIGN]
    if bad:
        return Decision.reject(
            f"int8 scaled_mm: torch._int_mm needs N and K multiples of {INT_MM_ALIGN}, "
            f"got {', '.join(bad)}"
        )
    return Decision.accept()


@functools.lru_cache(maxsize=8)
def out_dtype_mm(device: torch.device) -> tuple[bool, bool]:
    """(mm with out_dtype=float32 works, it also writes into ``out=``) on ``device``."""
    if not has_out_dtype_mm(device):
        return False, False
    a = torch.zeros((2, 8), dtype=torch.bfloat16, device=device)
    o = torch.empty((2, 2), dtype=torch.float32, device=device)
    try:
        torch.mm(a, a.t(), out_dtype=torch.float32, out=o)
    except (NotImplementedError, RuntimeError, TypeError):
        return True, False
    return True, True


class TorchGemm:
    """GEMM through torch, accepting by the plugin's evidence for each feature.

    ``device``: is this the plugin's device (``None``: the plugin's probe alone decides); a
    rejection is the answer for every spec. ``mm_out_dtype``: ``torch.mm(out_dtype=float32)``
    works, for weights in ``accumulator_weights``. ``int_mm``: an exact ``torch._int_mm``
    (``None``: no int8 GEMM offered).
    """

    path = ImplPath.TORCH

    def __init__(
        self,
        name: str,
        backend: str,
        platform: Platform,
        *,
        device: Evidence | None,
        mm_out_dtype: Evidence | None,
        int_mm: Evidence | None,
        accumulator_weights: tuple[torch.dtype, ...] = (torch.bfloat16,),
    ) -> None:
        self.name = name
        self.backend = backend
        self.platform = platform
        self.device = device
        self.mm_out_dtype = mm_out_dtype
        self.int_mm = int_mm
        # The weight dtypes the mm_out_dtype evidence covers (the facts' trial runs bf16 only).
        self.accumulator_weights = accumulator_weights

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision:
        if self.device is not None and not (here := self.device(info)).ok:
            return here
        w, o = short_dtype(spec.weight_dtype), short_dtype(spec.out_dtype)
        if spec.scaled:
            if self.int_mm is None:
                return Decision.reject("int8 scaled_mm: this plugin has no int8 GEMM kernel")
            native = self.int_mm(info)
            if not native.ok:
                return Decision.reject(f"int8 scaled_mm needs torch._int_mm: {native.because()}")
            shape = int_mm_shape(spec)
            if not shape.ok:
                return shape
            return Decision.accept(
                f"int8 scaled_mm, int32 accumulation, fp32 scales: {native.because()}"
            )
        if spec.out_dtype == spec.weight_dtype:
            return Decision.accept(
                f"torch.mm on {self.platform.name}, {w} in and out, fp32 accumulation"
            )
        if spec.out_dtype != torch.float32 or spec.weight_dtype not in self.accumulator_weights:
            covered = "/".join(short_dtype(d) for d in self.accumulator_weights)
            return Decision.reject(f"{w} -> {o}: only {covered} -> fp32 is feature-detected")
        if self.mm_out_dtype is None:
            return Decision.reject(f"{w} -> {o}: this plugin offers no fp32-accumulator output")
        native = self.mm_out_dtype(info)
        if not native.ok:
            return Decision.reject(f"{w} -> {o} needs the fp32 accumulator: {native.because()}")
        return Decision.accept(f"{w} -> {o}: {native.because()}")

    def prepare(
        self, spec: GemmSpec, weight: torch.Tensor, weight_scale: torch.Tensor | None
    ) -> TorchWeight:
        into_out = False
        if wants_accumulator(spec):
            works, into_out = out_dtype_mm(weight.device)
            if not works:
                raise UnsupportedSpec(
                    f"gemm {spec.describe()}: torch {torch.__version__} has no "
                    f"torch.mm(out_dtype=float32) on {weight.device}; refusing to emulate it",
                    backend=self.backend,
                )
        if spec.scaled and not hasattr(torch, "_int_mm"):
            raise UnsupportedSpec(
                f"gemm {spec.describe()}: torch {torch.__version__} has no torch._int_mm",
                backend=self.backend,
            )
        return TorchWeight(weight.t(), weight_scale, into_out)

    def mm(
        self,
        spec: GemmSpec,
        x: torch.Tensor,
        payload: TorchWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        w_t = payload.weight_t
        if wants_accumulator(spec):
            if payload.out_dtype_into_out:
                torch.mm(x, w_t, out_dtype=torch.float32, out=out)
            else:
                out.copy_(torch.mm(x, w_t, out_dtype=torch.float32))
            if bias is not None:
                out.add_(bias.float())
            return
        if bias is None:
            torch.mm(x, w_t, out=out)
        else:
            torch.addmm(bias.to(out.dtype), x, w_t, out=out)

    def scaled_mm(
        self,
        spec: GemmSpec,
        x_q: torch.Tensor,
        x_scale: torch.Tensor,
        payload: TorchWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        m = x_q.shape[0]
        a = x_q.contiguous()
        if m < INT_MM_MIN_M:  # zero rows add nothing to the rows we keep
            a = torch.cat([a, a.new_zeros((INT_MM_MIN_M - m, a.shape[1]))])
        acc = torch._int_mm(a, payload.weight_t)[:m]
        assert payload.weight_scale is not None
        y = acc.float() * x_scale.view(-1, 1) * payload.weight_scale.view(1, -1)
        if bias is not None:
            y += bias.float()
        out.copy_(y)

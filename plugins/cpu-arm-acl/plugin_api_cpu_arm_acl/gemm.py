"""GEMM through oneDNN matmul primitives (op family ``gemm``).

``prepare`` reorders the weight once into the layout oneDNN prefers (weights format ``any``);
``mm``/``scaled_mm`` run primitives from a ``PrimitiveCache`` keyed by the call's full
``GemmProblem``, whose ``variant`` names the kernel kind, its dst handling and the thread count.

Kernels, by weight dtype:
- bf16 on a CPU with a oneDNN bf16 kernel: bf16 x bf16 -> f32 dst (fp32 out, and bf16 out when
  ``LmHeadPolicy`` picks it, then one downcast copy) or -> bf16 dst. Without one (AVX2-only
  x86, Arm without BF16) bf16 is rejected here and served by ``panel_gemm``.
- fp32: f32 x f32 -> f32.
- int8 where oneDNN's s8 matmul is exact (Arm, x86 with VNNI/AMX): s8 x s8 -> f32 with the
  per-channel weight scale in the primitive; the per-token scale and the bias are one torch
  epilogue (``addcmul``), because oneDNN's per-row binary post-op drops x86 matmuls to its
  reference kernel. Elsewhere ``panel_gemm`` serves int8 exactly.
"""

from __future__ import annotations

import platform
import threading
from dataclasses import dataclass
from typing import Any

import torch

from plugin_api.device_info import DeviceInfo
from plugin_api.ops import checks
from plugin_api.ops.decision import Decision, ImplPath
from plugin_api.ops.gemm import GemmProblem, GemmSpec, problem_of
from plugin_api.ops.primitive_cache import PrimitiveCache

from .build import extension
from .isa import bf16_matmul, int8_matmul_exact, isa_name
from .settings import LmHeadPolicy

F32, BF16, S8 = torch.float32, torch.bfloat16, torch.int8
CODES = {F32: 1, BF16: 2, S8: 3}  # pa_onednn::Dt in csrc/kernels.h
PACK_M = 16  # the M whose primitive chooses the packed layout; other Ms reuse that layout


@dataclass(frozen=True, slots=True)
class OneDnnWeight:
    """A weight packed by oneDNN. ``compute`` is the primitive's src/weights type."""

    packed: Any  # torch.classes.pa_cpu_onednn.PackedWeights
    compute: torch.dtype
    nbytes: int
    layout: str


@dataclass(frozen=True, slots=True)
class Call:
    """One call as the kernel sees it (``src``/``bias`` possibly converted, ``kernel_out`` the
    primitive's dst: ``out`` itself or a temporary) and the problem keying its primitive."""

    problem: GemmProblem
    src: torch.Tensor
    bias: torch.Tensor | None
    kernel_out: torch.Tensor


class OneDnnGemm:
    name = "onednn"
    path = ImplPath.NATIVE

    def __init__(
        self,
        policy: LmHeadPolicy | None = None,
        threads: int | None = None,
        cache_capacity: int = 256,
    ) -> None:
        self.policy = policy  # None: LmHeadPolicy.default_for the machine
        if threads is not None:
            checks.positive_int("OneDnnGemm", "threads", threads)
        self.threads = threads
        self.cache: PrimitiveCache[GemmProblem, Any] = PrimitiveCache(cache_capacity)
        self._scratch = threading.local()

    # ---- decisions (pure) ----------------------------------------------------------------------

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision:
        if spec.weight_dtype == torch.float16:
            return Decision.reject(
                "fp16 weights: not offered on the oneDNN path (panel serves them)"
            )
        if spec.out_dtype == torch.float16:
            return Decision.reject("int8 with fp16 out: not offered on the oneDNN path")
        if spec.scaled and not int8_matmul_exact(info):
            return Decision.reject(
                f"int8 scaled_mm: {isa_name(info)} without VNNI/AMX, where oneDNN's s8 matmul "
                "saturates an int16 intermediate (vpmaddubsw) for full-range int8 weights"
            )
        if spec.scaled:
            return Decision.accept(
                "oneDNN s8 x s8 -> f32 matmul with per-channel weight scales; per-token scale "
                "and bias in one torch epilogue"
            )
        if spec.weight_dtype == F32:
            return Decision.accept("oneDNN f32 matmul")
        if not bf16_matmul(info):
            return Decision.reject(
                f"bf16: {isa_name(info)} has no oneDNN bf16 matmul (every implementation reports "
                "'unsupported isa')"
            )
        source = (
            "PLUGIN_API_ONEDNN_LM_HEAD" if self.policy is not None else f"default on {info.machine}"
        )
        policy = f"LmHeadPolicy: {self.policy_for(info.machine).describe()} ({source})"
        if spec.out_dtype == F32:
            return Decision.accept(
                "oneDNN bf16 x bf16 -> f32 matmul: fp32 out is the kernel's dst", policy
            )
        return Decision.accept("oneDNN bf16 x bf16 matmul", policy)

    def kernel_dst(self, spec: GemmSpec, m: int) -> torch.dtype:
        """The primitive's dst type for ``m`` rows; bf16 out with an f32 dst is one downcast."""
        if spec.out_dtype == F32 or spec.weight_dtype != BF16:
            return F32
        return F32 if self._host_policy().f32_dst(m, spec.n) else BF16

    def policy_for(self, machine: str) -> LmHeadPolicy:
        """The policy given, else the measured default for ``machine``."""
        return LmHeadPolicy.default_for(machine) if self.policy is None else self.policy

    def _host_policy(self) -> LmHeadPolicy:
        return self.policy_for(platform.machine())  # the machine the kernels run on

    # ---- running -------------------------------------------------------------------------------

    def prepare(
        self, spec: GemmSpec, weight: torch.Tensor, weight_scale: torch.Tensor | None
    ) -> OneDnnWeight:
        """Pack ``weight`` ``[N, K]`` (bf16/fp32/int8); int8 keeps ``weight_scale`` ``[N]`` fp32."""
        compute = spec.weight_dtype
        conf = [PACK_M, spec.n, spec.k, spec.k, spec.n, *[CODES[compute]] * 2, CODES[F32], 0]
        conf += [int(spec.scaled), self._threads()]
        scale = None if weight_scale is None else weight_scale.contiguous()
        packed = extension().ops.pack(weight.contiguous(), scale, conf)
        return OneDnnWeight(packed, compute, int(packed.nbytes()), str(packed.layout()))

    def plan(
        self,
        spec: GemmSpec,
        payload: OneDnnWeight,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> Call:
        """What one call runs: the kernel's tensors and the full problem that keys its primitive.

        ``variant`` = compute type / dst handling (direct, downcast, epilogue) / threads, so
        same-shape bf16-out and fp32-out calls never share a primitive.
        """
        m = int(x.shape[0])
        src = x
        if spec.scaled:
            kbias = None  # added by the epilogue, after the per-token scale
            dst, handling = F32, f"epilogue-{checks.short_dtype(out.dtype)}"
        else:
            kbias = None if bias is None else bias.to(F32)  # fp32: one rounding, at the end
            dst = self.kernel_dst(spec, m)
            handling = "direct" if dst == out.dtype else f"downcast-{checks.short_dtype(out.dtype)}"
        kernel_out = out if out.dtype == dst else torch.empty((m, spec.n), dtype=dst)
        variant = f"{checks.short_dtype(payload.compute)}/{handling}/t{self._threads()}"
        problem = problem_of(spec, src, kbias, kernel_out, variant=variant)
        return Call(problem, src, kbias, kernel_out)

    def mm(
        self,
        spec: GemmSpec,
        x: torch.Tensor,
        payload: OneDnnWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """``out[M, N] = x[M, K] @ W^T (+ bias)``; ``x`` row stride may exceed K."""
        m = int(x.shape[0])
        if m == 0:
            return
        pad = self._host_policy().pad_m if spec.usage == "lm_head" else 1
        if m < pad:  # the pad-row kernel on this thread's padded buffers (LmHeadPolicy.pad_m)
            xp, op = self._padded(spec, pad, x.dtype, out.dtype)
            xp[:m].copy_(x)
            self.mm(spec, xp, payload, bias, op)
            out.copy_(op[:m])
            return
        call = self.plan(spec, payload, x, bias, out)
        self._run(call, payload)
        if call.kernel_out is not out:
            out.copy_(call.kernel_out)  # the one downcast (round to nearest even)

    def _padded(
        self, spec: GemmSpec, rows: int, x_dtype: torch.dtype, out_dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This thread's ``rows``-row input and output for ``spec``, made once (zero rows)."""
        bufs = getattr(self._scratch, "padded", None)
        if bufs is None:
            bufs = self._scratch.padded = {}
        key = (spec.n, spec.k, rows, x_dtype, out_dtype)
        if key not in bufs:
            bufs[key] = (
                torch.zeros(rows, spec.k, dtype=x_dtype),
                torch.zeros(rows, spec.n, dtype=out_dtype),
            )
        return bufs[key]

    def scaled_mm(
        self,
        spec: GemmSpec,
        x_q: torch.Tensor,
        x_scale: torch.Tensor,
        payload: OneDnnWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """``out = (x_q @ W_q^T) * w_scale[None, :] * x_scale[:, None] (+ bias)``."""
        m = int(x_q.shape[0])
        if m == 0:
            return
        call = self.plan(spec, payload, x_q, bias, out)
        self._run(call, payload)
        s = x_scale.view(m, 1)
        if bias is None:
            torch.mul(call.kernel_out, s, out=out)
        else:
            torch.addcmul(bias, call.kernel_out, s, out=out)

    def _run(self, call: Call, payload: OneDnnWeight) -> None:
        prim = self.cache.get_or_build(call.problem, lambda p: self._build(p, payload))
        prim.run(payload.packed, call.src, call.bias, call.kernel_out, self.scratchpad(prim))

    def scratchpad(self, prim: Any) -> torch.Tensor:
        """This thread's user-managed oneDNN scratchpad, grown to what ``prim`` needs."""
        need = max(int(prim.scratchpad_bytes()), 1)
        buf = getattr(self._scratch, "buf", None)
        if buf is None or buf.numel() < need:
            buf = torch.empty(need, dtype=torch.uint8)
            self._scratch.buf = buf
        return buf

    def _build(self, p: GemmProblem, payload: OneDnnWeight) -> Any:
        bias = 0 if p.bias_dtype is None else CODES[p.bias_dtype]
        conf = [p.m, p.n, p.k, p.a_row_stride, p.c_row_stride, CODES[p.a_dtype]]
        conf += [CODES[payload.compute], CODES[p.c_dtype], bias, int(p.scaled), self._threads()]
        return extension().ops.matmul(conf, payload.packed)

    def _threads(self) -> int:
        return self.threads or torch.get_num_threads()

"""GEMM on weights packed in 16-column panels (op family ``gemm``), for CPUs where oneDNN has
no fitting kernel: bf16 where it has no bf16 matmul (AVX2-only x86, Arm without BF16), fp16
(which the oneDNN path does not offer), fp32 where its only f32 kernel is the jit sgemm
(AVX2-only x86), and exact int8 where its s8 matmul saturates (x86 without VNNI).

- bf16/fp16: the weight stays 16-bit (``prepare`` packs it; no fp32 copy), each call reads
  every weight byte from memory once, widens it to fp32 in registers and accumulates in fp32:
  fp32 out is the accumulator (up to summation order), 16-bit out is it rounded once (nearest
  even), bias added in fp32 before that rounding.
- fp32: the same loops on fp32 panels (twice the bytes of bf16); 16-bit out rounded once.
- int8: int8 weights and activations widened to int16 pairs, ``vpmaddwd`` into int32 (exact for
  K < 2^17), then ``(acc * s_x) * s_w (+ bias)`` in fp32, the reference's order, cast once.

Kernels: ``csrc/panel_*.cpp``; which ISA's kernels run, and their blocking, is ``PanelPolicy``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.device_info import DeviceInfo
from plugin_api.ops import checks
from plugin_api.ops.gemm import GemmProblem, GemmSpec, problem_of
from plugin_api.ops.primitive_cache import PrimitiveCache

from . import cpu_family
from .build import extension
from .isa import bf16_matmul, f32_panel, int8_matmul_exact, int8_panel_exact, isa_name, panel_isa
from .kernel_probe import onednn_bf16
from .settings import PANEL, PanelPolicy

BF16, F32, F16, S8 = torch.bfloat16, torch.float32, torch.float16, torch.int8
ISA_CODES = {"generic": 0, "avx2": 1}  # pa_onednn::PanelIsa in csrc/kernels.h
MAX_K_INT8 = (1 << 17) - 1  # K * 2^14 (the largest |int8 product|) stays below 2^31


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its rows do not overlap (row stride >= K, what the kernels take), else
    a dense copy: the host accepts any row stride, e.g. one row ``expand``-ed to M (stride 0),
    as the oneDNN path stages it through a dense buffer. The copy is M x K, small next to the
    weight every call reads."""
    if x.stride(0) >= x.shape[1]:
        return x
    return x.clone(memory_format=torch.contiguous_format)


@dataclass(frozen=True, slots=True)
class PanelWeight:
    """Packed panels: bf16/fp16/fp32 ``[ceil(N/16), K, 16]`` or int8 ``[ceil(N/16), ceil(K/2), 32]``
    (layouts in csrc/panel_isa.h); ``scale`` ``[N]`` fp32 for int8."""

    panels: torch.Tensor
    scale: torch.Tensor | None
    isa: str

    @property
    def nbytes(self) -> int:
        return self.panels.nbytes


@dataclass(frozen=True, slots=True)
class PanelPlan:
    """What a call runs: its full problem and the kernel configuration (``PanelConf`` in
    csrc/kernels.h: isa, widen, kc, mc, threads, order) cached for it."""

    problem: GemmProblem
    conf: tuple[int, ...]


class PanelGemm:
    name = "panel"
    path = ImplPath.NATIVE

    def __init__(
        self,
        policy: PanelPolicy | None = None,
        threads: int | None = None,
        cache_capacity: int = 256,
    ) -> None:
        self.policy = policy  # None: PanelPolicy.default_for the machine
        if threads is not None:
            checks.positive_int("PanelGemm", "threads", threads)
        self.threads = threads
        self.cache: PrimitiveCache[GemmProblem, PanelPlan] = PrimitiveCache(cache_capacity)
        # plans by the call's varying fields, see plan()
        self._recent: dict[tuple[object, ...], PanelPlan] = {}

    # ---- decisions (pure) ----------------------------------------------------------------------

    def policy_for(self, info: DeviceInfo) -> PanelPolicy:
        """The policy given, else the measured default for the architecture ``info``
        describes."""
        if self.policy is not None:
            return self.policy
        return PanelPolicy.default_for(info.machine)

    def isa(self, info: DeviceInfo) -> str:
        isa = self.policy_for(info).isa
        return panel_isa(info) if isa == "auto" else isa

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision:
        isa = self.isa(info)
        how = f"{isa} kernels"
        if spec.weight_dtype == F32 and not f32_panel(info):
            return Decision.reject("fp32 weights: oneDNN's f32 matmul serves them")
        if isa == "avx2" and panel_isa(info) != "avx2":
            return Decision.reject(f"{PANEL} isa=avx2, but {isa_name(info)} lacks AVX2/FMA/F16C")
        origin = PANEL if self.policy is not None else "default"
        policy = f"PanelPolicy: {self.policy_for(info).describe()} ({origin})"
        if spec.weight_dtype == F32:
            return Decision.accept(
                f"fp32 on {isa_name(info)} (oneDNN has only its jit sgemm here): {how}, fp32 "
                "weights in 16-column panels, fp32 accumulator",
                policy,
            )
        if spec.scaled:
            if int8_matmul_exact(info):
                return Decision.reject(f"int8: oneDNN's s8 matmul is exact on {isa_name(info)}")
            if not int8_panel_exact(info) or isa != "avx2":
                return Decision.reject(f"int8: no exact int8 panel kernel in the {how}")
            if spec.k > MAX_K_INT8:
                return Decision.reject(
                    f"int8: K={spec.k} > {MAX_K_INT8} could overflow the int32 accumulator"
                )
            return Decision.accept(
                f"exact int8 on {isa_name(info)} without VNNI: {how}, int8 widened to int16 "
                "pairs, vpmaddwd into int32 (no int16 saturation), (acc * s_x) * s_w (+ bias) "
                "in fp32, cast once",
                policy,
            )
        if spec.weight_dtype == BF16 and onednn_bf16(info):
            return Decision.reject(f"bf16: oneDNN has a bf16 matmul on {isa_name(info)}")
        w = checks.short_dtype(spec.weight_dtype)
        why = "not offered by oneDNN here"
        if spec.weight_dtype == BF16:
            why = "no oneDNN bf16 kernel" if not bf16_matmul(info) else "oneDNN's is reference code"
        return Decision.accept(
            f"{w} on {isa_name(info)} ({why}): {how}, weights stay {w} in 16-column panels, "
            f"widened in registers, fp32 accumulator; {w} out rounded once",
            policy,
        )

    def variant(self, isa: str, m: int, threads: int) -> tuple[str, tuple[int, ...]]:
        """The kernel variant of a call of ``m`` rows on ``threads``: its name and its conf
        (``PanelConf`` in csrc/kernels.h: isa, widen, kc, mc, threads, order)."""
        p = self._host_policy
        block_major = p.block_major(m)
        tile = isa == "generic" or block_major  # the at::vec kernels widen once per k block
        order = "blocks" if block_major else "panels"
        name = f"{isa}/{'tile' if tile else 'reg'}/{order}/kc{p.kc}/mc{p.mc}/t{threads}"
        return name, (ISA_CODES[isa], int(tile), p.kc, p.mc, threads, int(block_major))

    # ---- running -------------------------------------------------------------------------------

    def prepare(
        self, spec: GemmSpec, weight: torch.Tensor, weight_scale: torch.Tensor | None
    ) -> PanelWeight:
        """Pack ``weight`` ``[N, K]`` (bf16, fp16, fp32 or int8; int8 keeps ``weight_scale``
        ``[N]`` fp32)."""
        isa = self.isa(cpu_family.host())
        ops = extension().ops
        if not ops.panel_available(ISA_CODES[isa], spec.scaled):
            raise RuntimeError(f"cpu-arm-acl: the {isa} panel kernels are not in this build")
        panels = ops.panel_pack(weight.contiguous(), self._threads())
        scale = None if weight_scale is None else weight_scale.contiguous()
        return PanelWeight(panels, scale, isa)

    def plan(
        self,
        spec: GemmSpec,
        payload: PanelWeight,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> PanelPlan:
        """The cached plan of a call; its problem's ``variant`` names the ISA, how the weights
        widen, the blocking and the threads.

        A repeated call skips building and hashing the full descriptor (about 25 us hot, 80 us
        with cold caches, against 1 ms for a memory-bound M=1 layer): ``_recent`` maps the
        fields of a call that, with ``spec``, determine every descriptor field, to the plan the
        cache gave for them.
        """
        threads = self._threads()
        bias_dtype = None if bias is None else bias.dtype
        key = (spec, payload.isa, threads, x.dtype, out.dtype, bias_dtype,
               x.shape[0], x.stride(0), out.stride(0))  # fmt: skip
        plan = self._recent.get(key)
        if plan is not None:
            return plan
        name, conf = self.variant(payload.isa, x.shape[0], threads)
        problem = problem_of(spec, x, bias, out, variant=name)
        plan = self.cache.get_or_build(problem, lambda p: PanelPlan(p, conf))
        if len(self._recent) >= self.cache.stats().capacity:
            self._recent.clear()  # bounded like the cache; refilled from it
        self._recent[key] = plan
        return plan

    def mm(
        self,
        spec: GemmSpec,
        x: torch.Tensor,
        payload: PanelWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """``out[M, N] = x[M, K] @ W^T (+ bias)``; ``x`` of the weight's type, any row stride
        (see ``_rows``)."""
        if x.shape[0] == 0:
            return
        x = _rows(x)
        plan = self.plan(spec, payload, x, bias, out)
        b = None if bias is None else bias.to(F32).contiguous()
        extension().ops.panel_mm(x, payload.panels, spec.n, b, out, list(plan.conf))

    def scaled_mm(
        self,
        spec: GemmSpec,
        x_q: torch.Tensor,
        x_scale: torch.Tensor,
        payload: PanelWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """``out = ((x_q @ W_q^T) * x_scale[:, None]) * w_scale[None, :] (+ bias)``."""
        if x_q.shape[0] == 0:
            return
        x_q = _rows(x_q)
        plan = self.plan(spec, payload, x_q, bias, out)
        b = None if bias is None else bias.to(F32).contiguous()
        sx = x_scale.contiguous()
        ops = extension().ops
        ops.panel_scaled_mm(x_q, sx, payload.panels, payload.scale, b, out, list(plan.conf))

    def _threads(self) -> int:
        return self.threads or torch.get_num_threads()

    # The policy of the machine the kernels run on, derived once (not per call).
    @functools.cached_property
    def _host_policy(self) -> PanelPolicy:
        return self.policy_for(cpu_family.host())

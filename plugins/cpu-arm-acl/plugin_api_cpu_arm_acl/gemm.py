"""GEMM through oneDNN matmul primitives (op family ``gemm``).

``prepare`` reorders the weight once into the layout oneDNN prefers (weights format ``any``);
``mm``/``scaled_mm`` run primitives from a ``PrimitiveCache`` keyed by the call's full
``GemmProblem``, whose ``variant`` names the kernel kind, its dst handling and the thread count.

Kernels, by weight dtype:
- bf16 on a CPU with a oneDNN bf16 kernel: bf16 x bf16 -> f32 dst (fp32 out, and bf16 out when
  ``LmHeadPolicy`` picks it, then one downcast copy) or -> bf16 dst. Without one (AVX2-only
  x86, Arm without BF16) bf16 is rejected here and served by ``panel_gemm``.
- fp32: f32 x f32 -> f32, except on AVX2-only x86 (``panel_gemm`` serves it there).
- int8 where oneDNN's s8 matmul is exact (Arm, x86 with VNNI/AMX): s8 x s8 -> f32 (with the
  per-channel weight scale where ``MatmulForm`` puts it in the primitive); the per-token scale
  and the bias are one torch epilogue (``addcmul``), because oneDNN's per-row binary post-op
  drops x86 matmuls to its reference kernel. Elsewhere ``panel_gemm`` serves int8 exactly.

bf16 linear calls of ``LargeMPolicy.min_m`` rows or more (default 2048 on AMX) run torch's
matmul on the weights unpacked per call, where torch's newer oneDNN beat oneDNN 3.2 (see
``settings.LargeMPolicy``).

Every primitive gets dense rows and only what ``MatmulForm`` says its fast kernels take; one
that still lands on oneDNN's reference code is warned once (an error under
``PLUGIN_API_STRICT=1``): see ``matmul_form``.
"""

from __future__ import annotations

import functools
import platform
import re
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.contract.provenance import note_kernel
from plugin_api.device_info import DeviceInfo
from plugin_api.errors import FallbackRefused
from plugin_api.ops import checks
from plugin_api.ops.gemm import HUGE_OUT_BYTES, GemmProblem, GemmSpec, problem_of
from plugin_api.ops.huge_pages import advise_huge_pages
from plugin_api.ops.primitive_cache import PrimitiveCache
from plugin_api.selection import PluginApiWarning
from plugin_api.settings import read_settings

from . import cpu_family, settings
from .build import extension
from .isa import amx, bf16_matmul, f32_panel, int8_matmul_exact, isa_name
from .kernel_probe import onednn_serves, slow_bf16, why_not
from .matmul_form import MatmulForm, reference_kernel
from .settings import GemvPolicy, LargeMPolicy, LmHeadPolicy, gemv_rows

if TYPE_CHECKING:
    from .panel_gemm import PanelGemm

F32, BF16, S8 = torch.float32, torch.bfloat16, torch.int8
CODES = {F32: 1, BF16: 2, S8: 3}  # pa_onednn::Dt in csrc/kernels.h
PACK_M = 16  # the M whose primitive chooses the packed layout; other Ms reuse that layout
# csrc/gemv.cpp's kernels, by the name gemv_isa() gives the one this process runs
GEMV_KERNELS = {
    "amx": "bf16 GEMV (AMX tiles) on oneDNN's packed weights",
    "avx512bf16": "bf16 GEMV (vdpbf16ps) on oneDNN's packed weights",
}
# A torch op call looks up __torch_function__ on each argument that is not a tensor; on a
# ScriptObject (the packed weights) the lookup throws and catches a C++ exception, about 8 us a
# call where a decode step's small GEMV takes tens. The ops here take checked plain tensors and
# the packed weights, so the lookup is switched off around them (dispatch-level subclasses, e.g.
# fake tensors, are unaffected).
packed_argument = torch._C.DisableTorchFunctionSubclass


@functools.cache
def gemv_kernel() -> str:
    """The bf16 GEMV kernel this process runs (what provenance records for a GEMV call)."""
    return GEMV_KERNELS.get(str(extension().ops.gemv_isa()), "no bf16 GEMV in this build")


@functools.cache
def torch_matmul_kernel() -> str:
    """What provenance records for a ``LargeMPolicy`` call (torch's oneDNN, by version)."""
    found = re.search(r"MKL-DNN v([0-9.]+)", torch.__config__.show())
    library = f"oneDNN {found.group(1)}" if found else "its oneDNN"
    return f"torch matmul ({library}) on the weights unpacked per call"


@functools.cache
def gemv_max_rows() -> int:
    """The most rows this process's GEMV kernel takes (0: none in this build)."""
    return int(extension().ops.gemv_max_rows())


@dataclass(frozen=True, slots=True)
class OneDnnWeight:
    """A weight packed by oneDNN. ``compute`` is the primitive's src/weights type; int8 keeps
    its ``w_scale`` ``[N]`` for an epilogue that applies it (``MatmulForm.weight_scales`` off)."""

    packed: Any  # torch.classes.pa_cpu_onednn.PackedWeights
    compute: torch.dtype
    nbytes: int
    layout: str
    w_scale: torch.Tensor | None = None
    gemv: bool = False  # the bf16 GEMV can read it (oneDNN's AVX-512 BF16 layout, this build)


@dataclass(frozen=True, slots=True)
class Call:
    """One call: ``problem`` (the call's full descriptor, keying its primitive), the primitive's
    own problem ``conf`` (dense rows, and only what ``MatmulForm`` gives it), its operands
    (``src``/``kernel_out`` the call's tensors or dense staging buffers) and what the torch
    epilogue adds (``epilogue_bias``, fp32)."""

    problem: GemmProblem
    conf: tuple[int, ...]
    src: torch.Tensor
    bias: torch.Tensor | None
    kernel_out: torch.Tensor
    epilogue_bias: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class Built:
    """A cached primitive and the oneDNN implementation it got (``note_kernel`` per call)."""

    prim: Any  # torch.classes.pa_cpu_onednn.Primitive
    kernel: str


class OneDnnGemm:
    name = "onednn"
    path = ImplPath.NATIVE

    def __init__(
        self,
        policy: LmHeadPolicy | None = None,
        threads: int | None = None,
        cache_capacity: int = 256,
        form: MatmulForm | None = None,
        strict: bool | None = None,
        gemv: GemvPolicy | None = None,
        large_m: LargeMPolicy | None = None,
    ) -> None:
        self.policy = policy  # None: LmHeadPolicy.default_for the machine
        self.gemv = gemv  # None: GemvPolicy.default_for the machine and its CPU family
        self.large_m = large_m  # None: LargeMPolicy.default_for the machine
        if threads is not None:
            checks.positive_int("OneDnnGemm", "threads", threads)
        self.threads = threads
        if form is not None and not isinstance(form, MatmulForm):
            raise TypeError(f"OneDnnGemm: form must be a MatmulForm or None, got {form!r}")
        self.form = form  # None: MatmulForm.for_machine where the kernels run
        self.strict = strict  # None: PLUGIN_API_STRICT, read when a primitive is built
        self.cache: PrimitiveCache[GemmProblem, Built] = PrimitiveCache(cache_capacity)
        self._scratch = threading.local()
        self._warned: set[tuple[str, str]] = set()

    # ---- decisions (pure) ----------------------------------------------------------------------

    def supports(self, spec: GemmSpec, info: DeviceInfo) -> Decision:
        if spec.weight_dtype == torch.float16:
            return Decision.reject(
                "fp16 weights: not offered on the oneDNN path (panel serves them)"
            )
        if spec.out_dtype == torch.float16:
            return Decision.reject("int8 with fp16 out: not offered on the oneDNN path")
        if spec.scaled and int8_matmul_exact(info) and not onednn_serves(info, "s8->f32"):
            return Decision.reject(f"int8 scaled_mm: {why_not(info, 's8->f32')}")
        if spec.scaled and not int8_matmul_exact(info):
            return Decision.reject(
                f"int8 scaled_mm: {isa_name(info)} without VNNI/AMX, where oneDNN's s8 matmul "
                "saturates an int16 intermediate (vpmaddubsw) for full-range int8 weights"
            )
        form = self.form_for(info.machine)
        if spec.scaled:
            where = "in the primitive" if form.weight_scales else "in the torch epilogue"
            return Decision.accept(
                f"oneDNN s8 x s8 -> f32 matmul with per-channel weight scales {where}; "
                "per-token scale and bias in one torch epilogue"
            )
        bias = "bias " + ("in the primitive" if form.bias else "added to the fp32 dst by torch")
        if spec.weight_dtype == F32:
            if f32_panel(info):
                return Decision.reject(
                    f"fp32: {isa_name(info)} without AVX-512, where oneDNN 3.2 has only its jit "
                    "sgemm (a third of the panel kernel's speed at a decode step's few rows)"
                )
            if not onednn_serves(info, "f32->f32"):
                return Decision.reject(f"fp32: {why_not(info, 'f32->f32')}")
            return Decision.accept("oneDNN f32 matmul", bias)
        if not bf16_matmul(info):
            return Decision.reject(
                f"bf16: {isa_name(info)} has no oneDNN bf16 matmul (every implementation reports "
                "'unsupported isa')"
            )
        if (slow := slow_bf16(info)) is not None:
            return Decision.reject(f"bf16: {why_not(info, slow)}")
        source = (
            "PLUGIN_API_ONEDNN_LM_HEAD"
            if self.policy is not None
            else f"default on {info.machine}{' with AMX' if amx(info) else ''}"
        )
        rows = gemv_rows(amx(info))
        if spec.usage == "lm_head":
            policy = f"LmHeadPolicy: {self.policy_for(info).describe(rows)} ({source})"
        else:
            gemv = self.gemv_for(info)
            origin = "PLUGIN_API_ONEDNN_GEMV" if self.gemv is not None else "default"
            policy = f"GemvPolicy: {gemv.describe(rows)} ({origin})"
        if spec.out_dtype == F32:
            return Decision.accept(
                "oneDNN bf16 x bf16 -> f32 matmul: fp32 out is the kernel's dst", bias, policy
            )
        if spec.usage == "linear":
            origin = "PLUGIN_API_ONEDNN_LARGE_M" if self.large_m is not None else "default"
            large = f"LargeMPolicy: {self.large_m_for(info).describe()} ({origin})"
            return Decision.accept("oneDNN bf16 x bf16 matmul", bias, policy, large)
        return Decision.accept("oneDNN bf16 x bf16 matmul", bias, policy)

    def kernel_dst(self, spec: GemmSpec, m: int) -> torch.dtype:
        """The primitive's dst type for ``m`` rows; bf16 out with an f32 dst is one downcast."""
        if spec.out_dtype == F32 or spec.weight_dtype != BF16:
            return F32
        return F32 if self._host_policy.f32_dst(m, spec.n) else BF16

    def policy_for(self, info: DeviceInfo) -> LmHeadPolicy:
        """The policy given, else the measured default for the machine ``info`` describes."""
        if self.policy is not None:
            return self.policy
        return LmHeadPolicy.default_for(info.machine, amx(info))

    def gemv_for(self, info: DeviceInfo) -> GemvPolicy:
        """The GEMV policy given, else the measured default for the machine ``info`` describes
        (architecture, CPU family, AMX)."""
        if self.gemv is not None:
            return self.gemv
        return GemvPolicy.default_for(info.machine, cpu_family.of(info), amx(info))

    def large_m_for(self, info: DeviceInfo) -> LargeMPolicy:
        """The large-M policy given, else the measured default for the machine ``info``
        describes (architecture, AMX)."""
        if self.large_m is not None:
            return self.large_m
        return LargeMPolicy.default_for(info.machine, amx(info))

    def form_for(self, machine: str) -> MatmulForm:
        """The form given, else what oneDNN's fast kernels take on ``machine``."""
        return MatmulForm.for_machine(machine) if self.form is None else self.form

    # The policies of the machine the kernels run on, derived once: per call they took about a
    # quarter of a small GEMM's host time.
    @functools.cached_property
    def _host_form(self) -> MatmulForm:
        return self.form_for(platform.machine())

    @functools.cached_property
    def _host_policy(self) -> LmHeadPolicy:
        return self.policy_for(cpu_family.host())

    @functools.cached_property
    def _host_gemv(self) -> GemvPolicy:
        return self.gemv_for(cpu_family.host())

    @functools.cached_property
    def _host_large_m(self) -> LargeMPolicy:
        return self.large_m_for(cpu_family.host())

    # ---- running -------------------------------------------------------------------------------

    def prepare(
        self, spec: GemmSpec, weight: torch.Tensor, weight_scale: torch.Tensor | None
    ) -> OneDnnWeight:
        """Pack ``weight`` ``[N, K]`` (bf16/fp32/int8); int8 keeps ``weight_scale`` ``[N]`` fp32."""
        compute = spec.weight_dtype
        scaled = spec.scaled and self._host_form.weight_scales
        conf = [PACK_M, spec.n, spec.k, spec.k, spec.n, *[CODES[compute]] * 2, CODES[F32], 0]
        conf += [int(scaled), self._threads()]
        scale = None if weight_scale is None else weight_scale.to(F32).contiguous()
        ops = extension().ops
        packed = ops.pack(weight.contiguous(), scale if scaled else None, conf)
        layout, gemv = str(packed.layout()), bool(ops.gemv_layout(packed))
        return OneDnnWeight(packed, compute, int(packed.nbytes()), layout, scale, gemv)

    def plan(
        self,
        spec: GemmSpec,
        payload: OneDnnWeight,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> Call:
        """What one call runs: the primitive's problem and operands, and the torch epilogue.

        ``problem`` is the call as given (strides, out dtype, bias dtype) with ``variant`` =
        compute type / dst handling / threads, so same-shape bf16-out and fp32-out calls never
        share a primitive.
        """
        m, n, k = int(x.shape[0]), spec.n, spec.k
        bias32 = None if bias is None else bias.to(F32)  # fp32: one rounding, at the end
        if spec.scaled:
            dst = F32  # the per-token scale, then the bias, run in the epilogue
            in_kernel = False
            handling = f"epilogue-{checks.short_dtype(out.dtype)}"
        else:
            in_kernel = bias is not None and self._host_form.bias
            outside = bias is not None and not in_kernel
            dst = F32 if outside else self.kernel_dst(spec, m)
            handling = "direct" if dst == out.dtype else f"downcast-{checks.short_dtype(out.dtype)}"
            handling += "+bias" if outside else ""
        variant = f"{checks.short_dtype(payload.compute)}/{handling}/t{self._threads()}"
        problem = problem_of(spec, x, bias32, out, variant=variant)
        src = self._dense(x, "src")
        kernel_out = out if out.dtype == dst else self._staging("dst", m, n, dst)
        kernel_out = self._dense(kernel_out, "dst")
        scaled = spec.scaled and self._host_form.weight_scales
        conf: tuple[int, ...] = (m, n, k, k, n, CODES[payload.compute], CODES[payload.compute])
        conf += (CODES[dst],)
        conf += (CODES[F32] if in_kernel else 0, int(scaled), self._threads())
        epilogue_bias = bias32 if bias is not None and not in_kernel else None
        return Call(problem, conf, src, bias32 if in_kernel else None, kernel_out, epilogue_bias)

    def mm(
        self,
        spec: GemmSpec,
        x: torch.Tensor,
        payload: OneDnnWeight,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """``out[M, N] = x[M, K] @ W^T (+ bias)``; ``x`` and ``out`` row strides may exceed the
        row (they are staged through dense buffers: oneDNN's fast kernels take dense rows)."""
        m = int(x.shape[0])
        if m == 0:
            return
        route = self._route(spec, payload, x, bias, out)
        if route == "gemv":
            prefetch = bool(self._host_gemv.prefetch)
            with packed_argument():
                extension().ops.gemv(payload.packed, x, out, self._threads(), prefetch)
            note_kernel(gemv_kernel())
            return
        if route == "torch":
            self._run_torch(payload, x, bias, out)
            return
        pad = self._host_policy.pad_m if spec.usage == "lm_head" else 1
        if m < pad:  # the pad-row kernel on this thread's padded buffers (LmHeadPolicy.pad_m)
            xp = self._staging("pad-src", pad, spec.k, x.dtype)
            op = self._staging("pad-out", pad, spec.n, out.dtype)
            xp[:m].copy_(x)
            self.mm(spec, xp, payload, bias, op)
            out.copy_(op[:m])
            return
        call = self.plan(spec, payload, x, bias, out)
        self._run(call, payload)
        if call.epilogue_bias is not None:
            torch.add(call.kernel_out, call.epilogue_bias, out=out)  # fp32 sum, rounded once
        elif call.kernel_out is not out:
            out.copy_(call.kernel_out)  # the one downcast (round to nearest even), or restride

    def _route(
        self,
        spec: GemmSpec,
        payload: OneDnnWeight,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor,
    ) -> str:
        """Which kernel this call runs, on weights in the layout the GEMV reads: ``"gemv"``, the
        bf16 GEMV (at most ``LmHeadPolicy.gemv_m`` rows for the LM head, ``GemvPolicy.linear_m``
        for linear layers, up to what this process's kernel takes; no bias); ``"torch"``,
        torch's matmul on the unpacked weights (``LargeMPolicy``: a linear call of at least
        ``min_m`` rows, bf16 out, no bias or a bf16 one); else ``"onednn"``."""
        m = x.shape[0]
        if not payload.gemv or x.dtype != BF16:
            return "onednn"
        rows = self._host_policy.gemv_m if spec.usage == "lm_head" else self._host_gemv.linear_m
        dense = x.stride(1) == 1 and out.stride(1) == 1
        if bias is None and m <= min(rows, gemv_max_rows()) and out.dtype in (F32, BF16) and dense:
            return "gemv"
        min_m = self._host_large_m.min_m
        plain = bias is None or bias.dtype == BF16
        if 0 < min_m <= m and spec.usage == "linear" and out.dtype == BF16 and plain:
            return "torch"
        return "onednn"

    def _run_torch(
        self, payload: OneDnnWeight, x: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor
    ) -> None:
        """``LargeMPolicy``'s kernel: unpack into this thread's ``[N, K]`` buffer, torch's mm."""
        threads = self._threads()
        w = self._staging("unpacked", out.shape[1], x.shape[1], BF16)
        with packed_argument():
            extension().ops.unpack(payload.packed, w, threads)
        before = torch.get_num_threads()
        if before != threads:  # PLUGIN_API_ONEDNN_THREADS holds for torch's kernel too
            torch.set_num_threads(threads)
        try:
            if b is None:
                torch.mm(x, w.t(), out=out)
            else:
                torch.addmm(b, x, w.t(), out=out)  # the bias added in fp32, rounded once
        finally:
            if before != threads:
                torch.set_num_threads(before)
        note_kernel(torch_matmul_kernel())

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
        acc, s = call.kernel_out, x_scale.view(m, 1)  # acc: fp32, dense (and maybe `out`)
        if not self._host_form.weight_scales:
            assert payload.w_scale is not None  # prepare keeps it for int8
            acc.mul_(s)  # (acc * x_scale) * w_scale, the reference's order
            s = payload.w_scale.view(1, spec.n)
        if call.epilogue_bias is None:
            torch.mul(acc, s, out=out)
        else:
            torch.addcmul(call.epilogue_bias, acc, s, out=out)

    def _run(self, call: Call, payload: OneDnnWeight) -> None:
        built = self.cache.get_or_build(call.problem, lambda _: self._build(call.conf, payload))
        prim = built.prim
        with packed_argument():
            prim.run(payload.packed, call.src, call.bias, call.kernel_out, self.scratchpad(prim))
        note_kernel(built.kernel)

    def scratchpad(self, prim: Any) -> torch.Tensor:
        """This thread's user-managed oneDNN scratchpad, grown to what ``prim`` needs."""
        need = max(int(prim.scratchpad_bytes()), 1)
        buf = getattr(self._scratch, "buf", None)
        if buf is None or buf.numel() < need:
            buf = torch.empty(need, dtype=torch.uint8)
            self._scratch.buf = buf
        return buf

    def _staging(self, role: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        """This thread's dense ``[rows, cols]`` buffer for ``role``, grown as needed (zeroed when
        made: padding rows then hold finite values)."""
        bufs = getattr(self._scratch, "staging", None)
        if bufs is None:
            bufs = self._scratch.staging = {}
        buf = bufs.get((role, cols, dtype))
        if buf is None or buf.shape[0] < rows:
            buf = torch.empty(rows, cols, dtype=dtype)
            if buf.nbytes >= HUGE_OUT_BYTES:
                advise_huge_pages(buf)  # before the first write, as the host's own large outputs
            buf = bufs[(role, cols, dtype)] = buf.zero_()
        return buf[:rows]

    def _dense(self, t: torch.Tensor, role: str) -> torch.Tensor:
        """``t`` with row stride = row length: itself (or a view of a one-row ``src``), else
        staged. ``src`` is copied in; a staged ``dst`` is copied out by the caller."""
        rows, cols = t.shape
        if t.stride(0) == cols or rows == 0:
            return t
        if rows == 1 and role == "src":  # a dst view would alias `out` in the epilogue
            return t.as_strided((1, cols), (cols, 1))
        staged = self._staging(role, rows, cols, t.dtype)
        if role == "src":
            staged.copy_(t)
        return staged

    def _build(self, conf: tuple[int, ...], payload: OneDnnWeight) -> Built:
        prim = extension().ops.matmul(list(conf), payload.packed)
        impl = str(prim.impl())
        if reference_kernel(impl, platform.machine()):
            self._reference_kernel(conf, impl)
        return Built(prim, f"oneDNN {impl}")

    def _reference_kernel(self, conf: tuple[int, ...], impl: str) -> None:
        """oneDNN gave a problem its reference code: warned once per kind, an error when strict."""
        m, n, k, _, _, a, b, c, bias, scaled, threads = conf
        names = {v: checks.short_dtype(t) for t, v in CODES.items()}
        what = f"{names[a]}x{names[b]}->{names[c]} M={m} N={n} K={k}"
        what += (" bias" if bias else "") + (" w_scale" if scaled else "")
        msg = (
            f"gemm: oneDNN {extension().ops.onednn_version()} runs {what} (threads={threads}) "
            f"with its reference kernel {impl!r}, far slower than its optimised ones"
        )
        strict = read_settings().strict if self.strict is None else self.strict
        if strict:
            raise FallbackRefused(msg + "; PLUGIN_API_STRICT=1 forbids it", backend="cpu-arm-acl")
        key = (impl, what.split(" ")[0])
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(msg + " (warned once per kind)", PluginApiWarning, stacklevel=2)

    def _threads(self) -> int:
        return self.threads or torch.get_num_threads()


def implementations() -> tuple[OneDnnGemm, PanelGemm]:
    """oneDNN first; the panel GEMM serves the shapes oneDNN's kernels here are slow at."""
    from .panel_gemm import PanelGemm

    s = settings.read()
    return (
        OneDnnGemm(policy=s.lm_head, threads=s.threads, gemv=s.gemv, large_m=s.large_m),
        PanelGemm(policy=s.panel, threads=s.threads),
    )

"""Per-token-group quantization in the plugin's C++ extension (op family ``quant``).

Bit-exact with the documented rule (docs/ops.md) for int8 and fp8 e4m3fn, both scale layouts
and ue8m0: IEEE fp32 division, round-half-even, fp8 RNE with saturation to +-448. AVX-512 (16
lanes) where the CPU has it, AVX2 (8 lanes, F16C for fp16 input) for the rest or where that is
the best, NEON (two vectors of 4 lanes a step) on Arm, the same operations in scalar C++ for
each group's tail and elsewhere; OpenMP over (row, group). On AVX-512
with VBMI, bf16 input goes 64 elements a step (byte permutes put the codes in order) and its
groups are planned 16 at a time, elsewhere on x86 8 at a time; on AVX-512, large outputs are
streamed (``STREAM_MIN_BYTES``).
"""

from __future__ import annotations

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.quant import QuantSpec

from . import settings
from .build import extension
from .isa import quant_isa

#: Codes of at least this many bytes are written with streaming stores, past the caches (AVX-512
#: builds): an output this large does not stay cached for the GEMM that reads it; smaller ones (a
#: decode step's activations) stay cached for their reader. Measured:
#: docs/measurements/cpu-arm-acl/2026-12-03-zen4.md.
STREAM_MIN_BYTES = 16 * 2**20


class NativeGroupQuant:
    name = "cpp-group-quant"
    path = ImplPath.NATIVE

    def __init__(
        self, threads: int | None = None, stream_min_bytes: int = STREAM_MIN_BYTES
    ) -> None:
        self.threads = threads
        self.stream_min_bytes = stream_min_bytes

    def supports(self, spec: QuantSpec, info: DeviceInfo) -> Decision:
        isa = quant_isa(info)
        vbmi = "avx512vbmi" in info.cpu_flags
        # group_quant.cpp plans bf16 groups 16 at a time with VBMI (groups of a multiple of 32
        # elements), 8 at a time on other x86 builds (a multiple of 16); others one at a time
        batch = 16 if vbmi else 8
        planned = spec.in_dtype == torch.bfloat16 and spec.group_size % (2 * batch) == 0
        plans = [f"groups planned {batch} at a time"] if planned else []
        avx512 = [*(["VBMI for bf16"] if vbmi else []), *plans, "AVX2 for the rest of a group"]
        how = {
            "avx512": f"AVX-512 ({', '.join(avx512)})",
            "avx2": f"AVX2 ({plans[0]})" if plans else "AVX2",
            "neon": "NEON (8 elements a step, scalar C++ for a group's rest)",
            "scalar": "scalar C++ (compiler-vectorised)",
        }[isa]
        stream = (
            f", codes of {self.stream_min_bytes / 2**20:g} MiB or more streamed past the caches"
            if isa == "avx512"
            else ""
        )
        return Decision.accept(f"{how} kernel, OpenMP over (row, group){stream}; bit-exact rule")

    def quantize(
        self,
        spec: QuantSpec,
        x: torch.Tensor,
        eps: float,
        out_q: torch.Tensor,
        out_scales: torch.Tensor,
    ) -> None:
        """``x`` ``[M, K]`` contiguous -> ``out_q`` ``[M, K]``, ``out_scales`` ``[M, K/group]``
        in either layout (the kernel writes through the scales' strides)."""
        threads = self.threads or torch.get_num_threads()
        fp8 = spec.dtype == torch.float8_e4m3fn
        stream = out_q.numel() >= self.stream_min_bytes
        extension().ops.group_quant(
            x, spec.group_size, fp8, eps, spec.scale_ue8m0, stream, out_q, out_scales, threads
        )


def implementations() -> tuple[NativeGroupQuant]:
    return (NativeGroupQuant(threads=settings.read().threads),)

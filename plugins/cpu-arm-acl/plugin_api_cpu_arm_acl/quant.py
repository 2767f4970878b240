"""Per-token-group quantization in the plugin's C++ extension (op family ``quant``).

Bit-exact with the documented rule (docs/ops.md) for int8 and fp8 e4m3fn, both scale layouts
and ue8m0: IEEE fp32 division, round-half-even, fp8 RNE with saturation to +-448. AVX-512 (16
lanes) where the CPU has it, AVX2 (8 lanes, F16C for fp16 input) for the rest or where that is
the best, the same operations in scalar C++ elsewhere; OpenMP over (row, group).
"""

from __future__ import annotations

import torch

from plugin_api.device_info import DeviceInfo
from plugin_api.ops.decision import Decision, ImplPath
from plugin_api.ops.quant import QuantSpec

from .build import extension
from .isa import quant_isa


class NativeGroupQuant:
    name = "cpp-group-quant"
    path = ImplPath.NATIVE

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads

    def supports(self, spec: QuantSpec, info: DeviceInfo) -> Decision:
        how = {
            "avx512": "AVX-512 (AVX2 for the rest of a group)",
            "avx2": "AVX2",
            "scalar": "scalar C++ (compiler-vectorised)",
        }[quant_isa(info)]
        return Decision.accept(f"{how} kernel, OpenMP over (row, group); bit-exact rule")

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
        extension().ops.group_quant(
            x, spec.group_size, fp8, eps, spec.scale_ue8m0, out_q, out_scales, threads
        )

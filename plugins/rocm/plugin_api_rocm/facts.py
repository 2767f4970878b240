"""What only the real machine can tell about torch on ROCm, for ``DeviceInfo.facts``.

Read through the ``plugin_api_machine_facts`` hook on the real machine (never for what-if), by
the host's trials (``plugin_api.gpu.torch_facts``): ``rocm.graph_capture`` (a HIP graph captured and
replayed through ``torch.cuda.CUDAGraph``), ``rocm.mm_out_dtype`` (``torch.mm(bf16, bf16,
out_dtype=torch.float32)`` on the GPU) and ``rocm.int_mm`` (an exact ``torch._int_mm``). Nothing
runs unless torch is a HIP build that sees an AMD GPU.
"""

from __future__ import annotations

from plugin_api.gpu.platforms import ROCM
from plugin_api.gpu.torch_facts import GRAPH_CAPTURE, INT_MM, MM_OUT_DTYPE, TorchFacts

FACTS = TorchFacts("rocm", ROCM)


def read() -> dict[str, str]:
    return FACTS.read(GRAPH_CAPTURE, MM_OUT_DTYPE, INT_MM)

"""Is vLLM's own CPU int8 W8A8 GEMM exact on this machine? Prints JSON.

vLLM 0.32 runs compressed-tensors W8A8 on a CPU without AMX through oneDNN
(``onednn_scaled_mm``). oneDNN's int8 kernels for CPUs without VNNI multiply u8 x s8 pairs with
``vpmaddubsw``, whose int16 sums saturate, so the result can be wrong by far more than rounding.
This runs the kernel vLLM's linear method runs, on full-range int8 operands with unit scales,
and compares it with the exact integer product.
"""

from __future__ import annotations

import json

import torch
from vllm import _custom_ops as ops
from vllm.platforms import current_platform


def main() -> None:
    current_platform.import_kernels()
    gen = torch.Generator().manual_seed(0)
    m, n, k = 8, 256, 512
    x = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=gen)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    exact = x.double() @ w.double().t()
    # as vLLM's CPU linear method hands them over: weight [K, N] column-major, scales [N, 1]
    # (the handler keeps pointers to both: they must outlive it)
    w_t, w_scale = w.t(), torch.ones(n, 1)
    handler = ops.create_onednn_scaled_mm(
        w_t, w_scale, torch.float32, dynamic_quant=True, use_azp=False
    )
    out = torch.empty(m, n)
    ops.onednn_scaled_mm(handler, x, out, torch.ones(m, 1), None, None, None)
    err = (out.double() - exact).abs().max().item()
    peak = exact.abs().max().item()
    print(json.dumps({"kernel": "onednn_scaled_mm", "max_abs_error": err, "max_abs": peak}))


if __name__ == "__main__":
    main()

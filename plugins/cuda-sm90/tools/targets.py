"""Issue-9 targets on one GPU, measured beside a copy-bandwidth ceiling from the same run.

- decode attention, batch >= 16 at 8k context: bytes of K/V read per step over the step's
  time, as a fraction of the measured copy bandwidth (target >= 0.55);
- LM head M=40, K=4096, N=248320, bf16 x bf16 -> fp32: median time (target <= 0.56 ms).

Run by gpu_check.sh; writes JSON to the path given. Figures are the median of timed
repetitions after warm-up, outputs preallocated; decode steps replay a captured CUDA graph.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import plugin_api as pa
from plugin_api.backend import backend_for
from plugin_api.gpu.device_graphs import capture
from plugin_api.ops.attention import Attention, AttentionBatch, AttentionSpec, KVCache


def median_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """Bytes read + written per second by dst.copy_(src) into a preallocated tensor."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3)


def decode_setup(backend, batch: int, context: int) -> Callable[[], object]:
    """A planned decode step of ``batch`` requests at ``context`` tokens (32/8 heads, d128, bf16,
    block 16, blocks in random order): calling it runs one eager step."""
    spec = AttentionSpec(32, 8, 128, torch.bfloat16, block_size=16)
    attn = Attention(spec, backend)
    per_seq = context // spec.block_size
    blocks = torch.randperm(batch * per_seq, dtype=torch.int32).view(batch, per_seq)
    last = blocks[:, -1].to(torch.int64) * spec.block_size + spec.block_size - 1
    step = AttentionBatch(
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32),
        seq_lens=torch.full((batch,), context, dtype=torch.int32),
        block_table=blocks,
        slot_mapping=last,
        num_decodes=batch,
    )
    cache = KVCache(
        torch.randn((batch * per_seq, 2, 8, 16, 128), device="cuda", dtype=torch.bfloat16)
    )
    q = torch.randn((batch, 32, 128), device="cuda", dtype=torch.bfloat16)
    k = torch.randn((batch, 8, 128), device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    plan = attn.plan(step)
    return lambda: attn.run(q, k, v, cache, plan, out=out)


def decode_step(backend, batch: int, context: int) -> dict[str, float]:
    run = decode_setup(backend, batch, context)
    ms = median_ms(capture(run, "cuda").replay)  # JIT loads happen in capture's warm-up
    kv_bytes = batch * context * 8 * 128 * 2 * 2  # K and V, bf16
    return {"batch": batch, "context": context, "ms": ms, "bytes_per_s": kv_bytes / (ms * 1e-3)}


def lm_head(backend) -> dict[str, float]:
    m, k, n = 40, 4096, 248320
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
    packed = pa.prepare(w, out_dtype=torch.float32, usage="lm_head", backend=backend)
    out = torch.empty((m, n), device="cuda", dtype=torch.float32)
    ms = median_ms(lambda: pa.mm(x, packed, out=out), reps=50)
    return {"m": m, "k": k, "n": n, "ms": ms, "weight_bytes_per_s": w.numel() * 2 / (ms * 1e-3)}


def main(path: str) -> int:
    backend = backend_for("cuda-sm90")
    ceiling = copy_bandwidth()
    decode = [decode_step(backend, b, 8192) for b in (16, 32, 64)]
    for d in decode:
        d["fraction_of_copy_bw"] = d["bytes_per_s"] / ceiling
    head = lm_head(backend)
    result = {
        "device": torch.cuda.get_device_name(),
        "copy_bytes_per_s": ceiling,
        "decode": decode,
        "decode_target_met": all(d["fraction_of_copy_bw"] >= 0.55 for d in decode),
        "lm_head": head,
        "lm_head_target_met": head["ms"] <= 0.56,
    }
    text = json.dumps(result, indent=2)
    print(text)
    Path(path).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "targets.json"))

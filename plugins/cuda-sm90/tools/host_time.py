"""The host work of an eager decode step that needs no GPU, timed on CPU tensors.

``overhead.py`` measures the whole eager step on an SM90 GPU. The parts below are plain Python
and torch CPU work, the same on any machine, so they can be timed (and compared across
revisions) where no GPU is lent:

- ``plan``: ``metadata.build_plan`` with ``reuse`` (once per step): the host batch into the
  plan's staging, one copy to the buffers (here CPU to CPU);
- ``decode call``: ``calls.decode_call`` for a layer after the step's first;
- ``run checks``: the host's checks in ``Attention.run`` for one layer (on the reference
  backend: the host code is the same for every backend), the path a well-formed call takes.

Shapes are the bench's decode cases (``plugin_api.bench``): 32/8 heads, d128, bf16, block 16,
batch 1 x 1k and 16 x 8k, blocks in shuffled order. Medians of 7 rounds after warm-up. Prints a
table, or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from plugin_api.backend import backend_for
from plugin_api.bench.cases import AttentionCase
from plugin_api.bench.workloads import Context, attention_batch, attention_spec
from plugin_api.ops.attention import Attention, KVCache
from plugin_api_cuda_sm90 import calls, metadata
from plugin_api_cuda_sm90.rules import Arch

CPU = torch.device("cpu")
SHAPES = ((1, 1024), (16, 8192))


def median_us(fn: Callable[[], object], reps: int = 500, rounds: int = 7) -> float:
    for _ in range(reps // 5):
        fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        samples.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(samples)


def measure(batch: int, context: int) -> dict[str, float]:
    case = AttentionCase("decode", batch, context, 1)  # the bench's decode step: 32/8, d128
    spec = attention_spec(case)
    step, blocks = attention_batch(case, Context(backend_for("reference"), CPU))
    plan = metadata.build_plan(spec, step, CPU, None)
    q = torch.randn((batch, 32, 128), dtype=torch.bfloat16)
    k = torch.randn((batch, 8, 128), dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    cache = KVCache(torch.zeros((blocks, 2, 8, 16, 128), dtype=torch.bfloat16))
    ws = torch.zeros(64, dtype=torch.uint8)
    calls.decode_call(spec, Arch.SM90, plan, q, cache, None, out, ws)  # the step's first layer
    attn = Attention(spec, backend_for("reference"))
    host_plan = attn.plan(step)
    run_args = (q, k, v, cache, host_plan, None, out)
    if not attn._accepts_run(*run_args):
        attn._check_run(*run_args)  # raises with the argument named
        raise AssertionError("the combined check declined a well-formed call")
    return {
        "batch": batch,
        "context": context,
        "plan_us": median_us(lambda: metadata.build_plan(spec, step, CPU, plan)),
        "decode_call_us": median_us(
            lambda: calls.decode_call(spec, Arch.SM90, plan, q, cache, None, out, ws)
        ),
        "run_checks_us": median_us(lambda: attn._accepts_run(*run_args)),
        "run_checks_full_us": median_us(lambda: attn._check_run(*run_args)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    rows = [measure(b, c) for b, c in SHAPES]
    if args.json:
        print(json.dumps({"torch": torch.__version__, "rows": rows}, indent=2))
        return 0
    print("host us per call (CPU tensors; medians of 7 rounds)")
    print(f"{'decode batch':<16}{'plan':>8}{'decode call':>13}{'run checks':>12}{'(full)':>9}")
    for r in rows:
        shape = f"{r['batch']} x {r['context'] // 1024}k"
        print(
            f"{shape:<16}{r['plan_us']:8.1f}{r['decode_call_us']:13.1f}"
            f"{r['run_checks_us']:12.1f}{r['run_checks_full_us']:9.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

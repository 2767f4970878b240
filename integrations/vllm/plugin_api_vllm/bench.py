"""End-to-end benchmark: prefill and decode tokens/s of vLLM on a plugin-api backend against vLLM's
own CPU kernels, same model, prompts and batches, beside ceilings measured in the same run.

    PLUGIN_API_BACKEND=cpu-arm-acl python -m plugin_api_vllm.bench [--json out.json] [--quick]

- Model: 8 layers, hidden 2048, intermediate 5632, GQA 32/8, vocab 32000 (0.49B parameters),
  built locally once (random weights, fixed seed) in ~/.cache/plugin-api/models.
- Batches 1 and 8 of distinct random prompts of 256-2048 tokens, prefix caching off (a repeated
  prompt would be served from vLLM's prefix cache and time nothing).
- The engine is driven step by step: prefill is the time until every request of the batch has
  its first token, decode the time after that per generated token (``--decode`` per request).
  Medians over ``--reps`` after a warm-up generation.
- Ceilings: decode cannot beat reading every weight once per step at the copy bandwidth;
  prefill cannot beat 2 FLOP per parameter per token at the best matmul rate.
- Host overhead: the bridge's metadata + plan time per step, beside the decode step time.
- ``--kv-cache-dtype fp8``: both sides keep an fp8 e4m3 KV cache (vLLM's own, or plugin-api's
  through the bridge).

Each configuration runs in its own process (vLLM picks its platform once per process).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .generate import positive, side_env
from .tiny_model import BENCH_SHAPE, cached

if TYPE_CHECKING:
    # vLLM's --dtype names; vLLM itself loads only where it runs
    from vllm.config.model import ModelDType

BATCH_LENGTHS = {1: [2048], 8: [256, 512, 768, 1024, 1280, 1536, 1792, 2048]}
QUICK_LENGTHS = {1: [512], 8: [256, 320, 384, 448, 512, 576, 640, 704]}


def _prompts(lengths: list[int], seed: int, vocab: int) -> list[Any]:
    import torch
    from vllm.inputs import TokensPrompt

    g = torch.Generator().manual_seed(seed)
    return [
        TokensPrompt(prompt_token_ids=torch.randint(2, vocab, (n,), generator=g).tolist())
        for n in lengths
    ]


def _timed(llm: Any, prompts: list[Any], decode: int) -> tuple[float, float, int]:
    """Drive vLLM's engine step by step: (seconds until every request has its first token,
    seconds after that, tokens generated after that)."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=1 + decode, ignore_eos=True)
    ids = [f"r{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    made: dict[str, int] = {}
    t0 = time.perf_counter()
    first: tuple[float, int] | None = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            made[out.request_id] = len(out.outputs[0].token_ids)
        if first is None and all(made.get(r, 0) >= 1 for r in ids):
            first = (time.perf_counter(), sum(made.values()))
    end = time.perf_counter()
    assert first is not None
    return first[0] - t0, end - first[0], sum(made.values()) - first[1]


def measure(
    model: str, dtype: ModelDType, kv_cache_dtype: str, reps: int, decode: int, quick: bool
) -> dict[str, Any]:
    """In this process: build the engine, time prefill and decode per batch."""
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        max_model_len=4096,
        enable_prefix_caching=False,
        seed=0,
        enforce_eager=False,
    )
    start_s = time.perf_counter() - t0
    vocab = BENCH_SHAPE.vocab
    llm.generate(_prompts([64, 80], 0, vocab), SamplingParams(max_tokens=4), use_tqdm=False)
    out: dict[str, Any] = {"start_s": start_s, "batches": {}}
    seed = 1
    for batch, lengths in (QUICK_LENGTHS if quick else BATCH_LENGTHS).items():
        prefill, decoding = [], []
        for _ in range(reps):
            seed += 1
            p, d, n = _timed(llm, _prompts(lengths, seed, vocab), decode)
            prefill.append(p)
            decoding.append(d / n)
            print(
                f"    batch {batch}: prefill {p:.2f} s, {n} decode tokens in {d:.2f} s",
                file=sys.stderr,
                flush=True,
            )
        p, per_token = statistics.median(prefill), statistics.median(decoding)
        out["batches"][str(batch)] = {
            "prompt_tokens": sum(lengths),
            "prefill_s": p,
            "prefill_tok_s": sum(lengths) / p,
            "decode_step_s": per_token * batch,
            "decode_tok_s": 1 / per_token,
        }
    if "PLUGIN_API_BACKEND" in os.environ:
        report = llm.collective_rpc("plugin_api_report")[0]
        out["report"] = {k: report[k] for k in ("backend", "distribution", "fallbacks", "host")}
        out["served"] = sorted(
            {f"{e['kind']}: {e['impl']} [{e['path']}]" for e in report["layers"].values()}
        )
    del llm
    return out


def ceilings(params: int) -> dict[str, float]:
    """Copy bandwidth and the best matmul rate, measured now on this machine."""
    import torch

    from plugin_api.bench.ceilings import copy_buffer_bytes, measure_ceilings
    from plugin_api.bench.harness import QUICK, cpu_llc, synchronizer

    cpu = torch.device("cpu")
    c = measure_ceilings(
        cpu, copy_buffer_bytes(cpu_llc().bytes), QUICK, synchronizer(cpu), stop_after_s=0.3
    )
    return {"copy_GBps": c.bandwidth / 1e9, "matmul_TFLOPs": c.peak_flops / 1e12}


def _side(model: str, dtype: str, bridge: str | None, args: argparse.Namespace) -> dict[str, Any]:
    env = side_env(bridge, "4")
    name = f"plugin-api {bridge}" if bridge else "vllm"
    print(f"... {name} {dtype}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "side.json"
        cmd = [sys.executable, "-m", "plugin_api_vllm.bench", "--side", out.as_posix()]
        cmd += ["--model", model, "--dtype", dtype, "--reps", str(args.reps)]
        cmd += ["--kv-cache-dtype", args.kv_cache_dtype]
        cmd += ["--decode", str(args.decode)] + (["--quick"] if args.quick else [])
        r = subprocess.run(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        progress = [line for line in r.stderr.splitlines() if line.startswith("    batch")]
        print("\n".join(progress), file=sys.stderr, flush=True)
        if r.returncode != 0:
            sys.stderr.write(r.stderr[-6000:])
            raise SystemExit(f"{name} {dtype} failed (exit {r.returncode})")
        result: dict[str, Any] = json.loads(out.read_text())
    kv = "" if args.kv_cache_dtype == "auto" else f" kv={args.kv_cache_dtype}"
    result |= {"side": name, "dtype": dtype, "label": f"{name} {dtype}{kv}"}
    return result


def table(sides: list[dict[str, Any]], ceil: dict[str, float], params: int) -> str:
    """One row per (side, dtype, batch), with ratios against vLLM's better dtype."""
    rows = [
        "| run | batch | prefill tok/s | decode tok/s | vs vLLM best (prefill / decode) |",
        "|---|---|---|---|---|",
    ]
    for batch in sorted({b for s in sides for b in s["batches"]}, key=int):
        own = [s["batches"][batch] for s in sides if s["side"] == "vllm"]
        best_p = max(o["prefill_tok_s"] for o in own)
        best_d = max(o["decode_tok_s"] for o in own)
        for s in sides:
            m = s["batches"][batch]
            rows.append(
                f"| {s['label']} | {batch} | {m['prefill_tok_s']:.1f} | "
                f"{m['decode_tok_s']:.2f} | {m['prefill_tok_s'] / best_p:.2f}x / "
                f"{m['decode_tok_s'] / best_d:.2f}x |"
            )
    bf16_bytes = 2 * params
    lines = [
        *rows,
        "",
        f"ceilings (this run): copy {ceil['copy_GBps']:.1f} GB/s at the start, "
        f"{ceil.get('copy_GBps_end', float('nan')):.1f} at the end -> bf16 decode at most "
        f"{ceil['copy_GBps'] * 1e9 / bf16_bytes:.1f} steps/s; matmul "
        f"{ceil['matmul_TFLOPs']:.2f} TFLOP/s -> prefill at most "
        f"{ceil['matmul_TFLOPs'] * 1e12 / (2 * params):.0f} tok/s",
    ]
    for s in sides:
        host = (s.get("report") or {}).get("host")
        if host and host["steps"]:
            step = host["median_s"]
            mean = host["build_s"] / host["steps"]
            dec = s["batches"]["1"]["decode_step_s"]
            lines.append(
                f"bridge host time per step ({s['label']}): metadata + plan "
                f"{step * 1e3:.2f} ms (median; mean {mean * 1e3:.2f} ms over {host['steps']} "
                f"steps) beside a batch-1 decode step of {dec * 1e3:.1f} ms ({step / dec:.1%})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="an HF model dir (default: the 0.49B model)")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=positive, default=3)
    ap.add_argument("--decode", type=positive, default=32, help="decode tokens per request")
    ap.add_argument(
        "--kv-cache-dtype",
        choices=("auto", "fp8"),
        default="auto",
        help="the KV cache of both sides: the model dtype (auto) or fp8 e4m3",
    )
    ap.add_argument("--quick", action="store_true", help="shorter prompts, for a smoke run")
    ap.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    ap.add_argument("--side", help=argparse.SUPPRESS)  # one configuration, in this process
    args = ap.parse_args(argv)
    if args.side:
        result = measure(
            args.model, args.dtype, args.kv_cache_dtype, args.reps, args.decode, args.quick
        )
        Path(args.side).write_text(json.dumps(result))
        return 0
    bridge = os.environ.get("PLUGIN_API_BACKEND", "auto")
    model = args.model or str(cached("bench-0.49b", "llama", BENCH_SHAPE))
    params = _params(model)
    ceil = ceilings(params)
    sides = []
    for dtype in args.dtypes.split(","):
        sides.append(_side(model, dtype, None, args))
        sides.append(_side(model, dtype, bridge, args))
    ceil_end = ceilings(params)
    ceil["copy_GBps_end"] = ceil_end["copy_GBps"]
    print(table(sides, ceil, params))
    if args.json:
        data = {"model": model, "params": params, "ceilings": ceil, "sides": sides}
        Path(args.json).write_text(json.dumps(data, indent=1))
    return 0


def _params(model: str) -> int:
    from safetensors import safe_open

    total = 0
    for f in Path(model).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():  # noqa: SIM118 (safe_open is not iterable)
                n = 1
                for d in st.get_slice(k).get_shape():
                    n *= d
                total += n
    return total


if __name__ == "__main__":
    raise SystemExit(main())

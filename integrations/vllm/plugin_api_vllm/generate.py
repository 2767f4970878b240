"""Greedy generation with vLLM in this process, as JSON: the tokens, the top-2 raw logits of each
step, timings, and (on the bridge) which plugin-api implementation served each layer.

vLLM picks its platform once per process, so comparing vLLM's own kernels with the bridge takes
one process each: the demo, the benchmark and the tests run this module per configuration.

    PLUGIN_API_BACKEND=cpu-arm-acl python -m plugin_api_vllm.generate --model DIR --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # vLLM's --dtype names; vLLM itself loads only where it runs
    from vllm.config.model import ModelDType

# Prompt texts of the tests and the demo; the tiny models' tokenizer makes one token per byte.
PROMPTS = (
    "Hello, my name is",
    "The capital of France is a city that has " * 3,
    "In the beginning the universe was created. " * 6,
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 5,
)

# --follow-up: a second wave, each prompt of the first extended, so that its prompt's full KV blocks
# come from vLLM's prefix cache and only the rest is prefilled, attending to the cached part
FOLLOW_UPS = tuple(f"{p} Say it once more, {i + 1} times." for i, p in enumerate(PROMPTS))

# --lora: the largest adapter rank the engine takes
LORA_MAX_RANK = 16


@dataclass
class Run:
    """One model's generation in one configuration."""

    model: str
    backend: str  # "vllm" (vLLM's own kernels) or the plugin-api backend id
    dtype: str
    compiled: bool  # vLLM's compilation mode for the engine is not NONE (its config, not the flag)
    # per prompt: the prompts', then (--follow-up) the follow-ups', then (--lora) the adapter's
    tokens: list[list[int]]
    # per prompt, per step: (token id, raw logit) of the two highest logits
    top2: list[list[list[tuple[int, float]]]] = field(default_factory=list)
    start_s: float = 0.0
    generate_s: float = 0.0
    cached_tokens: list[int] = field(default_factory=list)  # per prompt: vLLM's prefix-cache hits
    report: dict[str, Any] | None = None  # the first worker's (rank 0)
    reports: list[dict[str, Any]] = field(default_factory=list)  # every worker's
    # modules of the model that run a torch.compile'd graph (compiled here or loaded from vLLM's
    # cache); None where the worker is another process (vLLM's default): it is read in the worker
    compiled_modules: int | None = None


def _top2(output: Any) -> list[list[tuple[int, float]]]:
    steps = []
    for entry in output.logprobs or []:
        best = sorted(entry.items(), key=lambda kv: kv[1].logprob, reverse=True)[:2]
        steps.append([(int(tok), float(lp.logprob)) for tok, lp in best])
    return steps


def _compiled_modules(model: Any) -> int:
    """Modules under vLLM's ``support_torch_compile`` whose calls go through a compiled graph."""
    return sum(
        1
        for m in model.modules()
        if getattr(m, "do_not_compile", True) is False
        and (getattr(m, "compiled", False) or getattr(m, "aot_compiled_fn", None) is not None)
    )


def generate(
    model: str,
    prompts: list[str],
    *,
    dtype: ModelDType,
    compiled: bool,
    max_tokens: int,
    top2: bool,
    max_model_len: int,
    follow_up: bool = False,
    lora: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Run:
    from vllm import LLM, SamplingParams, envs
    from vllm.config import CompilationMode
    from vllm.lora.request import LoRARequest

    lora_options: dict[str, Any] = (
        {"enable_lora": True, "max_lora_rank": LORA_MAX_RANK} if lora else {}
    )
    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        dtype=dtype,
        enforce_eager=not compiled,
        max_model_len=max_model_len,
        seed=0,
        # raw logits, so the tests can tell a near-tie from a real difference
        logprobs_mode="raw_logits",
        **(extra or {}),
        **lora_options,
    )
    t1 = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2 if top2 else None)
    outs = llm.generate(prompts, params, use_tqdm=False)
    if follow_up:  # after the first wave: its blocks are in the prefix cache
        outs += llm.generate(list(FOLLOW_UPS[: len(prompts)]), params, use_tqdm=False)
    if lora:
        adapter = LoRARequest("adapter", 1, lora)
        outs += llm.generate(prompts, params, use_tqdm=False, lora_request=adapter)
    t2 = time.perf_counter()
    bridge = "PLUGIN_API_BACKEND" in os.environ
    config = llm.llm_engine.vllm_config
    run = Run(
        model=model,
        backend="vllm",
        dtype=dtype,
        compiled=config.compilation_config.mode != CompilationMode.NONE,
        tokens=[list(o.outputs[0].token_ids) for o in outs],
        top2=[_top2(o.outputs[0]) for o in outs] if top2 else [],
        start_s=t1 - t0,
        generate_s=t2 - t1,
        cached_tokens=[o.num_cached_tokens or 0 for o in outs],
    )
    # the engine core and its one worker in this process: a function reaches the model as is
    # (across processes vLLM would have to pickle it, which it refuses by default)
    if not envs.VLLM_ENABLE_V1_MULTIPROCESSING and config.parallel_config.world_size == 1:
        run.compiled_modules = llm.apply_model(_compiled_modules)[0]
    if bridge:
        run.reports = llm.collective_rpc("plugin_api_report")
        run.report = run.reports[0]
        run.backend = run.report["backend"]
    del llm
    return run


def side_env(bridge: str | None, kv_cache_gib: str) -> dict[str, str]:
    """The environment of a vLLM process: vLLM's own kernels (``bridge`` None, no PLUGIN_API_
    variable reaches it) or the bridge on backend ``bridge`` with the caller's plugin-api settings.
    ``VLLM_CPU_KVCACHE_SPACE`` defaults to ``kv_cache_gib`` (vLLM's own default is most of RAM)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLUGIN_API_")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", kv_cache_gib)
    if bridge is not None:
        env |= {k: v for k, v in os.environ.items() if k.startswith("PLUGIN_API_")}
        env["PLUGIN_API_BACKEND"] = bridge
    return env


def positive(text: str) -> int:
    """argparse type: a whole number >= 1 (argparse names the option in its error)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a whole number >= 1")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, help="checkpoint dir (repeat)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--compiled", action="store_true", help="vLLM's compiled mode (default eager)")
    ap.add_argument("--max-tokens", type=positive, default=32)
    ap.add_argument("--top2", action="store_true", help="record the top-2 raw logits per step")
    ap.add_argument("--max-model-len", type=positive, default=1024)
    ap.add_argument("--kv-cache-dtype", default="auto", help="vLLM's --kv-cache-dtype (fp8, ...)")
    ap.add_argument(
        "--tensor-parallel-size",
        type=positive,
        default=1,
        help="vLLM's tensor parallelism: worker processes over torch.distributed (CPU: set "
        "VLLM_CPU_OMP_THREADS_BIND, e.g. '0|1', where the machine has one NUMA node)",
    )
    ap.add_argument(
        "--max-num-batched-tokens",
        type=positive,
        help="vLLM's token budget per step: prompts over it are prefilled in chunks, scheduled "
        "beside running decodes",
    )
    ap.add_argument("--block-size", type=positive, help="vLLM's KV-cache block size")
    ap.add_argument(
        "--ngram-speculative-tokens",
        type=positive,
        metavar="N",
        help="speculative decoding with vLLM's n-gram proposer: up to N draft tokens per step "
        "from earlier text, verified in one decode of up to N + 1 query tokens",
    )
    ap.add_argument(
        "--follow-up",
        action="store_true",
        help="then generate from each prompt extended by a sentence: prefix-cache hits on the "
        "first wave's blocks",
    )
    ap.add_argument(
        "--lora",
        metavar="DIR",
        help="a PEFT LoRA adapter of the model (rank <= 16): the prompts again with it applied",
    )
    # a file, not stdout: vLLM logs to stdout from its own processes
    ap.add_argument("--json", metavar="FILE", help="write the runs as one JSON document to FILE")
    args = ap.parse_args(argv)
    if args.ngram_speculative_tokens is not None and len(args.model) > 1:
        # vLLM 0.32's CPU worker rebinds its Triton kernels for a speculative engine, and the
        # second such engine of a process fails there (AttributeError in its dispatcher)
        ap.error("--ngram-speculative-tokens takes one --model per process")
    if args.lora is not None and len(args.model) > 1:
        ap.error("--lora takes one --model: the adapter's")
    extra: dict[str, Any] = {
        "kv_cache_dtype": args.kv_cache_dtype,
        "tensor_parallel_size": args.tensor_parallel_size,
    }
    if args.max_num_batched_tokens is not None:
        extra |= {
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "enable_chunked_prefill": True,
        }
    if args.block_size is not None:
        extra["block_size"] = args.block_size
    if args.ngram_speculative_tokens is not None:
        extra["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": args.ngram_speculative_tokens,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        }
    runs = [
        generate(
            m,
            list(PROMPTS),
            dtype=args.dtype,
            compiled=args.compiled,
            max_tokens=args.max_tokens,
            top2=args.top2,
            max_model_len=args.max_model_len,
            follow_up=args.follow_up,
            lora=args.lora,
            extra=extra,
        )
        for m in args.model
    ]
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in runs]))
    else:
        for r in runs:
            print(f"{r.model} on {r.backend} ({r.dtype}, {'compiled' if r.compiled else 'eager'})")
            for toks in r.tokens:
                print("  ", toks)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

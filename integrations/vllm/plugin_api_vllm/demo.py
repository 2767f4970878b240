"""The main job: a model generates greedy text with vLLM on the selected plugin-api backend, beside
vLLM's own kernels on the same model, prompts and settings.

    PLUGIN_API_BACKEND=cpu-arm-acl python -m plugin_api_vllm.demo            # a local tiny model
    PLUGIN_API_BACKEND=auto python -m plugin_api_vllm.demo --model /path/to/hf-dir

Without ``--model`` it builds a small Llama-style checkpoint (random weights from a fixed seed, a
local byte-level tokenizer: no model hub is needed). Each configuration runs in its own process
(vLLM picks its platform once per process), so the script takes about a minute per side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .generate import PROMPTS, positive, side_env
from .tiny_model import Shape, cached

DEMO_SHAPE = Shape(layers=4, hidden=512, intermediate=1408, heads=8, kv_heads=2, vocab=2048)


def default_dtype() -> str:
    """bf16 where the CPU computes in bf16 (AVX-512 BF16, AMX), else fp32."""
    import torch

    return "bfloat16" if torch.cpu._is_avx512_bf16_supported() else "float32"


def _run(model: str, dtype: str, max_tokens: int, bridge: str | None) -> dict[str, Any]:
    env = side_env(bridge, "2")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        args = ["--model", model, "--dtype", dtype, "--max-tokens", str(max_tokens)]
        cmd = [sys.executable, "-m", "plugin_api_vllm.generate", *args, "--json", str(out)]
        side = f"plugin-api ({bridge})" if bridge else "vLLM's own kernels"
        print(f"... running vLLM on {side}", file=sys.stderr, flush=True)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout[-4000:] + r.stderr[-8000:])
            raise SystemExit(f"vLLM on {side} failed (exit {r.returncode}); its log is above")
        result: dict[str, Any] = json.loads(out.read_text())[0]
        return result


def _families(report: dict[str, Any]) -> list[str]:
    seen: dict[str, set[str]] = {}
    for e in report["layers"].values():
        fb = " (fallback)" if e["fallback"] else ""
        seen.setdefault(e["kind"], set()).add(f"{e['backend']}:{e['impl']} [{e['path']}]{fb}")
    return [f"  {kind:<9} {', '.join(sorted(v))}" for kind, v in sorted(seen.items())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.environ.get("MODEL") or None, help="an HF model dir")
    ap.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: by CPU)")
    ap.add_argument("--max-tokens", type=positive, default=32)
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    bridge = os.environ.get("PLUGIN_API_BACKEND", "auto")
    model = args.model or str(cached("demo-llama", "llama", DEMO_SHAPE))
    dtype = args.dtype or default_dtype()
    ours = _run(model, dtype, args.max_tokens, bridge)
    own = _run(model, dtype, args.max_tokens, None)
    generated = sum(len(t) for t in ours["tokens"])
    rate = {name: generated / r["generate_s"] for name, r in (("plugin-api", ours), ("vllm", own))}
    same = sum(a == b for a, b in zip(ours["tokens"], own["tokens"], strict=True))
    if args.json:
        data = {"model": model, "dtype": dtype, "plugin_api": ours, "vllm": own, "rate": rate}
        print(json.dumps(data, indent=2))
        return 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    report = ours["report"]
    print(f"model {model} ({dtype}), {len(PROMPTS)} prompts, {args.max_tokens} new tokens each")
    print(f"vLLM on plugin-api backend {report['backend']} ({report['distribution']}):")
    print("\n".join(_families(report)))
    for prompt, toks in zip(PROMPTS, ours["tokens"], strict=True):
        print(f"\n> {prompt[:60]!r}...\n  tokens {toks[:12]}...\n  text   {tok.decode(toks)!r}")
    print(
        f"\ngeneration: {rate['plugin-api']:.1f} tokens/s on plugin-api, {rate['vllm']:.1f} on "
        f"vLLM's own kernels ({rate['plugin-api'] / rate['vllm']:.2f}x); greedy outputs equal "
        f"for {same}/{len(PROMPTS)} prompts (bf16 may differ at near-ties)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A bounded load run against vLLM's OpenAI server: the bridge beside vLLM's own kernels.

Each side is one server on 127.0.0.1 (same model, dtype and settings), served one after the
other so they do not share the CPU. ``--clients`` streaming clients send ``--requests``
completions in all (distinct prompts, greedy, ``--max-tokens`` each); per side it reports
requests/s, time to first token p50/p99, generated tokens/s, and errors.

    PLUGIN_API_BACKEND=cpu-arm-acl python -m plugin_api_vllm.load --clients 4 --requests 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from .demo import DEMO_SHAPE, default_dtype
from .generate import positive, side_env
from .serving import Server
from .tiny_model import cached

TEXT = "Every request gets its own prompt, so no answer comes from a cache. "


def prompt(i: int, length: int) -> str:
    """Request ``i``'s prompt of ``length`` characters (one token per byte on the tiny models)."""
    text = f"request {i}: " + TEXT * (length // len(TEXT) + 1)
    return text[:length]


@dataclass(frozen=True)
class RequestResult:
    """One request: seconds to its first token, tokens generated, or the error."""

    ttft_s: float
    tokens: int
    error: str | None = None


@dataclass(frozen=True)
class LoadResult:
    side: str
    clients: int
    requests: int
    errors: int
    wall_s: float
    requests_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tokens_per_s: float
    error_samples: tuple[str, ...] = ()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> RequestResult:
    t0 = time.perf_counter()
    first: float | None = None
    tokens = 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                return RequestResult(0.0, 0, f"HTTP {resp.status_code}: {text[:200]}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue  # blank separators and keep-alive comments
                chunk = json.loads(line[6:])
                if chunk.get("error"):
                    return RequestResult(0.0, tokens, f"stream error: {chunk['error']}")
                for choice in chunk.get("choices", []):
                    if choice.get("token_ids"):
                        first = first if first is not None else time.perf_counter()
                        tokens += len(choice["token_ids"])
    except httpx.HTTPError as e:
        return RequestResult(0.0, tokens, f"{type(e).__name__}: {e}")
    if first is None:
        return RequestResult(0.0, 0, "the stream ended without a token")
    return RequestResult(first - t0, tokens)


async def _drive(
    url: str, model: str, clients: int, requests: int, prompt_chars: int, max_tokens: int
) -> tuple[list[RequestResult], float]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    outcomes: list[RequestResult] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            body = {
                "model": model,
                "prompt": prompt(i, prompt_chars),
                "max_tokens": max_tokens,
                "min_tokens": max_tokens,  # every request generates the same count
                "temperature": 0.0,
                "stream": True,
                "return_token_ids": True,
            }
            outcomes.append(await _one(client, url, body))

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return outcomes, wall


def run_load(
    url: str,
    model: str,
    *,
    side: str,
    clients: int,
    requests: int,
    prompt_chars: int = 256,
    max_tokens: int = 32,
) -> LoadResult:
    """``requests`` streaming completions from ``clients`` concurrent clients against ``url``."""
    outcomes, wall = asyncio.run(_drive(url, model, clients, requests, prompt_chars, max_tokens))
    good = [o for o in outcomes if o.error is None]
    bad = [o.error for o in outcomes if o.error is not None]
    ttfts = [o.ttft_s * 1e3 for o in good] or [float("nan")]
    return LoadResult(
        side=side,
        clients=clients,
        requests=requests,
        errors=len(bad),
        wall_s=wall,
        requests_per_s=len(good) / wall,
        ttft_p50_ms=statistics.median(ttfts),
        ttft_p99_ms=percentile(ttfts, 99),
        tokens_per_s=sum(o.tokens for o in good) / wall,
        error_samples=tuple(sorted(set(e for e in bad if e))[:3]),
    )


def serve_and_load(
    model: Path, bridge: str | None, args: argparse.Namespace, logs: Path
) -> LoadResult:
    env = side_env(bridge, "2")
    side = f"plugin-api {bridge}" if bridge else "vLLM's own"
    srv_args = ["--dtype", args.dtype, "--max-model-len", "2048", "--no-enable-prefix-caching"]
    if not args.compiled:
        srv_args.append("--enforce-eager")
    print(f"... serving on {side}", file=sys.stderr, flush=True)
    log = logs / f"{'bridge' if bridge else 'vllm'}.log"
    with Server(model, srv_args, env, log, name="load") as server:
        server.wait_ready()
        # warm-up: one request per client, not counted
        run_load(server.url, "load", side=side, clients=args.clients, requests=args.clients)
        print(f"... {args.requests} requests from {args.clients} clients", file=sys.stderr)
        result = run_load(
            server.url,
            "load",
            side=side,
            clients=args.clients,
            requests=args.requests,
            prompt_chars=args.prompt_chars,
            max_tokens=args.max_tokens,
        )
    return result


def table(results: list[LoadResult]) -> str:
    lines = [
        "| side | clients | requests | requests/s | TTFT p50 ms | TTFT p99 ms | tokens/s "
        "| errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.side} | {r.clients} | {r.requests} | {r.requests_per_s:.2f} | "
            f"{r.ttft_p50_ms:.0f} | {r.ttft_p99_ms:.0f} | {r.tokens_per_s:.1f} | {r.errors} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint dir (default: the demo's local tiny model)")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 where the CPU has it")
    ap.add_argument("--clients", type=positive, default=4)
    ap.add_argument("--requests", type=positive, default=32)
    ap.add_argument("--prompt-chars", type=positive, default=256)
    ap.add_argument("--max-tokens", type=positive, default=32)
    ap.add_argument("--compiled", action="store_true", help="vLLM's compiled mode (default eager)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = ap.parse_args(argv)
    args.dtype = args.dtype or default_dtype()
    bridge = os.environ.get("PLUGIN_API_BACKEND")
    if not bridge:
        ap.error("set PLUGIN_API_BACKEND to the backend to load (cpu-arm-acl, reference, auto)")
    model = Path(args.model) if args.model else cached("demo-llama", "llama", DEMO_SHAPE)
    with tempfile.TemporaryDirectory() as tmp:
        results = [serve_and_load(model, b, args, Path(tmp)) for b in (bridge, None)]
    print(
        f"model {model}, {args.dtype}, prompts of {args.prompt_chars} tokens, "
        f"{args.max_tokens} new tokens each, loopback"
    )
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    failed = sum(r.errors for r in results)
    if failed:
        print(f"{failed} request(s) failed: {results[0].error_samples or results[1].error_samples}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

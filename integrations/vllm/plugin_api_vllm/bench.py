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
- Interleaved: both sides of a dtype stay loaded, each in its own process (vLLM picks its
  platform once per process), and every repetition runs one then the other, the first
  alternating, so that a machine whose speed drifts (a shared VM) cannot favour a side.
- Ceilings: decode cannot beat reading every weight a step needs (all but the embedding) once
  per step at the copy bandwidth; prefill cannot beat 2 FLOP per weight a prompt token multiplies
  (all but the embedding and the LM head) at the best matmul rate. Measured at the start and
  end on the whole machine (its drift), and at the end on the cores the sides' model processes
  had, one thread per core: the bounds the table quotes.
- Host overhead: the bridge's metadata + plan time per step, beside the decode step time.
- Resources: the cores each side's model process may run on (vLLM binds its CPU worker), so a
  reader sees that both sides had the same.
- ``--kv-cache-dtype fp8``: both sides keep an fp8 e4m3 KV cache (vLLM's own, or plugin-api's
  through the bridge).
- vLLM's step timeout (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``) is 3600 s on both sides unless
  set: a slow side's prefill step (vLLM's own bf16 on an AVX2-only CPU) outlasts vLLM's 300 s.
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


def _engine(model: str, dtype: ModelDType, kv_cache_dtype: str) -> tuple[Any, float]:
    """vLLM's engine for the bench in this process, and its start time in seconds."""
    from vllm import LLM

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
    return llm, time.perf_counter() - t0


def _report(llm: Any) -> dict[str, Any]:
    """The bridge's report and the implementations that served (empty for vLLM's own side)."""
    if "PLUGIN_API_BACKEND" not in os.environ:
        return {}
    report = llm.collective_rpc("plugin_api_report")[0]
    return {
        "report": {k: report[k] for k in ("backend", "distribution", "fallbacks", "host")},
        "served": sorted(
            {f"{e['kind']}: {e['impl']} [{e['path']}]" for e in report["layers"].values()}
        ),
    }


def serve(model: str, dtype: ModelDType, kv_cache_dtype: str, decode: int, fds: str) -> None:
    """One side, in this process: build the engine, then answer the driver's requests, one JSON
    line each on the pipes ``fds`` ("READ,WRITE"): ``{"lengths": [...], "seed": s}`` runs one
    timed generation, ``{"report": true}`` returns the bridge's report. Ends at EOF."""
    from vllm import SamplingParams

    rfd, wfd = (int(v) for v in fds.split(","))
    with os.fdopen(rfd, "r") as requests, os.fdopen(wfd, "w") as answers:
        llm, start_s = _engine(model, dtype, kv_cache_dtype)
        vocab = llm.llm_engine.model_config.get_vocab_size()  # --model may be any checkpoint
        llm.generate(_prompts([64, 80], 0, vocab), SamplingParams(max_tokens=4), use_tqdm=False)
        answers.write(json.dumps({"start_s": start_s}) + "\n")
        answers.flush()
        for line in requests:
            ask = json.loads(line)
            if ask.get("report"):
                answer = _report(llm)
            else:
                prompts = _prompts(ask["lengths"], ask["seed"], vocab)
                p, d, n = _timed(llm, prompts, decode)
                answer = {"prefill_s": p, "decode_s": d, "decode_tokens": n}
            answers.write(json.dumps(answer) + "\n")
            answers.flush()


WORKER = "VLLM::Worker"  # the process title of vLLM's worker (a suffix per rank under TP)


def _cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise RuntimeError(f"/proc/{pid}/status has no Cpus_allowed_list")


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:  # field 4, after "(comm)"
            kids.append(int(entry.name))
    return kids


def model_cores(pid: int, worker: str = WORKER) -> str:
    """The cores the process that runs the model may use, as Linux lists them ("0", "0-3"): the
    first descendant of ``pid`` named ``worker`` (vLLM's worker when the engine core runs in
    its own process), else ``pid`` itself (the engine in-process)."""
    todo = [pid]
    while todo:
        for child in _children(todo.pop()):
            try:
                name = Path(f"/proc/{child}/comm").read_text().strip()
            except OSError:
                continue
            if name.startswith(worker):
                return _cpus_allowed(child)
            todo.append(child)
    return _cpus_allowed(pid)


class Side:
    """A running side: vLLM in its own process (vLLM picks its platform once per process), kept
    alive so that the driver can interleave its generations with the other side's."""

    def __init__(self, model: str, dtype: str, bridge: str | None, args: argparse.Namespace):
        self.name = f"plugin-api {bridge}" if bridge else "vllm"
        self.dtype = dtype
        kv = "" if args.kv_cache_dtype == "auto" else f" kv={args.kv_cache_dtype}"
        self.label = f"{self.name} {dtype}{kv}"
        print(f"... starting {self.label}", file=sys.stderr, flush=True)
        ask_r, ask_w = os.pipe()
        ans_r, ans_w = os.pipe()
        cmd = [sys.executable, "-m", "plugin_api_vllm.bench", "--serve", f"{ask_r},{ans_w}"]
        cmd += ["--model", model, "--dtype", dtype, "--kv-cache-dtype", args.kv_cache_dtype]
        cmd += ["--decode", str(args.decode)]
        # vLLM's log, shown if the side fails; the Side owns it (closed in close())
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        env = side_env(bridge, "4")
        # vLLM's own bf16 prefill on an AVX2-only CPU runs a 4096-token step for about 6 min, past
        # vLLM's 300 s step timeout (a Zen 3, 2026-12-07): both sides get the same longer one
        env.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            pass_fds=(ask_r, ans_w),
        )
        os.close(ask_r)
        os.close(ans_w)
        self.asks = os.fdopen(ask_w, "w")
        self.answers = os.fdopen(ans_r, "r")
        self.start_s = float(self._answer()["start_s"])
        self.cores = model_cores(self.proc.pid)  # vLLM bound its worker while starting

    def _answer(self) -> dict[str, Any]:
        line = self.answers.readline()
        if not line:
            self.proc.wait()
            self.log.seek(0)
            sys.stderr.write(self.log.read()[-6000:])
            raise SystemExit(f"{self.label} failed (exit {self.proc.returncode})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, **request: Any) -> dict[str, Any]:
        self.asks.write(json.dumps(request) + "\n")
        self.asks.flush()
        return self._answer()

    def __enter__(self) -> Side:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.asks.close()  # EOF: the side exits
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.answers.close()
        self.log.close()


def compare(sides: list[Side], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Time every side on the same prompts, interleaved: each repetition runs every side in
    turn, first side alternating (A B, B A, ...), so that a machine whose speed drifts during
    the run (a shared VM) slows both sides alike rather than whichever ran last. Each side after
    the first (vLLM's own) also gets its speed-up over the first per repetition ("paired"):
    the two runs of a repetition are neighbours in time, so their ratio drifts least."""
    runs: dict[str, dict[str, list[float]]] = {s.label: {} for s in sides}
    batches = QUICK_LENGTHS if args.quick else BATCH_LENGTHS
    seed = 1
    for batch, lengths in batches.items():
        for rep in range(args.reps):
            seed += 1
            for side in sides if rep % 2 == 0 else sides[::-1]:
                t = side.ask(lengths=lengths, seed=seed)
                got = runs[side.label]
                got.setdefault(f"{batch}/prefill", []).append(t["prefill_s"])
                got.setdefault(f"{batch}/decode", []).append(t["decode_s"] / t["decode_tokens"])
                print(
                    f"    {side.label} batch {batch}: prefill {t['prefill_s']:.2f} s, "
                    f"{t['decode_tokens']} decode tokens in {t['decode_s']:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    results = []
    for side in sides:
        got = runs[side.label]
        out: dict[str, Any] = {"side": side.name, "dtype": side.dtype, "label": side.label}
        out |= {"start_s": side.start_s, "model_cores": side.cores, "batches": {}}
        own = runs[sides[0].label]
        for batch, lengths in batches.items():
            p = statistics.median(got[f"{batch}/prefill"])
            per_token = statistics.median(got[f"{batch}/decode"])
            m = out["batches"][str(batch)] = {
                "prompt_tokens": sum(lengths),
                "prefill_s": p,
                "prefill_s_runs": got[f"{batch}/prefill"],
                "prefill_tok_s": sum(lengths) / p,
                "decode_step_s": per_token * batch,
                "decode_step_s_runs": [t * batch for t in got[f"{batch}/decode"]],
                "decode_tok_s": 1 / per_token,
            }
            if side is not sides[0]:
                m["paired"] = {
                    phase: [a / b for a, b in zip(own[key], got[key], strict=True)]
                    for phase, key in (
                        ("prefill", f"{batch}/prefill"),
                        ("decode", f"{batch}/decode"),
                    )
                }
        out |= side.ask(report=True)
        results.append(out)
    return results


def ceilings() -> dict[str, float]:
    """Copy bandwidth and the best matmul rate, measured now by this process's torch threads."""
    import torch

    from plugin_api.bench.ceilings import copy_buffer_bytes, measure_ceilings
    from plugin_api.bench.harness import QUICK, cpu_llc, synchronizer

    cpu = torch.device("cpu")
    c = measure_ceilings(
        cpu, copy_buffer_bytes(cpu_llc().bytes), QUICK, synchronizer(cpu), stop_after_s=0.3
    )
    rates = {"copy_GBps": c.bandwidth / 1e9, "matmul_TFLOPs": c.peak_flops / 1e12}
    return rates | {"threads": torch.get_num_threads()}


def cpu_set(cores: str) -> set[int]:
    """A CPU list as Linux writes it ("0-1,4") as the set of its cores."""
    out: set[int] = set()
    for part in cores.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def ceilings_on(cores: str) -> dict[str, float]:
    """``ceilings`` with this thread bound to ``cores`` and one torch thread per core: what a
    side's model process had (vLLM's worker runs one thread per core it is bound to)."""
    import torch

    chosen = cpu_set(cores)
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, chosen)
    torch.set_num_threads(len(chosen))
    try:
        return ceilings()
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


def _spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def table(sides: list[dict[str, Any]], ceil: dict[str, float], bounds: dict[str, int]) -> str:
    """One row per (side, dtype, batch), with ratios against vLLM's better dtype, and the
    paired speed-up over vLLM's own side of the same dtype (median [lowest-highest] of the
    per-repetition ratios)."""
    rows = [
        "| run | batch | prefill tok/s | decode tok/s | vs vLLM best (prefill / decode) "
        "| paired, same dtype (prefill / decode) |",
        "|---|---|---|---|---|---|",
    ]
    for batch in sorted({b for s in sides for b in s["batches"]}, key=int):
        own = [s["batches"][batch] for s in sides if s["side"] == "vllm"]
        best_p = max(o["prefill_tok_s"] for o in own)
        best_d = max(o["decode_tok_s"] for o in own)
        for s in sides:
            m = s["batches"][batch]
            paired = m.get("paired")
            pair = " / ".join(_spread(paired[k]) for k in ("prefill", "decode")) if paired else "-"
            rows.append(
                f"| {s['label']} | {batch} | {m['prefill_tok_s']:.1f} | "
                f"{m['decode_tok_s']:.2f} | {m['prefill_tok_s'] / best_p:.2f}x / "
                f"{m['decode_tok_s'] / best_d:.2f}x | {pair} |"
            )
    step_bytes, token_flop = bounds["decode_bytes_per_step"], bounds["prefill_flop_per_token"]
    lines = [
        *rows,
        "",
        f"ceilings of the whole machine ({ceil['threads']:.0f} threads): copy "
        f"{ceil['copy_GBps']:.1f} GB/s at the start, "
        f"{ceil.get('copy_GBps_end', float('nan')):.1f} at the end; matmul "
        f"{ceil['matmul_TFLOPs']:.2f} TFLOP/s",
    ]
    cores = {s["model_cores"] for s in sides if "model_cores" in s}
    model = ceil.get("model_copy_GBps")
    if len(cores) == 1 and model is not None:
        import torch

        from plugin_api.ops.checks import short_dtype

        # the bounds count bf16 bytes; an fp32 weight is twice that
        dtypes = [getattr(torch, d) for d in sorted({s["dtype"] for s in sides})]
        per_dtype = ", ".join(
            f"{short_dtype(d)} {model * 1e9 / (step_bytes * d.itemsize / 2):.1f}" for d in dtypes
        )
        lines.append(
            f"ceilings on the cores both sides' model processes had ({cores.pop()}, "
            f"{ceil['model_threads']:.0f} thread(s)): copy {model:.1f} GB/s -> decode "
            f"at most {per_dtype} steps/s; matmul "
            f"{ceil['model_matmul_TFLOPs']:.2f} TFLOP/s -> prefill at most "
            f"{ceil['model_matmul_TFLOPs'] * 1e12 / token_flop:.0f} tok/s"
        )
    elif cores:
        each = "; ".join(f"{s['label']}: {s['model_cores']}" for s in sides)
        lines.append(f"the sides' model processes had different cores: {each}")
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
    ap.add_argument("--serve", help=argparse.SUPPRESS)  # one side, in this process (see Side)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.model, args.dtype, args.kv_cache_dtype, args.decode, args.serve)
        return 0
    bridge = os.environ.get("PLUGIN_API_BACKEND", "auto")
    model = args.model or str(cached("bench-0.49b", "llama", BENCH_SHAPE))
    counts = weight_counts(model)
    bounds = minimum_work(counts)
    ceil = ceilings()
    sides = []
    for dtype in args.dtypes.split(","):
        with Side(model, dtype, None, args) as own, Side(model, dtype, bridge, args) as ours:
            sides += compare([own, ours], args)
    ceil["copy_GBps_end"] = ceilings()["copy_GBps"]
    cores = {s["model_cores"] for s in sides}
    if len(cores) == 1:  # the bounds for the sides: their cores, one thread each
        ceil |= {f"model_{k}": v for k, v in ceilings_on(cores.pop()).items()}
    print(table(sides, ceil, bounds))
    if args.json:
        data = {"model": model, "params": counts["total"], "weights": counts, "bounds": bounds}
        data |= {"ceilings": ceil, "sides": sides}
        Path(args.json).write_text(json.dumps(data, indent=1))
    return 0


def weight_counts(model: str) -> dict[str, int]:
    """Parameters of the checkpoint: all of them, the embedding's and the LM head's (0 where the
    head is the embedding, tied)."""
    from safetensors import safe_open

    counts = {"total": 0, "embedding": 0, "lm_head": 0}
    for f in Path(model).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():  # noqa: SIM118 (safe_open is not iterable)
                n = 1
                for d in st.get_slice(k).get_shape():
                    n *= d
                counts["total"] += n
                if k.endswith("embed_tokens.weight"):
                    counts["embedding"] += n
                elif k.endswith("lm_head.weight"):
                    counts["lm_head"] += n
    return counts


def minimum_work(counts: dict[str, int]) -> dict[str, int]:
    """What bounds each phase: the bf16 bytes a decode step must read (every weight but the
    embedding's rows, which a step only gathers, unless the embedding is also the head) and the
    FLOP a prompt token needs at least (2 per weight it multiplies: not the embedding's, not the
    head's, which runs once per sequence; attention adds to it)."""
    head = counts["lm_head"]
    read = counts["total"] - (counts["embedding"] if head else 0)
    return {
        "decode_bytes_per_step": 2 * read,
        "prefill_flop_per_token": 2 * (counts["total"] - counts["embedding"] - head),
    }


if __name__ == "__main__":
    raise SystemExit(main())

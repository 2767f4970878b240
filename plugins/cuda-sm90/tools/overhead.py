"""Where the host time of one eager decode step goes, beside the same step replayed as a graph.

Issue 34 asks for an eager decode step (one layer's ``Attention.run``: the host's checks, the
K/V write, the attention) to take at most 80 us of host time at batch 16 x 8k and 60 us at
batch 1 x 1k. This prints, per shape: the wall time of an eager step (synchronised), the host
time to enqueue one (no sync) against that target, a graph replay, the host time of each part
of the step with its share, and the plan's (once per step, shared by a model's layers, so
outside the step figure); then a cProfile of eager steps (the functions with the most
cumulative time), so the cost can be pinned to this plugin, the host package or FlashInfer.

The parts are timed one at a time, each called on its own in a loop:

- K/V write: the implementation's ``write_kv`` (one launch of the host's Triton kernel);
- decode call arguments: ``calls.decode_call`` (per layer, after the step's first);
- FlashInfer call: ``Call.invoke`` of that call (FlashInfer's Python wrapper and the launch);
- rest of the plugin's forward: ``forward`` less the two above;
- host's ``Attention.run``: the step less ``write_kv`` and ``forward`` (argument checks, output
  bookkeeping, provenance).

Run by gpu_check.sh (stage ``overhead``); prints text only. Timings are medians of 5 trials.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable

import torch
from targets import DecodeStep, decode_parts

from plugin_api.backend import backend_for
from plugin_api.gpu.device_graphs import capture
from plugin_api_cuda_sm90 import calls
from plugin_api_cuda_sm90.metadata import FlashInferPlan
from plugin_api_cuda_sm90.rules import ARCH_OF_MAJOR

# issue 34, "Must show": eager decode step host time, us, per (batch, context)
TARGET_US = {(1, 1024): 60.0, (16, 8192): 80.0}
TRIALS = 5


def wall_us(fn: Callable[[], object], reps: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def enqueue_us(fn: Callable[[], object], reps: int = 100) -> float:
    """Host time per call with no synchronisation in between (the GPU may lag behind): the
    median over ``TRIALS`` loops of ``reps`` calls, each loop started on an idle GPU."""
    for _ in range(10):
        fn()
    trials = []
    for _ in range(TRIALS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        trials.append((time.perf_counter() - t0) / reps * 1e6)
    torch.cuda.synchronize()
    return statistics.median(trials)


def profile(fn: Callable[[], object], reps: int = 100, top: int = 35) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def part_times(step: DecodeStep) -> dict[str, float]:
    """Host us per call of each part of ``step``, and of a re-plan (see the module docstring)."""
    attn, p = step.attn, step.plan
    impl, spec, plan = attn.impl, attn.spec, p.impl_plan
    assert isinstance(plan, FlashInferPlan), f"not a cuda-sm90 plan: {type(plan).__name__}"
    arch = ARCH_OF_MAJOR[torch.cuda.get_device_capability(step.query.device)[0]]
    ws = plan.decode_workspace
    assert ws is not None, "a decode plan made by the implementation has its workspace"

    def write() -> None:
        impl.write_kv(spec, step.key, step.value, step.cache, plan)

    def forward() -> None:
        impl.forward(spec, step.query, step.cache, plan, None, step.out)

    def build() -> calls.Call:
        return calls.decode_call(spec, arch, plan, step.query, step.cache, None, step.out, ws)

    def replan() -> None:
        attn.plan(step.batch, reuse=p)

    call = build()
    t = {
        "step": enqueue_us(step.run),
        "write": enqueue_us(write),
        "forward": enqueue_us(forward),
        "build": enqueue_us(build),
        "flashinfer": enqueue_us(call.invoke),
        "plan": enqueue_us(replan),
    }
    t["forward_rest"] = t["forward"] - t["build"] - t["flashinfer"]
    t["host_run"] = t["step"] - t["write"] - t["forward"]
    return t


PARTS = (
    ("write", "K/V write (Triton cache_write, one launch)"),
    ("build", "decode call arguments (calls.decode_call)"),
    ("flashinfer", "FlashInfer call (Python wrapper + launch)"),
    ("forward_rest", "rest of the plugin's forward"),
    ("host_run", "host's Attention.run (checks, bookkeeping)"),
)


def report(batch: int, context: int, step: DecodeStep) -> str:
    graph = capture(step.run, "cuda")
    t = part_times(step)
    target = TARGET_US[(batch, context)]
    verdict = "met" if t["step"] <= target else "MISSED"
    lines = [
        f"decode batch={batch} context={context}: eager {wall_us(step.run):.1f} us, "
        f"enqueue {t['step']:.1f} us/step, graph replay {wall_us(graph.replay):.1f} us",
        f"  eager decode step host time: {t['step']:.1f} us "
        f"(issue 34 target <= {target:.0f} us: {verdict})",
        "  host time by part (us per call, share of the step's host time):",
    ]
    for key, label in PARTS:
        lines.append(f"    {label:<46} {t[key]:7.1f}  {t[key] / t['step']:5.0%}")
    lines.append(
        f"  plan (once per step, shared by the layers; not in the step figure): {t['plan']:.1f} us"
    )
    return "\n".join(lines)


def main() -> int:
    backend = backend_for("cuda-sm90")
    print(f"{torch.cuda.get_device_name()}: host time of eager decode steps (issue 34)")
    for batch, context in TARGET_US:
        print(report(batch, context, decode_parts(backend, batch, context)))
    run = decode_parts(backend, 1, 1024).run
    run()
    print(profile(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where the host time of one eager decode step goes, beside the same step replayed as a graph.

The first H200 bench timed eager decode steps at 220-390 us where the captured step of
``targets.py`` took 209 us at batch 16 x 8k: the eager path spends ~200 us on the host. This
prints, per shape: the wall time of an eager step (synchronised), the host time to enqueue one
(no sync), a graph replay, and a cProfile of eager steps (the functions with the most
cumulative time), so the cost can be pinned to this plugin, the host package or FlashInfer.

Run by gpu_check.sh (stage ``overhead``); prints text only.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable

import torch
from targets import decode_setup

from plugin_api.backend import backend_for
from plugin_api.gpu.device_graphs import capture


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


def enqueue_us(fn: Callable[[], object], reps: int = 200) -> float:
    """Host time per call with no synchronisation in between (the GPU may lag behind)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


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


def main() -> int:
    backend = backend_for("cuda-sm90")
    for batch, context in ((1, 1024), (16, 8192)):
        run = decode_setup(backend, batch, context)
        graph = capture(run, "cuda")
        print(
            f"decode batch={batch} context={context}: eager {wall_us(run):.1f} us, "
            f"enqueue {enqueue_us(run):.1f} us/step, graph replay {wall_us(graph.replay):.1f} us"
        )
    run = decode_setup(backend, 1, 1024)
    run()
    print(profile(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One benchmark run: ceilings first, then every case and its baselines, on one backend.

Per callable: one first call (for the backend's op it records the provenance: which
implementation ran), ``Method.warmup`` more untimed calls (none when the first call took longer
than ``Method.cap_s``), then timed samples (harness.py).
Memory-bound cases run with cold caches unless ``hot``; compute-bound ones always run hot.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import TextIO

import torch

from ..backend import Backend
from ..contract.provenance import record_kernels, record_ops
from ..errors import FallbackRefused, UnsupportedSpec
from . import harness, lm_head_argmax, plan_cost, state_manager
from .baselines import Baseline
from .cases import Case, Family, select
from .ceilings import Ceilings, copy_buffer_bytes, measure_bandwidth, measure_ceilings
from .harness import Evictor, Method, measure
from .machine import describe_machine
from .report import progress_line
from .results import BenchRun, CaseResult, Mode, Timed
from .workloads import Context, setup


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def first_call(fn: Callable[[], object], method: Method, sync: Callable[[], None]) -> Method:
    """Run ``fn`` once (untimed in the statistics) and return the method for the rest: a call
    that takes longer than ``cap_s`` gets no further warm-up (one more such call teaches
    nothing and costs minutes)."""
    t0 = time.perf_counter()
    fn()
    sync()
    slow = time.perf_counter() - t0 >= method.cap_s
    return replace(method, warmup=0) if slow else method


def time_baselines(
    wl_baselines: tuple[Baseline, ...],
    method: Method,
    sync: Callable[[], None],
    evict: Callable[[], None] | None,
) -> tuple[Timed, ...]:
    timed = []
    for b in wl_baselines:
        try:
            rest = first_call(b.fn, method, sync)
            stats = measure(b.fn, rest, sync=sync, evict=evict)
        except Exception as e:  # a baseline torch cannot run here is reported, not fatal
            timed.append(Timed(b.name, b.description, None, _error(e)))
        else:
            timed.append(Timed(b.name, b.description, stats))
    return tuple(timed)


def run_case(
    case: Case,
    ctx: Context,
    method: Method,
    ceilings: Ceilings,
    *,
    hot: bool,
    evictor: Evictor,
    sync: Callable[[], None],
) -> CaseResult:
    bound = ceilings.classify(case.flops(), case.nbytes())
    mode: Mode = "hot" if hot or bound == "compute" else "cold"
    evict = evictor if mode == "cold" else None
    t0 = time.perf_counter()
    try:
        wl = setup(case, ctx)
        with record_ops() as calls, record_kernels() as kernels:
            rest = first_call(wl.run, method, sync)
        stats = measure(wl.run, rest, sync=sync, evict=evict)
    except (UnsupportedSpec, FallbackRefused) as e:
        return CaseResult(case, "unsupported", bound, mode, message=_error(e))
    except Exception as e:  # one case failing must not hide the others; it is reported
        return CaseResult(case, "error", bound, mode, message=_error(e))
    provenance = tuple(dict.fromkeys(calls))
    timed = time_baselines(wl.baselines, method, sync, evict)
    wall = time.perf_counter() - t0
    return CaseResult(
        case, "ok", bound, mode, stats, provenance, timed, wall_s=wall,
        kernels=tuple(dict.fromkeys(kernels)),
    )  # fmt: skip


def run_bench(
    backend: Backend,
    families: tuple[Family, ...],
    *,
    quick: bool,
    hot: bool = False,
    cases: tuple[Case, ...] | None = None,
    method: Method | None = None,
    ceilings: Ceilings | None = None,
    progress: TextIO | None = sys.stderr,
    command: str = "",
) -> BenchRun:
    """Measure the ceilings (unless given), then ``cases`` (default: the named cases of
    ``families``) with their baselines."""

    def say(text: str) -> None:
        if progress is not None:
            progress.write(text + "\n")
            progress.flush()

    t_start = time.perf_counter()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    device = torch.device(backend.device_type)
    method = method or (harness.QUICK if quick else harness.FULL)
    sync = harness.synchronizer(device)
    llc = harness.device_llc(device)
    evictor = Evictor(harness.eviction_bytes(llc), device)
    say(f"bench: backend {backend.id} on {device}, {torch.get_num_threads()} threads")
    at_least_one = replace(method, warmup=max(1, method.warmup))  # warm-up for the ceilings
    measured_here = ceilings is None
    if ceilings is None:
        say("measuring ceilings (copy bandwidth, matmul rate) ...")
        ceilings = measure_ceilings(
            device,
            copy_buffer_bytes(llc.bytes),
            at_least_one,
            sync,
            stop_after_s=0.1 if quick else 1.0,
        )
    say("  " + ceilings.describe())
    todo = cases if cases is not None else select(families, quick)
    ctx = Context(backend, device)
    results = []
    family = None
    for i, case in enumerate(todo, 1):
        if case.family != family:
            ctx.fixtures.clear()  # large weights of the previous family go first
            family = case.family
        say(f"[{i}/{len(todo)}] {case.family} {case.name} ...")
        r = run_case(case, ctx, method, ceilings, hot=hot, evictor=evictor, sync=sync)
        results.append(r)
        say("    " + progress_line(r, ceilings))
    ctx.fixtures.clear()
    plans: tuple[plan_cost.PlanCost, ...] = ()
    if plan_cost.measured_steps(results):
        say("attention plan per step: Attention.plan and the slot-mapping check ...")
        plans = plan_cost.measure(backend, results, method, sync, ctx)
    if measured_here and any(r.bound == "memory" for r in results):
        say("measuring the copy bandwidth again (the ceiling is the better of the two) ...")
        copy_bytes = copy_buffer_bytes(llc.bytes)
        bandwidth, _, _ = measure_bandwidth(device, copy_bytes, at_least_one, sync)
        ceilings = ceilings.rechecked(bandwidth)
        say(f"  copy {bandwidth / 1e9:.2f} GB/s (moved {100 * ceilings.copy_drift:.0f}%)")
    manager = None
    if "state" in families and cases is None:
        say("state manager: cost per step at 4k and 480k tokens of context ...")
        manager = state_manager.measure(quick=quick)
    argmax = None
    if "gemm" in families and (
        cases is None or any(getattr(c, "usage", None) == "lm_head" for c in todo)
    ):
        say("LM-head argmax: bf16-out vs fp32-out ...")
        argmax = lm_head_argmax.measure(backend, quick=quick)
    return BenchRun(
        backend=backend.id,
        device=str(device),
        quick=quick,
        hot=hot,
        method=method,
        llc=llc,
        eviction_bytes=evictor.nbytes,
        ceilings=ceilings,
        machine=describe_machine(backend),
        results=tuple(results),
        started=started,
        wall_s=time.perf_counter() - t_start,
        command=command,
        state_manager=manager,
        lm_head_argmax=argmax,
        attention_plan=plans,
    )

"""What ``Attention.plan`` costs per step, beside the decode step it serves.

For each decode and speculative-decode case the run measured, on the same batch:

- ``Attention.plan(batch)`` end to end: the host's checks plus the implementation's plan, with
  the slot-mapping check as this process's settings have it (``PLUGIN_API_CHECK_SLOT_MAPPING``,
  ``PLUGIN_API_STRICT``);
- the host's checks alone, without and with the slot-mapping check
  (``validate_batch(..., check_slots=False/True)``): the check's cost is the difference.

The three are timed in interleaved rounds (one call of each per round, so a busy moment slows
them alike); medians after warm-up rounds. The step is the case's own median from the same run:
one layer's ``run``. A step runs ``plan`` once for every layer, so this is the most the plan
can weigh; the budget is issue 32's: the larger of 0.1 ms and 5% of the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..backend import Backend
from ..ops.attention import attention, validate_batch
from .cases import AttentionCase
from .harness import Method, Stats, summarize
from .workloads import Context, attention_batch, attention_spec

if TYPE_CHECKING:
    from .results import CaseResult  # which holds this module's PlanCost

KINDS = ("decode", "spec-decode")
WARMUP_ROUNDS = 20
MAX_ROUNDS = 5000  # calls of microseconds: many samples fit in the method's time
BUDGET_FLOOR_S = 1e-4
BUDGET_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class PlanCost:
    case: str
    impl: str
    slot_check_in_plan: bool  # whether this Attention's plan() runs the slot-mapping check
    plan: Stats
    checks: Stats  # validate_batch without the slot-mapping check
    checks_with_slots: Stats  # and with it
    step_s: float  # the case's median: one layer's run on this batch

    @property
    def slot_check_s(self) -> float:
        """The slot-mapping check's cost: the difference of the two medians."""
        return self.checks_with_slots.median - self.checks.median

    @property
    def budget_s(self) -> float:
        return max(BUDGET_FLOOR_S, BUDGET_SHARE * self.step_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "impl": self.impl,
            "slot_check_in_plan": self.slot_check_in_plan,
            "plan_s": self.plan.median,
            "plan_p10_s": self.plan.p10,
            "plan_p90_s": self.plan.p90,
            "checks_s": self.checks.median,
            "checks_with_slot_check_s": self.checks_with_slots.median,
            "slot_check_s": self.slot_check_s,
            "rounds": self.plan.n,
            "step_s": self.step_s,
            "plan_fraction_of_step": self.plan.median / self.step_s,
            "slot_check_fraction_of_step": self.slot_check_s / self.step_s,
            "plan_budget_s": self.budget_s,
        }


def interleaved(
    fns: Sequence[Callable[[], object]], method: Method, sync: Callable[[], None]
) -> tuple[Stats, ...]:
    """Per-call statistics of ``fns``, called in turn once per round, after warm-up rounds,
    until the rounds add up to ``method.target_s`` (at least ``method.min_samples`` rounds, at
    most ``MAX_ROUNDS``, stopping at ``method.cap_s``)."""
    clock = time.perf_counter
    for _ in range(WARMUP_ROUNDS if method.warmup else 1):
        for fn in fns:
            fn()
    sync()
    samples: list[list[float]] = [[] for _ in fns]
    spent, start = 0.0, clock()
    while True:
        for fn, out in zip(fns, samples, strict=True):
            t0 = clock()
            fn()
            sync()
            out.append(clock() - t0)
            spent += out[-1]
        rounds = len(samples[0])
        if rounds >= MAX_ROUNDS or clock() - start >= method.cap_s:
            break
        if rounds >= method.min_samples and spent >= method.target_s:
            break
    return tuple(summarize(s) for s in samples)


def measured_steps(results: Sequence[CaseResult]) -> list[tuple[AttentionCase, float]]:
    """The decode cases that ran, with their medians."""
    return [
        (r.case, r.stats.median)
        for r in results
        if isinstance(r.case, AttentionCase) and r.case.kind in KINDS and r.stats is not None
    ]


def measure_case(
    case: AttentionCase,
    step_s: float,
    backend: Backend,
    method: Method,
    sync: Callable[[], None],
    ctx: Context,
) -> PlanCost:
    spec = attention_spec(case)
    op = attention(spec, backend)
    batch, _ = attention_batch(case, ctx)
    plan, checks, checked = interleaved(
        (
            lambda: op.plan(batch),
            lambda: validate_batch(spec, batch, check_slots=False),
            lambda: validate_batch(spec, batch, check_slots=True),
        ),
        method,
        sync,
    )
    impl = str(getattr(op.impl, "name", type(op.impl).__name__))
    return PlanCost(case.name, impl, op.checks_slot_mapping, plan, checks, checked, step_s)


def measure(
    backend: Backend,
    results: Sequence[CaseResult],
    method: Method,
    sync: Callable[[], None],
    ctx: Context,
) -> tuple[PlanCost, ...]:
    return tuple(
        measure_case(case, step, backend, method, sync, ctx)
        for case, step in measured_steps(results)
    )


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def lines(entries: Sequence[dict[str, Any]]) -> list[str]:
    if not entries:
        return []
    on = {e["slot_check_in_plan"] for e in entries}
    where = "on" if on == {True} else "off" if on == {False} else "on and off"
    out = [
        f"attention plan per step (Attention.plan = host checks + {entries[0]['impl']} plan, "
        f"slot-mapping check {where} in it; step = the case's run, one layer):"
    ]
    for e in entries:
        step = e["step_s"]
        verdict = "within" if e["plan_s"] <= e["plan_budget_s"] else "over"
        out.append(
            f"  {e['case']}: plan {_us(e['plan_s'])} = {100 * e['plan_fraction_of_step']:.1f}% "
            f"of the {_us(step)} step ({verdict} the {_us(e['plan_budget_s'])} budget); "
            f"checks {_us(e['checks_s'])}, slot-mapping check +{_us(e['slot_check_s'])} = "
            f"{100 * e['slot_check_fraction_of_step']:.1f}% of the step"
        )
    return out

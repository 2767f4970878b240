"""What a benchmark run produced: per case its status, statistics, provenance and baselines.

Plain data: ``run`` fills it in, ``report`` renders it; neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..contract.provenance import Provenance
from .cases import Case
from .ceilings import Bound, Ceilings
from .harness import CacheSize, Method, Stats
from .lm_head_argmax import ArgmaxFlips
from .plan_cost import PlanCost
from .state_manager import ManagerCost

Status = Literal["ok", "unsupported", "error"]
Mode = Literal["cold", "hot"]


@dataclass(frozen=True, slots=True)
class Timed:
    """A baseline's measurement (or why it has none)."""

    name: str
    description: str
    stats: Stats | None
    error: str = ""


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: Case
    status: Status
    bound: Bound
    mode: Mode
    stats: Stats | None = None
    provenance: tuple[Provenance, ...] = ()
    baselines: tuple[Timed, ...] = ()
    message: str = ""
    wall_s: float = 0.0  # setup and every call of the backend and its baselines
    kernels: tuple[str, ...] = ()  # library kernels the implementations named (note_kernel)


@dataclass(frozen=True, slots=True)
class BenchRun:
    backend: str
    device: str
    quick: bool
    hot: bool
    method: Method
    llc: CacheSize
    eviction_bytes: int
    ceilings: Ceilings
    machine: dict[str, Any]
    results: tuple[CaseResult, ...]
    started: str
    wall_s: float
    command: str = ""
    state_manager: ManagerCost | None = None
    lm_head_argmax: ArgmaxFlips | None = None
    attention_plan: tuple[PlanCost, ...] = ()

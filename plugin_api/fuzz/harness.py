"""The fuzzing loop: hypothesis draws cases, a pool of worker processes runs them.

A worker that dies (a signal, an abnormal exit) is a *crash*; one that does not answer within
the per-example time limit is killed and counted as a *hang*; either way a fresh worker takes
its place and fuzzing goes on. Outcomes are counted per op (the call that decided the case:
the one that raised, or the last) and every finding is kept with its reproducer, the case's
JSON, which ``--replay`` runs again.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import re
import signal
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from .worker import (
    ACCEPTED,
    CLEAN,
    HARNESS,
    OOB_WRITE,
    UNCLEAN,
    WRITE_ON_REJECT,
    serve,
)

CRASH = "crashes"
HANG = "hangs"
COUNTS = (ACCEPTED, CLEAN, UNCLEAN, CRASH, HANG, WRITE_ON_REJECT, OOB_WRITE, HARNESS)
# what makes a run fail; unclean errors too unless allowed
FAILING = (CRASH, HANG, WRITE_ON_REJECT, OOB_WRITE, HARNESS)
STARTUP_TIMEOUT = 900.0  # loading a backend may build its extensions


class FuzzError(Exception):
    """The fuzzer itself cannot run (the backend does not load in a worker, say)."""


@dataclass
class Finding:
    kind: str  # one of COUNTS other than accepted and clean errors
    op: str
    error: str
    message: str
    description: str
    case: dict[str, Any]
    example: int
    count: int = 1
    detail: str = ""

    def key(self) -> tuple[str, str, str, str]:
        return (self.kind, self.op, self.error, re.sub(r"\d+", "N", self.message)[:160])

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "op": self.op,
            "error": self.error,
            "message": self.message,
            "count": self.count,
            "example": self.example,
            "description": self.description,
            "detail": self.detail,
            "case": self.case,
        }


@dataclass
class Report:
    backend: str
    seed: int
    ops: dict[str, dict[str, int]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    allow_unclean: bool = False

    def count(self, op: str, outcome: str) -> None:
        row = self.ops.setdefault(op, {"tried": 0, **dict.fromkeys(COUNTS, 0)})
        row["tried"] += 1
        row[outcome] += 1

    def add(self, finding: Finding) -> None:
        for f in self.findings:
            if f.key() == finding.key():
                f.count += 1
                return
        self.findings.append(finding)

    @property
    def totals(self) -> dict[str, int]:
        keys = ("tried", *COUNTS)
        return {k: sum(row[k] for row in self.ops.values()) for k in keys}

    @property
    def ok(self) -> bool:
        t = self.totals
        failing = FAILING if self.allow_unclean else (*FAILING, UNCLEAN)
        return not any(t[k] for k in failing)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "seed": self.seed,
            "seconds": round(self.seconds, 1),
            "ok": self.ok,
            "totals": self.totals,
            "ops": self.ops,
            "findings": [f.to_dict() for f in self.findings],
        }

    def text(self) -> str:
        cols = ("tried", *COUNTS)
        heads = ("op", *(c.replace("_", " ") for c in cols))
        rows = [(op, *(str(r[c]) for c in cols)) for op, r in sorted(self.ops.items())]
        rows.append(("total", *(str(self.totals[c]) for c in cols)))
        widths = [max(len(r[i]) for r in [heads, *rows]) for i in range(len(heads))]
        lines = [
            f"fuzz {self.backend}: seed {self.seed}, {self.totals['tried']} examples in "
            f"{self.seconds:.1f} s"
        ]
        for r in [heads, *rows]:
            lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
        for i, f in enumerate(self.findings, 1):
            lines += [
                "",
                f"finding {i}: {f.kind.replace('_', ' ')} in {f.op} ({f.count}x, first at "
                f"example {f.example}): {f.error}: {f.message}",
            ]
            if f.detail:
                lines.append("  " + f.detail.replace("\n", "\n  "))
            lines.append("  inputs: " + f.description.replace("\n", "\n  "))
            lines.append(
                f"  replay: python -m plugin_api.fuzz --backend {self.backend} --replay "
                f"'{json.dumps(f.case)}'"
            )
        lines.append("")
        lines.append("ok" if self.ok else "FAILED: see the findings above")
        return "\n".join(lines)


class Worker:
    """One worker process and the case it is running."""

    def __init__(self, backend: str, log_dir: Path, number: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.log = log_dir / f"worker-{number}.log"
        parent, child = ctx.Pipe()
        self.conn: Connection = parent
        self.proc = ctx.Process(target=serve, args=(child, backend, str(self.log)), daemon=True)
        self.proc.start()
        child.close()
        self.backend = backend
        self.case: dict[str, Any] | None = None
        self.example = -1
        self.sent = 0.0
        self.description = ""
        self.op = ""
        self.log_at = 0

    def wait_ready(self) -> Worker:
        """Block until the worker has loaded the backend; raise ``FuzzError`` if it cannot."""
        backend = self.backend
        if not self.conn.poll(STARTUP_TIMEOUT):
            self.kill()
            raise FuzzError(f"a worker for {backend!r} did not start in {STARTUP_TIMEOUT:.0f} s")
        try:
            kind, info = self.conn.recv()
        except EOFError as e:
            raise FuzzError(f"a worker for {backend!r} died while starting:\n{self.tail(0)}") from e
        if kind != "ready":
            self.kill()
            raise FuzzError(f"backend {backend!r} does not load in a worker:\n{info}")
        return self

    def send(self, case: dict[str, Any], example: int) -> None:
        self.case, self.example, self.sent = case, example, time.monotonic()
        self.description, self.op = "(not built yet)", str(case.get("kind"))
        self.log_at = self.log.stat().st_size if self.log.exists() else 0
        self.conn.send(case)

    def tail(self, start: int, limit: int = 2500) -> str:
        try:
            text = self.log.read_bytes()[start:].decode(errors="replace")
        except OSError:
            return ""
        return text[-limit:].strip()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(5)
        self.kill()


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class Pool:
    """``jobs`` workers; ``submit`` blocks while all are busy."""

    def __init__(self, backend: str, jobs: int, timeout: float, report: Report) -> None:
        self.backend, self.timeout, self.report = backend, timeout, report
        self._dir = tempfile.TemporaryDirectory(prefix="plugin-api-fuzz-")
        self.log_dir = Path(self._dir.name)
        self.started = 0
        self.idle: list[Worker] = []
        self.busy: list[Worker] = []
        starting = [self._spawn() for _ in range(jobs)]  # they load the backend in parallel
        try:
            self.idle = [w.wait_ready() for w in starting]
        except FuzzError:
            for w in starting:
                w.kill()
            self._dir.cleanup()
            raise

    def _spawn(self) -> Worker:
        self.started += 1
        return Worker(self.backend, self.log_dir, self.started)

    def _start(self) -> Worker:
        return self._spawn().wait_ready()

    def submit(self, case: dict[str, Any], example: int) -> None:
        while not self.idle:
            self._collect()
        w = self.idle.pop()
        w.send(case, example)
        self.busy.append(w)

    def drain(self) -> None:
        while self.busy:
            self._collect()

    def close(self) -> None:
        for w in self.idle + self.busy:
            w.stop()
        self.idle, self.busy = [], []
        self._dir.cleanup()

    def _collect(self) -> None:
        """Wait for one message from a busy worker (or a time limit), and act on it."""
        now = time.monotonic()
        next_limit = min(w.sent + self.timeout for w in self.busy)
        ready = wait([w.conn for w in self.busy], timeout=max(0.0, next_limit - now))
        for w in list(self.busy):
            if w.conn in ready:
                try:
                    kind, payload = w.conn.recv()
                except (EOFError, OSError):
                    w.proc.join(10)
                    self._lost(w, CRASH, _exit_text(w.proc.exitcode))
                    continue
                if kind == "start":
                    w.description = payload
                elif kind == "step":
                    w.op = payload
                elif kind == "done":
                    self._done(w, payload)
            elif time.monotonic() - w.sent > self.timeout:
                w.kill()
                self._lost(w, HANG, f"no answer in {self.timeout:.0f} s; killed")

    def _done(self, w: Worker, result: dict[str, Any]) -> None:
        assert w.case is not None
        outcome = result["outcome"]
        self.report.count(result["op"], outcome)
        if outcome not in (ACCEPTED, CLEAN):
            detail = []
            if result.get("written"):
                detail.append("changed: " + " | ".join(result["written"]))
            if result.get("where"):
                detail.append(result["where"])
            self.report.add(
                Finding(
                    outcome,
                    result["op"],
                    result.get("error", ""),
                    result.get("message", ""),
                    w.description,
                    w.case,
                    w.example,
                    detail="\n".join(detail),
                )
            )
        w.case = None
        self.busy.remove(w)
        self.idle.append(w)

    def _lost(self, w: Worker, kind: str, why: str) -> None:
        """``w`` died or hung on its case: count it, and start a fresh worker."""
        assert w.case is not None
        self.report.count(w.op, kind)
        self.report.add(
            Finding(kind, w.op, "", why, w.description, w.case, w.example, detail=w.tail(w.log_at))
        )
        w.kill()
        self.busy.remove(w)
        self.idle.append(self._start())


class _TimeUp(BaseException):
    """Ends hypothesis's loop when ``seconds`` have passed (not an Exception: never a failure)."""


def fuzz(
    backend: str,
    *,
    ops: Iterable[str] | None = None,
    examples: int = 200,
    seconds: float | None = None,
    seed: int = 0,
    jobs: int = 1,
    timeout: float = 60.0,
    allow_unclean: bool = False,
) -> Report:
    """Fuzz every public op of ``backend`` (or those in ``ops``) with up to ``examples`` cases,
    stopping after ``seconds``; deterministic for a ``seed`` (up to the time limit)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    from .strategies import KINDS, case

    kinds = tuple(ops) if ops else KINDS
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise FuzzError(f"unknown op(s) {unknown}; choose from {list(KINDS)}")
    report = Report(backend, seed, allow_unclean=allow_unclean)
    start = time.monotonic()
    pool = Pool(backend, jobs, timeout, report)
    counter = iter(range(1 << 62))

    def run_kind(kind: str, budget: int, until: float | None) -> None:
        @with_seed(seed)
        @settings(
            max_examples=budget,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case(kind))
        def one(c: dict[str, Any]) -> None:
            if until is not None and time.monotonic() > until:
                raise _TimeUp
            pool.submit(c, next(counter))

        with contextlib.suppress(_TimeUp):
            one()

    # each op gets its share of the examples and of the time (what one leaves passes on)
    try:
        begun = time.monotonic()
        for i, kind in enumerate(kinds):
            budget = examples // len(kinds) + (i < examples % len(kinds))
            until = None
            if seconds is not None:
                left = seconds - (time.monotonic() - begun)
                until = time.monotonic() + left / (len(kinds) - i)
            if budget:
                run_kind(kind, budget, until)
        pool.drain()
    finally:
        pool.close()
    report.seconds = time.monotonic() - start
    return report


def replay(backend: str, case: dict[str, Any], timeout: float = 60.0) -> Report:
    """Run one case (a finding's reproducer) in a worker, as ``fuzz`` would."""
    report = Report(backend, int(case.get("seed", 0)))
    start = time.monotonic()
    pool = Pool(backend, 1, timeout, report)
    try:
        pool.submit(case, 0)
        pool.drain()
    finally:
        pool.close()
    report.seconds = time.monotonic() - start
    return report

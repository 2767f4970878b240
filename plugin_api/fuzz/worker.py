"""The worker process: build each case, make its calls, and classify what happened.

A worker loads the backend once and then serves cases from its pipe. Before every call it copies
the bytes of every buffer the caller's tensors live in (guard bytes included, ``build.py``); if
the call raises, any changed byte is a *write on a rejected call*; if it succeeds, a changed
byte outside the arguments the call may write is an *out-of-bounds write*. A kernel that kills
the process never answers: the parent (``harness.py``) counts that as a crash.

Messages to the parent: ``("ready", info)`` or ``("fail", text)`` once, then per case
``("start", description)``, ``("step", op)`` before each call and ``("done", result)``.
"""

from __future__ import annotations

import faulthandler
import os
import re
import sys
import traceback
import warnings
from typing import Any

import torch

from ..errors import ImplementationError, PluginApiError
from .build import Built, build

CLEAN_TYPES = (PluginApiError, ValueError, TypeError)

# outcomes (the keys of the per-op counts)
ACCEPTED = "accepted"
CLEAN = "clean_errors"
UNCLEAN = "unclean_errors"
WRITE_ON_REJECT = "writes_on_reject"
OOB_WRITE = "oob_writes"
HARNESS = "harness_errors"


def names_an_argument(message: str, names: tuple[str, ...]) -> bool:
    return any(re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", message) for n in names)


def classify(exc: BaseException, names: tuple[str, ...]) -> str:
    """A clean error is one the op raises on purpose about its input: a ``PluginApiError``,
    ``ValueError`` or ``TypeError`` whose message names an argument of the call.
    ``ImplementationError`` is a plugin breaking the contract, never clean."""
    if isinstance(exc, ImplementationError):
        return UNCLEAN
    if isinstance(exc, CLEAN_TYPES) and names_an_argument(str(exc), names):
        return CLEAN
    return UNCLEAN


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The whole buffer ``t`` lives in, as bytes."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _covered(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A bool mask over the bytes of ``t``'s buffer: those its elements occupy."""
    mask = torch.zeros(nbytes, dtype=torch.bool)
    if not t.numel():
        return mask
    es = t.element_size()
    elems = torch.arange(nbytes // es)
    idx = torch.as_strided(elems, tuple(t.shape), t.stride(), t.storage_offset()).reshape(-1)
    mask[(idx.unsqueeze(1) * es + torch.arange(es)).reshape(-1)] = True
    return mask


class Snapshot:
    """The bytes of every buffer the caller's tensors live in, before a call."""

    def __init__(self, built: Built) -> None:
        self.built = built
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for _, t in built.tensors():
            if t.device.type == "meta" or not t.untyped_storage().nbytes():
                continue
            key = t.untyped_storage().data_ptr()
            if key not in self.buffers:
                raw = _raw(t)
                self.buffers[key] = (raw, raw.cpu().clone())

    def changes(self, allowed: list[str]) -> list[str]:
        """The bytes that changed outside the tensors named in ``allowed``, described."""
        found: list[str] = []
        for key, (raw, before) in self.buffers.items():
            now = raw.cpu()
            changed = now != before
            if not bool(changed.any()):
                continue
            users = [
                (name, t)
                for name, t in self.built.tensors()
                if t.device.type != "meta" and t.untyped_storage().data_ptr() == key
            ]
            free = changed.clone()
            for name, t in users:
                if name in allowed:
                    free &= ~_covered(t, before.numel())
            if not bool(free.any()):
                continue
            hit = [
                name
                for name, t in users
                if name not in allowed and bool((free & _covered(t, before.numel())).any())
            ]
            outside = free.clone()
            for _, t in users:
                outside &= ~_covered(t, before.numel())
            what = ", ".join(hit) if hit else ""
            if bool(outside.any()):
                n = int(outside.sum())
                what += ("; " if what else "") + (
                    f"{n} byte(s) outside every argument in the buffer of "
                    f"{'/'.join(name for name, _ in users)}"
                )
            found.append(what)
        return found


def _tail(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    return "".join(traceback.format_list(frames)).rstrip()


def execute(built: Built, report: Any = None) -> dict[str, Any]:
    """Make ``built``'s calls in order; the first that raises, or the last, is the outcome."""
    op = built.steps[0].op
    for step in built.steps:
        op = step.op
        if report is not None:
            report(("step", op))
        snap = Snapshot(built)
        try:
            step.call()
            if built.args and any(t.is_cuda for _, t in built.tensors()):
                torch.cuda.synchronize()
        except Exception as e:
            outcome = classify(e, step.names)
            wrote = snap.changes([])
            result: dict[str, Any] = {
                "op": op,
                "outcome": WRITE_ON_REJECT if wrote else outcome,
                "error": type(e).__name__,
                "message": str(e)[:600],
                "clean": outcome == CLEAN,
            }
            if wrote:
                result["written"] = wrote
            if outcome == UNCLEAN:
                result["where"] = _tail(e)
            return result
        stray = snap.changes(step.writes())
        if stray:
            return {"op": op, "outcome": OOB_WRITE, "written": stray}
    return {"op": op, "outcome": ACCEPTED}


def run_case(case: dict[str, Any], backend: Any, report: Any = None) -> dict[str, Any]:
    """Build and execute one case; a failure to build is the harness's own error."""
    try:
        built = build(case, backend)
    except Exception as e:
        if report is not None:
            report(("start", f"{case.get('kind')} (could not be built)"))
        return {
            "op": str(case.get("kind")),
            "outcome": HARNESS,
            "error": type(e).__name__,
            "message": str(e)[:600],
            "where": "".join(traceback.format_exception(e)[-4:]),
        }
    if report is not None:
        report(("start", built.describe()))
    result = execute(built, report)
    if built.notes:
        result["notes"] = built.notes
    return result


def serve(conn: Any, backend_id: str, log_path: str) -> None:
    """A worker process's main: load ``backend_id``, then run cases until told to stop."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    warnings.simplefilter("ignore")
    try:
        from ..backend import backend_for

        backend = backend_for(backend_id)
        backend.device  # noqa: B018 (resolves the device now, not in the first case)
    except Exception as e:
        conn.send(("fail", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", {"backend": backend.id, "device": str(backend.device)}))
    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        if case is None:
            return
        conn.send(("done", run_case(case, backend, conn.send)))

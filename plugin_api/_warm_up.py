"""Warm-up: build or load every native kernel the backend would use for given specs, before the
engine's first request.

For each distinct (family, spec), ``warm_up`` resolves the op on the backend and runs it once on
the smallest inputs that take its real code paths: attention a prefill of ``block_size + 1``
tokens then a decode (``1 + num_speculative_tokens`` tokens) through ``plan``/``run`` on a
tiny KV cache; gemm ``prepare`` then ``mm``/``scaled_mm`` at each of ``gemm_rows``; quant one
row; state one zero and one copy of a block. Running the public ops is what builds a plugin's
C++ extensions (cached per machine) and compiles Triton kernels, so no plugin hook is needed.
A spec the backend rejects, or a fallback under ``PLUGIN_API_STRICT=1``, is a failed item with
its reason; the rest still run.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .backend import Backend, describe, process_backend
from .contract import OpFamily
from .contract.provenance import Provenance, record_kernels, record_ops
from .errors import PluginApiError
from .ops import checks
from .ops.attention import AttentionBatch, AttentionSpec, attention
from .ops.gemm import FLOAT_DTYPES, USAGES, WEIGHT_DTYPES, GemmSpec, mm, prepare, scaled_mm
from .ops.quant import IN_DTYPES, OUT_DTYPES, QuantSpec, per_token_group_quant
from .ops.state import STATE_DTYPES, StateSpec, copy_state_blocks, zero_state_blocks

Spec = AttentionSpec | GemmSpec | QuantSpec | StateSpec
FAMILIES: dict[type, OpFamily] = {
    AttentionSpec: OpFamily.ATTENTION,
    GemmSpec: OpFamily.GEMM,
    QuantSpec: OpFamily.QUANT,
    StateSpec: OpFamily.STATE,
}


class WarmUpFailed(PluginApiError):
    """``WarmUpReport.raise_on_failure``: at least one item could not be warmed."""


@dataclass(frozen=True, slots=True)
class WarmUpItem:
    """One distinct (family, spec): what ran it (``provenance``, None when it failed before
    running), how long it took, the library kernels implementations named (``note_kernel``),
    and the error if it failed. ``layers`` are the names it was given under (may be empty)."""

    family: OpFamily
    spec: Hashable
    layers: tuple[str, ...]
    seconds: float
    provenance: Provenance | None = None
    kernels: tuple[str, ...] = ()
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def fallback(self) -> bool:
        return self.provenance is not None and self.provenance.fallback

    def describe(self) -> str:
        return f"{self.family} {describe(self.spec)}"

    def to_dict(self, *, tracebacks: bool = False) -> dict[str, Any]:
        p = self.provenance
        d: dict[str, Any] = {
            "family": str(self.family),
            "spec": describe(self.spec),
            "layers": list(self.layers),
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "fallback": self.fallback,
            "implementation": None
            if p is None
            else {
                "backend": p.backend,
                "impl": p.impl,
                "path": str(p.path),
                "fallback": p.fallback,
            },
            "kernels": list(self.kernels),
        }
        if self.error is not None:
            d["error"] = {"type": self.error_type, "message": self.error}
            if tracebacks and self.traceback:
                d["error"]["traceback"] = self.traceback
        return d


@dataclass(frozen=True, slots=True)
class WarmUpReport:
    """Every item ``warm_up`` ran, in order, on backend ``backend``."""

    backend: str
    device_type: str
    items: tuple[WarmUpItem, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(i.ok for i in self.items)

    @property
    def failed(self) -> tuple[WarmUpItem, ...]:
        return tuple(i for i in self.items if not i.ok)

    def raise_on_failure(self) -> None:
        """Raise ``WarmUpFailed`` naming every failed item and its error."""
        bad = self.failed
        if bad:
            lines = [f"  {i.describe()}: {i.error_type}: {i.error}" for i in bad]
            raise WarmUpFailed(
                f"warm-up on backend {self.backend!r}: {len(bad)} of {len(self.items)} items "
                "failed:\n" + "\n".join(lines),
                backend=self.backend,
                reasons=tuple(f"{i.describe()}: {i.error}" for i in bad),
            )

    def to_dict(self, *, tracebacks: bool = False) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device_type": self.device_type,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "items": [i.to_dict(tracebacks=tracebacks) for i in self.items],
        }


def stderr_line(line: str) -> None:
    """The default progress sink: one line to the current ``sys.stderr``, flushed."""
    print(line, file=sys.stderr, flush=True)


def warm_up(
    specs: Iterable[Spec] | Mapping[str, Spec],
    *,
    backend: Backend | None = None,
    gemm_rows: Sequence[int] = (1,),
    progress: Callable[[str], None] | None = stderr_line,
) -> WarmUpReport:
    """Build or load the kernels ``backend`` (default: the selected one) runs for ``specs``.

    ``specs``: ``AttentionSpec``, ``GemmSpec``, ``QuantSpec`` and ``StateSpec`` objects, or a
    mapping of layer name to spec; equal specs are warmed once (the item lists their names).
    ``gemm_rows``: the M of each warm-up GEMM call; primitives such as oneDNN's are built per
    M, so an engine with fixed batch sizes passes them. ``progress`` gets one line when an item
    starts and one when it ends (None: silent). Every spec is checked before any kernel runs;
    a failing item is recorded in the report (``report.ok``, ``report.raise_on_failure()``).
    """
    named = _named_specs(specs)
    rows = _check_rows(gemm_rows)
    if backend is not None and not isinstance(backend, Backend):
        raise TypeError(f"warm_up: backend must be a Backend or None, got {type(backend).__name__}")
    if progress is not None and not callable(progress):
        raise TypeError(f"warm_up: progress must be a callable or None, got {progress!r}")
    be = backend or process_backend()
    started = time.perf_counter()
    items = []
    for n, (family, spec, layers) in enumerate(named, 1):
        head = f"[{n}/{len(named)}] {family} {describe(spec)}"
        if progress is not None:
            progress(f"{head} ...")
        item = _warm_one(be, family, spec, layers, rows)
        items.append(item)
        if progress is not None:
            progress(f"{head}: {_outcome(item)}")
    return WarmUpReport(be.id, be.device_type, tuple(items), time.perf_counter() - started)


def _outcome(item: WarmUpItem) -> str:
    if not item.ok:
        return f"failed after {item.seconds:.1f} s: {item.error_type}: {_first_line(item.error)}"
    p = item.provenance
    who = "nothing ran" if p is None else f"{p.backend}:{p.impl}"
    return f"{who}{' (fallback)' if item.fallback else ''} {item.seconds:.1f} s"


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


def _named_specs(
    specs: Iterable[Spec] | Mapping[str, Spec],
) -> list[tuple[OpFamily, Hashable, tuple[str, ...]]]:
    """Check every spec; one entry per distinct (family, spec) with the names given to it."""
    if isinstance(specs, Mapping):
        pairs: list[tuple[str | None, object, str]] = []
        for name, spec in specs.items():
            if not isinstance(name, str):
                raise TypeError(f"warm_up: specs keys are layer names (str), got {name!r}")
            pairs.append((name, spec, f"specs[{name!r}]"))
    elif isinstance(specs, str | bytes) or not isinstance(specs, Iterable):
        raise TypeError(
            f"warm_up: specs must be an iterable of specs or a mapping of name to spec, got "
            f"{type(specs).__name__}"
        )
    else:
        pairs = [(None, spec, f"specs[{i}]") for i, spec in enumerate(specs)]
    merged: dict[tuple[OpFamily, Hashable], list[str]] = {}
    for name, spec, where in pairs:
        family = FAMILIES.get(type(spec))
        if family is None:
            kinds = ", ".join(t.__name__ for t in FAMILIES)
            raise TypeError(f"warm_up: {where} is a {type(spec).__name__}, expected one of {kinds}")
        _check_spec(where, spec)
        names = merged.setdefault((family, spec), [])
        if name is not None:
            names.append(name)
    return [(family, spec, tuple(names)) for (family, spec), names in merged.items()]


def _check_rows(rows: Sequence[int]) -> tuple[int, ...]:
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence) or not rows:
        raise TypeError(f"warm_up: gemm_rows={rows!r} must be a non-empty sequence of ints")
    for i, m in enumerate(rows):
        checks.positive_int("warm_up", f"gemm_rows[{i}]", m)
    return tuple(dict.fromkeys(rows))


def _check_spec(where: str, spec: object) -> None:
    """What the ops would refuse about a spec's own fields, said before any kernel runs
    (``AttentionSpec`` checks itself when made)."""
    op = f"warm_up: {where}"
    if isinstance(spec, GemmSpec):
        checks.positive_int(op, "n", spec.n)
        checks.positive_int(op, "k", spec.k)
        _dtype_in(op, "weight_dtype", spec.weight_dtype, WEIGHT_DTYPES)
        _dtype_in(op, "out_dtype", spec.out_dtype, FLOAT_DTYPES)
        checks.one_of(op, "usage", spec.usage, USAGES)
        if not spec.scaled and spec.out_dtype not in (spec.weight_dtype, torch.float32):
            raise TypeError(
                f"{op}: out_dtype={spec.out_dtype} with weight_dtype={spec.weight_dtype}; "
                f"use {spec.weight_dtype} or float32"
            )
    elif isinstance(spec, QuantSpec):
        checks.positive_int(op, "k", spec.k)
        checks.positive_int(op, "group_size", spec.group_size)
        if spec.k % spec.group_size:
            raise ValueError(f"{op}: k={spec.k} is not divisible by group_size={spec.group_size}")
        _dtype_in(op, "in_dtype", spec.in_dtype, IN_DTYPES)
        _dtype_in(op, "dtype", spec.dtype, OUT_DTYPES)
    elif isinstance(spec, StateSpec):
        if not spec.shapes or len(spec.shapes) != len(spec.dtypes):
            raise ValueError(
                f"{op}: {len(spec.shapes)} shapes and {len(spec.dtypes)} dtypes; one of each "
                "per state tensor, at least one"
            )
        for i, (shape, dtype) in enumerate(zip(spec.shapes, spec.dtypes, strict=True)):
            for j, size in enumerate(shape):
                checks.positive_int(op, f"shapes[{i}][{j}]", size)
            _dtype_in(op, f"dtypes[{i}]", dtype, STATE_DTYPES)


def _dtype_in(op: str, name: str, dtype: object, allowed: frozenset[torch.dtype]) -> None:
    if dtype not in allowed:
        valid = ", ".join(sorted(str(d) for d in allowed))
        raise TypeError(f"{op}: {name}={dtype} is not one of {valid}")


def _warm_one(
    be: Backend,
    family: OpFamily,
    spec: Hashable,
    layers: tuple[str, ...],
    rows: tuple[int, ...],
) -> WarmUpItem:
    started = time.perf_counter()
    try:
        with record_ops() as calls, record_kernels() as kernels:
            if isinstance(spec, AttentionSpec):
                _attention(be, spec)
            elif isinstance(spec, GemmSpec):
                _gemm(be, spec, rows)
            elif isinstance(spec, QuantSpec):
                _quant(be, spec)
            else:
                assert isinstance(spec, StateSpec)  # _named_specs admits these four only
                _state(be, spec)
            _synchronize(be.device)
    except Exception as e:  # recorded: the item fails, the report says why, the rest still run
        return WarmUpItem(
            family,
            spec,
            layers,
            time.perf_counter() - started,
            error=str(e),
            error_type=type(e).__name__,
            traceback=traceback.format_exc(),
        )
    # what actually ran (the calls' own provenance), not only what resolution promised
    ran = calls[0] if calls else None
    return WarmUpItem(
        family,
        spec,
        layers,
        time.perf_counter() - started,
        provenance=ran,
        kernels=tuple(dict.fromkeys(kernels)),
    )


def _attention(be: Backend, spec: AttentionSpec) -> None:
    """A prefill of ``block_size + 1`` tokens (two blocks), then one decode step of
    ``1 + num_speculative_tokens`` tokens, on a cache just large enough."""
    attn = attention(spec, be)
    prefill, decode = spec.block_size + 1, 1 + spec.num_speculative_tokens
    total = prefill + decode
    blocks = -(-total // spec.block_size)
    cache = attn.allocate_kv_cache(blocks)
    table = [list(range(blocks))]
    sinks = torch.zeros(spec.num_heads, device=be.device) if spec.has_sinks else None
    steps = (
        AttentionBatch.from_lists(
            query_lens=[prefill],
            seq_lens=[prefill],
            block_table=table,
            slot_mapping=list(range(prefill)),
        ),
        AttentionBatch.from_lists(
            query_lens=[decode],
            seq_lens=[total],
            block_table=table,
            slot_mapping=list(range(prefill, total)),
            num_decodes=1,
        ),
    )
    for batch in steps:
        plan = attn.plan(batch, num_blocks=blocks)
        t = batch.num_tokens
        query = _randn((t, spec.num_heads, spec.head_size), spec.q_dtype, be.device)
        key = value = None
        if not spec.kv_sharing:
            key = _randn((t, spec.num_kv_heads, spec.head_size), spec.dtype, be.device)
            value = _randn((t, spec.num_kv_heads, spec.head_size), spec.dtype, be.device)
        attn.run(query, key, value, cache, plan, sinks=sinks)


def _gemm(be: Backend, spec: GemmSpec, rows: tuple[int, ...]) -> None:
    """``prepare`` a zero weight of the spec's shape, then one call per M in ``rows``."""
    dev = be.device
    # zeros: allocated lazily and cheap even for an LM head; the kernels do not look at values
    weight = torch.zeros((spec.n, spec.k), dtype=spec.weight_dtype, device=dev)
    if spec.scaled:
        w_scale = torch.ones(spec.n, dtype=torch.float32, device=dev)
        packed = prepare(
            weight, out_dtype=spec.out_dtype, usage=spec.usage, weight_scale=w_scale, backend=be
        )
    else:
        packed = prepare(weight, out_dtype=spec.out_dtype, usage=spec.usage, backend=be)
    del weight
    for m in rows:
        if spec.scaled:
            x_q = torch.ones((m, spec.k), dtype=torch.int8, device=dev)
            scaled_mm(x_q, torch.ones(m, dtype=torch.float32, device=dev), packed)
        else:
            mm(_randn((m, spec.k), spec.weight_dtype, dev), packed)


def _quant(be: Backend, spec: QuantSpec) -> None:
    x = _randn((1, spec.k), spec.in_dtype, be.device)
    per_token_group_quant(
        x,
        spec.group_size,
        spec.dtype,
        column_major_scales=spec.column_major_scales,
        scale_ue8m0=spec.scale_ue8m0,
        backend=be,
    )


def _state(be: Backend, spec: StateSpec) -> None:
    """Two blocks per state tensor: zero block 0, copy it to block 1."""
    states = [
        torch.zeros((2, *shape), dtype=dtype, device=be.device)
        for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)
    ]
    zero_state_blocks(states, torch.tensor([0]), backend=be)
    copy_state_blocks(states, torch.tensor([0]), torch.tensor([1]), backend=be)


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # small values: an fp8 cast stays in range, softmax stays finite
    return (torch.randn(shape, device=device) * 0.1).to(dtype)


def _synchronize(device: torch.device) -> None:
    """Wait for the device, so an item's time includes its kernels (and their compilation)."""
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


__all__ = ["WarmUpFailed", "WarmUpItem", "WarmUpReport", "stderr_line", "warm_up"]

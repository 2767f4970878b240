"""Input checks shared by the op families. Each error names the argument, the value and what
is valid; they run before any kernel, so a failing call writes nothing."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

_SHORT = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float8_e4m3fn: "fp8",
    torch.int8: "int8",
}


def short_dtype(d: torch.dtype) -> str:
    return _SHORT.get(d, str(d).removeprefix("torch."))


def _dtype_names(dtypes: Collection[torch.dtype]) -> str:
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


def tensor(
    op: str,
    name: str,
    t: object,
    *,
    dtypes: Collection[torch.dtype] | None = None,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    device: torch.device | None = None,
    contiguous: bool = False,
) -> torch.Tensor:
    """Check ``t`` and return it typed. ``shape`` entries of None match any size."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(
            f"{op}: {name}.dtype={t.dtype} is not supported; use {_dtype_names(dtypes)}"
        )
    if shape is not None:
        ndim = len(shape)
    got = t.shape
    if ndim is not None and len(got) != ndim:
        raise ValueError(f"{op}: {name} must have {ndim} dims, got shape {tuple(got)}")
    if shape is not None:
        for i, want in enumerate(shape):
            if want is not None and want != got[i]:
                raise ValueError(
                    f"{op}: {name}.shape[{i}]={got[i]}, expected {want} (shape {tuple(got)})"
                )
    # a device equal to the expected one is the common case: one C-level comparison
    if device is not None and t.device != device and not same_device(t.device, device):
        raise ValueError(f"{op}: {name} is on {t.device}, expected {device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous (strides {t.stride()})")
    return t


def same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    return a.index is None or b.index is None or a.index == b.index


def positive_int(op: str, name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{op}: {name}={value} must be >= {minimum}")
    return value


def one_of(op: str, name: str, value: object, allowed: Collection[object]) -> None:
    if value not in allowed:
        shown = sorted(map(str, allowed))
        raise ValueError(f"{op}: {name}={value!r} is not one of {shown}")


# ---- memory overlap and output identity (O(ndim) metadata only: no data is read) ----------


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """``[first, last]`` byte addresses ``t`` touches (non-empty ``t``)."""
    size = t.element_size()
    lo = hi = t.data_ptr()
    if t.is_contiguous():
        return lo, lo + t.numel() * size - 1
    for n, st in zip(t.shape, t.stride(), strict=True):
        reach = (n - 1) * st * size
        if reach < 0:
            lo += reach
        else:
            hi += reach
    return lo, hi + size - 1


def _row_window(t: torch.Tensor) -> tuple[int, int] | None:
    """``(row stride, bytes one row spans)`` in bytes when dim 0 is the outermost dim and every
    row lies within one row stride; else None."""
    if t.dim() < 2 or t.stride(0) <= 0:
        return None
    size = t.element_size()
    span = size
    for n, st in zip(t.shape[1:], t.stride()[1:], strict=True):
        if st < 0:
            return None
        span += (n - 1) * st * size
    row = t.stride(0) * size
    return (row, span) if span <= row else None


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` may share a byte of memory.

    Exact for disjoint address ranges and for row slices of one buffer (same row stride, each
    row within it: ``buf[:, :n]`` and ``buf[:, n:]`` are disjoint); any other pair whose ranges
    meet counts as overlapping.
    """
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device or a.device.type == "meta":
        return False
    a_lo, a_hi = _byte_span(a)
    b_lo, b_hi = _byte_span(b)
    if a_hi < b_lo or b_hi < a_lo:
        return False
    wa, wb = _row_window(a), _row_window(b)
    if wa is not None and wb is not None and wa[0] == wb[0]:
        row = wa[0]
        # each tensor covers [start, start + span) in every row: disjoint iff the two windows
        # are disjoint modulo the row stride
        da = (b.data_ptr() - a.data_ptr()) % row  # b's window start, relative to a's
        return da < wa[1] or row - da < wb[1]
    return True


def internal_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (a broadcast ``expand``, say): strides,
    sorted, must each step past everything the smaller ones reach."""
    dims = sorted((abs(st), n) for n, st in zip(t.shape, t.stride(), strict=True) if n > 1)
    reach = 0
    for st, n in dims:
        if st <= reach:
            return True
        reach += (n - 1) * st
    return False


def no_overlap(
    op: str,
    outputs: Sequence[tuple[str, torch.Tensor]],
    inputs: Sequence[tuple[str, torch.Tensor | None]],
) -> None:
    """Refuse an output that overlaps itself, an input, or an earlier output, naming both."""
    outs = [t for _, t in outputs]
    if all(t.is_contiguous() for t in outs) and apart(
        outs, [t for _, t in inputs if t is not None]
    ):
        return  # the common case: contiguous outputs (no internal overlap), ranges all apart
    for i, (name, out) in enumerate(outputs):
        if internal_overlap(out):
            raise ValueError(
                f"{op}: {name} overlaps itself (strides {tuple(out.stride())} for shape "
                f"{tuple(out.shape)}): two of its elements would be written to one place"
            )
        others = [*inputs, *outputs[:i]]
        for other_name, other in others:
            if other is not None and overlaps(out, other):
                raise ValueError(
                    f"{op}: {name} overlaps {other_name} in memory; an output must not share "
                    f"memory with another argument (pass separate tensors)"
                )


def apart(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> bool:
    """Whether every output's byte range meets no input's and no other output's: a cheap
    sufficient condition for ``no_overlap`` (outputs must also be free of internal overlap).
    False says only that the exact check is needed."""
    spans = [_byte_span(t) for t in outputs if t.numel()]
    spans_in = [_byte_span(t) for t in inputs if t.numel()]
    for i, (lo, hi) in enumerate(spans):
        for o_lo, o_hi in (*spans[:i], *spans_in):
            if not (hi < o_lo or o_hi < lo):
                return False
    return True


class Outputs:
    """The output tensors of one call, as the caller passed them: after the kernel, ``check``
    raises if a kernel rebound one (``t.data = ...``) to other memory, dtype, shape or strides.
    """

    __slots__ = ("_seen",)

    def __init__(self, outputs: Sequence[tuple[str, torch.Tensor]]) -> None:
        self._seen = [(name, t, _identity(t)) for name, t in outputs]

    def check(self, op: str, impl: object) -> None:
        for name, t, before in self._seen:
            after = _identity(t)
            if after != before:
                from ..errors import ImplementationError

                what = [
                    f"{field} {b} -> {a}"
                    for field, b, a in zip(_FIELDS, before, after, strict=True)
                    if a != b
                ]
                who = getattr(impl, "name", type(impl).__name__)
                raise ImplementationError(
                    f"{op}: implementation {who!r} replaced the caller's {name} tensor "
                    f"({'; '.join(what)}); a kernel must write into the output it is given"
                )


_FIELDS = ("dtype", "shape", "strides", "data_ptr")


def _identity(t: torch.Tensor) -> tuple[object, ...]:
    return (t.dtype, tuple(t.shape), t.stride(), t.data_ptr())

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
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{op}: {name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if shape is not None:
        for i, (want, got) in enumerate(zip(shape, t.shape, strict=True)):
            if want is not None and want != got:
                raise ValueError(
                    f"{op}: {name}.shape[{i}]={got}, expected {want} (shape {tuple(t.shape)})"
                )
    if device is not None and not same_device(t.device, device):
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

"""Recurrent-state blocks (Mamba-style): copy and zero blocks of every state tensor of a group.

A group's state tensors are ``[num_blocks, *per_block_shape]`` (for a Mamba2 layer a conv state
``[conv_dim, d_conv - 1]`` and an SSM state ``[n_heads, head_dim, d_state]``). Block ids index
dim 0. ``copy_state_blocks`` does ``dst[i] <- src[i]`` for every tensor; repeated ``dst`` ids or
``dst`` ids that are also sources are input errors (the result would depend on order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from ..contract import OpFamily
from ..contract.decision import Decision, ImplPath
from ..contract.provenance import note
from . import checks

if TYPE_CHECKING:
    from ..backend import Backend
    from ..device_info import DeviceInfo

STATE_DTYPES = frozenset({torch.bfloat16, torch.float16, torch.float32})
ID_DTYPES = frozenset({torch.int32, torch.int64})


@dataclass(frozen=True, slots=True)
class StateSpec:
    """The per-block shape and dtype of each state tensor in a group."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    def describe(self) -> str:
        parts = [
            f"{'x'.join(map(str, s))} {checks.short_dtype(d)}"
            for s, d in zip(self.shapes, self.dtypes, strict=True)
        ]
        return "state[" + ", ".join(parts) + "]"

    def block_bytes(self) -> int:
        total = 0
        for s, d in zip(self.shapes, self.dtypes, strict=True):
            n = 1
            for x in s:
                n *= x
            total += n * torch.empty((), dtype=d).element_size()
        return total


class StateImplementation(Protocol):
    name: str
    path: ImplPath

    def supports(self, spec: StateSpec, info: DeviceInfo) -> Decision: ...

    def copy_blocks(
        self,
        spec: StateSpec,
        states: Sequence[torch.Tensor],
        src: torch.Tensor,
        dst: torch.Tensor,
    ) -> None:
        """``t[dst[i]] = t[src[i]]`` for every tensor ``t``; ids are int64 on the states' device."""
        ...

    def zero_blocks(
        self, spec: StateSpec, states: Sequence[torch.Tensor], ids: torch.Tensor
    ) -> None:
        """``t[ids[i]] = 0`` for every tensor ``t``."""
        ...


def _check_states(
    op: str, states: object, device: torch.device, ids: Sequence[tuple[str, object]]
) -> tuple[StateSpec, int]:
    if not isinstance(states, list | tuple) or not states:
        raise TypeError(f"{op}: states must be a non-empty list of tensors")
    blocks = None
    for i, t in enumerate(states):
        t = checks.tensor(
            op, f"states[{i}]", t, dtypes=STATE_DTYPES, device=device, contiguous=True
        )
        if t.dim() < 2:
            raise ValueError(f"{op}: states[{i}] must be [num_blocks, ...], got {tuple(t.shape)}")
        if blocks is None:
            blocks = int(t.shape[0])
        elif int(t.shape[0]) != blocks:
            raise ValueError(f"{op}: states[{i}] has {t.shape[0]} blocks, states[0] has {blocks}")
    # every tensor is written: one that shares memory with another would see its writes
    read = [(name, t) for name, t in ids if isinstance(t, torch.Tensor)]
    checks.no_overlap(op, [(f"states[{i}]", t) for i, t in enumerate(states)], read)
    spec = StateSpec(
        tuple(tuple(int(x) for x in t.shape[1:]) for t in states),
        tuple(t.dtype for t in states),
    )
    assert blocks is not None
    return spec, blocks


def _outputs(states: Sequence[torch.Tensor]) -> checks.Outputs:
    return checks.Outputs([(f"states[{i}]", t) for i, t in enumerate(states)])


def _check_ids(
    op: str, name: str, ids: object, num_blocks: int, device: torch.device
) -> torch.Tensor:
    t = checks.tensor(op, name, ids, dtypes=ID_DTYPES, ndim=1)
    if t.device.type not in ("cpu", device.type):  # their values are read: a meta tensor has none
        raise ValueError(f"{op}: {name} is on {t.device}; block ids live on the CPU or {device}")
    host = t.cpu()  # the values decide validity; a device tensor costs one sync here
    if host.numel() and (int(host.min()) < 0 or int(host.max()) >= num_blocks):
        bad = int(host[(host < 0) | (host >= num_blocks)][0])
        raise ValueError(f"{op}: {name} holds block id {bad}, outside [0, {num_blocks})")
    return host


def copy_state_blocks(
    states: Sequence[torch.Tensor],
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    *,
    backend: Backend | None = None,
) -> None:
    """Copy block ``src_ids[i]`` to block ``dst_ids[i]`` in every tensor of ``states``."""
    from ..backend import process_backend

    op = "copy_state_blocks"
    be = backend or process_backend()
    device = be.device
    spec, nb = _check_states(op, states, device, (("src_ids", src_ids), ("dst_ids", dst_ids)))
    src = _check_ids(op, "src_ids", src_ids, nb, device)
    dst = _check_ids(op, "dst_ids", dst_ids, nb, device)
    if src.shape != dst.shape:
        raise ValueError(f"{op}: src_ids has {src.numel()} ids, dst_ids has {dst.numel()}")
    if torch.unique(dst).numel() != dst.numel():
        raise ValueError(f"{op}: dst_ids repeats a block id; each destination must be unique")
    overlap = set(dst.tolist()) & set(src.tolist())
    if overlap:
        raise ValueError(
            f"{op}: block(s) {sorted(overlap)} are both source and destination (in src_ids "
            "and dst_ids); a block is either copied from or written to in one call"
        )
    impl, prov = be.implementation_for(OpFamily.STATE, spec)
    if dst.numel():
        written = _outputs(states)
        impl.copy_blocks(
            spec, list(states), src.to(device, torch.int64), dst.to(device, torch.int64)
        )
        written.check(op, impl)
    note(prov)


def zero_state_blocks(
    states: Sequence[torch.Tensor], ids: torch.Tensor, *, backend: Backend | None = None
) -> None:
    """Zero block ``ids[i]`` in every tensor of ``states`` (fresh blocks start at zero)."""
    from ..backend import process_backend

    op = "zero_state_blocks"
    be = backend or process_backend()
    device = be.device
    spec, nb = _check_states(op, states, device, (("ids", ids),))
    host = _check_ids(op, "ids", ids, nb, device)
    if torch.unique(host).numel() != host.numel():
        raise ValueError(f"{op}: ids repeats a block id")
    impl, prov = be.implementation_for(OpFamily.STATE, spec)
    if host.numel():
        written = _outputs(states)
        impl.zero_blocks(spec, list(states), host.to(device, torch.int64))
        written.check(op, impl)
    note(prov)

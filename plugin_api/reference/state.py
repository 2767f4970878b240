"""Reference state-block copies: torch indexing per state tensor."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from plugin_api.contract.decision import Decision, ImplPath
from plugin_api.device_info import DeviceInfo
from plugin_api.ops.state import StateSpec


class ReferenceState:
    name = "reference"
    path = ImplPath.REFERENCE

    def supports(self, spec: StateSpec, info: DeviceInfo) -> Decision:
        return Decision.accept("eager torch block copies")

    def copy_blocks(
        self,
        spec: StateSpec,
        states: Sequence[torch.Tensor],
        src: torch.Tensor,
        dst: torch.Tensor,
    ) -> None:
        # One contiguous block copy per pair: ~10x faster than index_select + index_copy_, which
        # gathers into a temporary first. Ids are validated disjoint, so order does not matter.
        pairs = list(zip(src.tolist(), dst.tolist(), strict=True))
        for t in states:
            for s, d in pairs:
                t[d].copy_(t[s])

    def zero_blocks(
        self, spec: StateSpec, states: Sequence[torch.Tensor], ids: torch.Tensor
    ) -> None:
        for t in states:
            t.index_fill_(0, ids, 0)


def implementations() -> tuple[ReferenceState]:
    return (ReferenceState(),)

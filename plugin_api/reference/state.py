"""Reference state-block copies: torch indexing per state tensor."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from plugin_api.device_info import DeviceInfo
from plugin_api.ops.decision import Decision, ImplPath
from plugin_api.ops.state import StateSpec


class ReferenceState:
    name = "reference"
    path = ImplPath.REFERENCE

    def supports(self, spec: StateSpec, info: DeviceInfo) -> Decision:
        return Decision.accept("eager torch index_copy_/index_fill_")

    def copy_blocks(
        self,
        spec: StateSpec,
        states: Sequence[torch.Tensor],
        src: torch.Tensor,
        dst: torch.Tensor,
    ) -> None:
        for t in states:
            t.index_copy_(0, dst, t.index_select(0, src))

    def zero_blocks(
        self, spec: StateSpec, states: Sequence[torch.Tensor], ids: torch.Tensor
    ) -> None:
        for t in states:
            t.index_fill_(0, ids, 0)

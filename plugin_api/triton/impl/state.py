"""State-block copies and zeroing through the Triton kernel in ``plugin_api.triton.state_copy``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...contract.decision import Decision, ImplPath
from ...device_info import DeviceInfo
from ...gpu.triton_target import TritonTarget
from ...ops.state import StateSpec


class TritonState:
    """Raw-bit block copies: exact for every state dtype the host accepts."""

    name = "triton"
    path = ImplPath.TRITON

    def __init__(self, target: TritonTarget) -> None:
        self.target = target

    def supports(self, spec: StateSpec, info: DeviceInfo) -> Decision:
        return Decision.all_of(
            self.target.triton(info), Decision.accept("one launch per state tensor, raw bits")
        )

    def copy_blocks(
        self,
        spec: StateSpec,
        states: Sequence[torch.Tensor],
        src: torch.Tensor,
        dst: torch.Tensor,
    ) -> None:
        from .. import state_copy

        state_copy.copy_blocks(list(states), src, dst)

    def zero_blocks(
        self, spec: StateSpec, states: Sequence[torch.Tensor], ids: torch.Tensor
    ) -> None:
        from .. import state_copy

        state_copy.zero_blocks(list(states), ids)

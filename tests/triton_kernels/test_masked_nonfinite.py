"""The host's Triton attention: a NaN or Inf that a query cannot see (causally masked, or
outside its sliding window) never reaches its output (issue 30, item 8)."""

from __future__ import annotations

import pytest
import torch

from plugin_api.contract.decision import ImplPath
from plugin_api.ops.attention import Attention

from ..masked_values import poisoned_case, run_and_check, specs


@pytest.mark.parametrize("name", list(specs()))
def test_masked_non_finite_values_do_not_reach_visible_rows(
    triton_backend, triton_device: torch.device, name: str
) -> None:
    spec = specs()[name]
    attn = Attention(spec, triton_backend)
    assert attn.provenance.path == ImplPath.TRITON
    run_and_check(attn, poisoned_case(spec, triton_device))

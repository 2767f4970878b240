"""The bridge's weight registry: the custom ops find a layer's weight by index while the layer
lives, and the weight goes with its layer (engines made one after another in one process do
not keep each other's weights)."""

from __future__ import annotations

import gc

import pytest
import torch

pytestmark = pytest.mark.needs_vllm


def test_a_weight_is_served_while_its_layer_lives_and_released_with_it() -> None:
    from plugin_api_vllm.linear import Weight, register, registered

    import plugin_api as pa

    w = torch.randn(8, 16)
    layer = torch.nn.Linear(16, 8)
    index = register(Weight(8, torch.float32, "linear", None, pa.prepare(w)), layer)
    other = torch.nn.Linear(16, 8)
    kept = register(Weight(8, torch.float32, "lm_head", w), other)
    y = torch.ops.plugin_api_vllm.mm(torch.ones(2, 16), index, None)
    torch.testing.assert_close(y, torch.ones(2, 16) @ w.T)
    assert registered(index).calls == 1
    del layer
    gc.collect()
    with pytest.raises(KeyError, match=f"weight {index} was released with its layer"):
        registered(index)
    assert registered(kept).usage == "lm_head"  # another layer's weight stays
    del other
    gc.collect()
    with pytest.raises(KeyError, match=f"weight {kept} was released"):
        registered(kept)

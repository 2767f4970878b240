"""The hardware check behind a declared graph level of ``ALWAYS``: a mixed prefill/decode step
captured once in a device graph replays correctly after another step is planned into the same
buffers. Used by the GPU plugins' own GPU tests (the kit itself stays device-neutral)."""

from __future__ import annotations

import pytest
import torch

from ..backend import backend_for
from ..contract.graphs import GraphLevel
from ..errors import SelectionError
from ..gpu.device_graphs import capture, synchronize
from ..ops.attention import Attention, AttentionSpec
from .cases import make_case


def graph_capable_or_skip(backend_id: str, spec: AttentionSpec) -> Attention:
    """``spec`` on ``backend_id``, where that backend runs here and declares ``ALWAYS`` for it;
    otherwise the test is skipped with the probe's or the declaration's reason."""
    try:
        attn = Attention(spec, backend_for(backend_id))
    except SelectionError as e:
        pytest.skip(f"{backend_id} cannot run here: {e}")
    support = attn.graph_support()
    if support.level < GraphLevel.ALWAYS:
        pytest.skip(
            f"{backend_id} declares {support.level} for {spec.describe()}: {support.reason}"
        )
    return attn


def replay_after_replanning(attn: Attention) -> tuple[torch.Tensor, torch.Tensor]:
    """Capture a step of 2 decodes and 2 prefills on ``attn``'s device, plan a second step with
    other lengths, blocks and split (same row count) with ``reuse=``, copy its inputs into the
    captured tensors and replay. Returns (replayed rows, the oracle's rows), fp32 on the CPU,
    ``[num_tokens, num_heads, head_size]``."""
    spec, device = attn.spec, attn.device
    d = 1 + spec.num_speculative_tokens  # the longest decode the spec allows
    first = make_case(spec, [d, 1, 9, 30], [50, 700, 33, 129], num_decodes=2, device=device)
    second = make_case(spec, [1, d, 20, 19], [9, 64, 400, 19], num_decodes=2, device=device, seed=2)
    plan = attn.plan(first.batch)
    out = torch.empty(first.query.shape, dtype=spec.dtype, device=device)

    def step() -> None:
        attn.run(first.query, first.key, first.value, first.cache, plan, sinks=first.sinks, out=out)

    graph = capture(step, device.type)
    # the next step: the graph reads the new plan from the same buffers, inputs from its tensors
    attn.plan(second.batch, reuse=plan)
    for src, dst in (
        (second.query, first.query),
        (second.key, first.key),
        (second.value, first.value),
        (second.sinks, first.sinks),
    ):
        if src is not None and dst is not None:
            dst.copy_(src)
    if second.cache.data.shape[0] > first.cache.data.shape[0]:
        raise AssertionError("replay_after_replanning: the second step needs a larger cache")
    first.cache.data[: second.cache.data.shape[0]].copy_(second.cache.data)
    out.fill_(float("nan"))
    synchronize(device.type)
    graph.replay()
    synchronize(device.type)
    return out[: second.num_tokens].float().cpu(), second.expected()

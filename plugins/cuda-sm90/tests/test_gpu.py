"""Checks that need the GPU this plugin is for (the conformance kit covers the rest): padding
rows of one-token full graphs, a graph captured on one step replayed after re-planning
another into the same buffers, the K/V write as one kernel, and plans running ahead of the GPU
without refilling pinned staging memory under a copy in flight. Skipped, with the reason,
where there is no such GPU."""

from __future__ import annotations

import pytest
import torch

from plugin_api.backend import backend_for
from plugin_api.conformance.cases import make_case
from plugin_api.errors import SelectionError
from plugin_api.gpu.device_graphs import capture
from plugin_api.ops.attention import Attention, AttentionSpec


@pytest.fixture(scope="module")
def backend():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: these checks run on an SM90 GPU (gpu_check.sh)")
    try:
        return backend_for("cuda-sm90")
    except SelectionError as e:
        pytest.skip(f"cuda-sm90 cannot run here: {e}")


SPEC = AttentionSpec(32, 8, 128, torch.bfloat16, block_size=16)


def _graph_run(attn: Attention, case, plan, out: torch.Tensor) -> torch.cuda.CUDAGraph:
    def step() -> None:
        attn.run(case.query, case.key, case.value, case.cache, plan, out=out)

    return capture(step, "cuda")  # after a warm-up off the capture stream (JIT loads)


def test_padded_single_token_graph(backend) -> None:
    attn = Attention(SPEC, backend)
    case = make_case(SPEC, [1, 1, 1], [20, 300, 7], num_decodes=3, device="cuda", pad_rows=5)
    plan = attn.plan(case.batch)
    out = torch.full(case.query.shape, float("nan"), dtype=SPEC.dtype, device="cuda")
    graph = _graph_run(attn, case, plan, out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    got = out[: case.num_tokens].float().cpu()
    torch.testing.assert_close(got, case.expected(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("spec_tokens,lens", [(0, [1, 1, 1, 1]), (3, [4, 4, 4, 4])])
def test_replay_after_replanning_into_the_same_buffers(backend, spec_tokens, lens) -> None:
    spec = AttentionSpec(32, 8, 128, torch.bfloat16, num_speculative_tokens=spec_tokens)
    attn = Attention(spec, backend)
    first = make_case(spec, lens, [50, 700, 33, 129], num_decodes=4, device="cuda", seed=1)
    plan = attn.plan(first.batch)
    out = torch.empty(first.query.shape, dtype=spec.dtype, device="cuda")
    graph = _graph_run(attn, first, plan, out)
    # the next step: other lengths and blocks, same shapes; the graph reads the new plan
    second = make_case(spec, lens, [9, 64, 400, 17], num_decodes=4, device="cuda", seed=2)
    attn.plan(second.batch, reuse=plan)
    first.query.copy_(second.query)
    first.key.copy_(second.key)
    first.value.copy_(second.value)
    assert second.cache.data.shape[0] <= first.cache.data.shape[0]
    first.cache.data[: second.cache.data.shape[0]].copy_(second.cache.data)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(
        out[: second.num_tokens].float().cpu(), second.expected(), atol=2e-2, rtol=2e-2
    )


def test_write_kv_is_one_kernel(backend) -> None:
    """The step's K/V write is one launch of the host's Triton kernel: no torch op runs."""
    attn = Attention(SPEC, backend)
    case = make_case(SPEC, [1, 1, 7, 5], [20, 33, 7, 40], num_decodes=2, device="cuda", seed=3)
    plan = attn.plan(case.batch)

    def write() -> None:
        attn.impl.write_kv(SPEC, case.key, case.value, case.cache, plan.impl_plan)

    write()  # compiles the kernel
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        write()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1 and "cache_write" in kernels[0], kernels
    ops = {e.name for e in prof.events() if e.name.startswith("aten::")}
    assert not ops - {"aten::view", "aten::empty"}, sorted(ops)


def test_pinned_staging_is_not_refilled_while_its_copy_is_in_flight(backend) -> None:
    """Plans run ahead of a busy GPU: each plan's asynchronous copy from pinned memory queues
    behind the work, and a later plan must not refill that memory before the copy has read it.
    A snapshot of the device buffers after each plan (stream-ordered) shows what each copy
    carried."""
    attn = Attention(SPEC, backend)
    steps = [
        make_case(SPEC, [1] * 4, [10 + i, 20 + i, 30 + i, 40 + i], num_decodes=4, device="cuda")
        for i in range(5)
    ]
    plan = attn.plan(steps[0].batch)
    seqs = plan.impl_plan.capacity.seqs
    snaps = torch.full((len(steps), seqs), -7, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time: the copies below queue behind it
    for i, case in enumerate(steps):
        plan = attn.plan(case.batch, reuse=plan)
        snaps[i].copy_(plan.impl_plan.bufs.seq_lens)
    torch.cuda.synchronize()
    for i, case in enumerate(steps):
        assert snaps[i, :4].tolist() == case.batch.seq_lens.tolist(), i

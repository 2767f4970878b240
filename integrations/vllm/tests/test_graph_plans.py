"""Plans under vLLM's full CUDA graphs of decode steps: which steps plan into a kept plan, and
that the metadata builder really re-plans into it (same buffers, refilled) step after step.

The builder runs in a subprocess (this file run as a script) on a fixture backend installed for
it: its attention is the host's ``TritonAttention`` on the CPU, whose plans hold fixed device
buffers that ``plan(reuse=...)`` refills (only planning runs: no kernel is launched, so no
Triton backend for the CPU is needed). The process backend is chosen once per process, hence the
subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.needs_vllm

BLOCK = 16
WIDTH = 8  # vLLM's block table has a fixed width (blocks per request at the longest length)
NUM_BLOCKS = 64  # blocks of each layer's KV cache in the builder run
FIXTURE = "fx-graph-plans"


def vllm_step(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    pad_to: tuple[int, int] | None = None,
    first_block: int = 1,
) -> Any:
    """vLLM's ``CommonAttentionMetadata`` for a step. ``pad_to=(requests, tokens)``: padded as
    vLLM's model runner pads a step it replays as a full CUDA graph (requests with no query
    tokens and length 0, the null block 0, slots -1)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    n, tokens = len(query_lens), sum(query_lens)
    reqs, padded_tokens = pad_to or (n, tokens)
    qsl = torch.full((reqs + 1,), tokens, dtype=torch.int32)
    qsl[0] = 0
    qsl[1 : n + 1] = torch.cumsum(torch.tensor(query_lens), 0)
    table = torch.zeros((reqs, WIDTH), dtype=torch.int32)
    # request r's column c is block first_block + r + c * n: distinct, and few blocks in all
    rows, cols = torch.arange(n).unsqueeze(1), torch.arange(WIDTH).unsqueeze(0)
    table[:n] = (first_block + rows + cols * n).to(torch.int32)
    slots = torch.full((padded_tokens,), -1, dtype=torch.int64)
    i = 0
    for r, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True)):
        for p in range(s - q, s):
            slots[i] = int(table[r, p // BLOCK]) * BLOCK + p % BLOCK
            i += 1
    lens = torch.zeros(reqs, dtype=torch.int32)
    lens[:n] = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=lens,
        num_reqs=reqs,
        num_actual_tokens=padded_tokens,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=table,
        slot_mapping=slots,
    )


# (query lens, seq lens, padded shape, decode limit) -> the graph shape whose plan is kept
STEPS = {
    "decodes, padded to a captured size": ([1, 1, 1], [40, 17, 5], (4, 4), 1, (4, 4)),
    "decodes at a captured size": ([1, 1, 1, 1], [70, 2, 33, 9], None, 1, (4, 4)),
    "speculative decodes": ([3, 3], [40, 17], (2, 6), 3, (2, 6)),
    "a prefill among decodes": ([1, 1, 5], [40, 17, 5], None, 1, None),
    "only a prefill": ([5], [5], None, 1, None),
    "decodes past the largest graph": ([1] * 9, [20] * 9, None, 1, None),
}


@pytest.mark.parametrize("name", STEPS)
def test_which_steps_plan_into_a_kept_plan(name: str) -> None:
    from plugin_api_vllm.attention import attention_batch, decode_graph_shape

    from plugin_api.ops.attention import AttentionSpec, validate_batch

    query_lens, seq_lens, pad_to, limit, shape = STEPS[name]
    m = vllm_step(query_lens, seq_lens, pad_to=pad_to)
    batch = attention_batch(m, limit)
    # the padding requests are not the batch's: the contract's own checks accept it
    assert batch.query_lens.tolist() == query_lens
    assert batch.slot_mapping.shape[0] == sum(query_lens)
    spec = AttentionSpec(4, 2, 16, dtype=torch.float32, num_speculative_tokens=limit - 1)
    validate_batch(spec, batch)
    assert decode_graph_shape(m, batch, max_tokens=8) == shape
    # without full decode graphs every step gets a fresh plan
    assert decode_graph_shape(m, batch, max_tokens=None) is None


@pytest.mark.parametrize(
    ("mode", "capture_size", "max_seqs", "tokens"),
    [
        ("FULL_AND_PIECEWISE", 8, 128, 8),  # vLLM's default mode: the capture size bounds it
        ("FULL_DECODE_ONLY", 512, 4, 4),  # max_num_seqs one-token decodes
        ("FULL", 16, 128, 16),
        ("PIECEWISE", 512, 128, None),  # attention runs outside the graphs
        ("NONE", 512, 128, None),
        ("FULL_AND_PIECEWISE", 0, 128, None),  # no capture size: nothing is captured
    ],
)
def test_full_decode_graphs_come_from_vllms_config(
    mode: str, capture_size: int, max_seqs: int, tokens: int | None
) -> None:
    from plugin_api_vllm.attention import full_decode_graph_tokens
    from vllm.config import CUDAGraphMode, VllmConfig

    cfg = VllmConfig()
    # set after construction: the CPU platform resolves vLLM's config to no CUDA graphs
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    cfg.compilation_config.max_cudagraph_capture_size = capture_size
    cfg.scheduler_config.max_num_seqs = max_seqs
    assert full_decode_graph_tokens(cfg) == tokens


HOOKS = """
from plugin_api import Availability, hookimpl
from plugin_api.contract.decision import Decision
@hookimpl
def plugin_api_probe(info):
    return Availability.validated("cpu", "test fixture: the host's Triton attention plans")
def capture(info):
    return Decision.accept("test fixture: graphs read the plan buffers, refilled in place")
@hookimpl
def plugin_api_implementations(family):
    from plugin_api.triton.impl import TritonAttention, TritonTarget
    return (TritonAttention(TritonTarget("cpu", ("triton",), capture)),)
"""

DESCRIPTOR = f"""
from plugin_api.contract import BackendDescriptor
DESCRIPTOR = BackendDescriptor(
    id={FIXTURE!r}, host_api=">=1.0,<2", priority=50, families=("attention",),
    device_kinds=("cpu",), hooks="fx_graph_plans.hooks", summary="test fixture",
)
"""


def install_fixture_backend(root: Path) -> None:
    """The fixture backend as an installed distribution under ``root`` (for ``PYTHONPATH``)."""
    pkg = root / "fx_graph_plans"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "descriptor.py").write_text(textwrap.dedent(DESCRIPTOR))
    (pkg / "hooks.py").write_text(textwrap.dedent(HOOKS))
    info = root / "fx_graph_plans-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {FIXTURE}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[plugin_api.backends]\n{FIXTURE} = fx_graph_plans.descriptor\n"
    )


@pytest.fixture(scope="module")
def builder_run(
    tmp_path_factory: pytest.TempPathFactory, env: Callable[..., dict[str, str]]
) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("graph-plans")
    install_fixture_backend(root / "site")
    out = root / "run.json"
    path = os.pathsep.join(p for p in (str(root / "site"), os.environ.get("PYTHONPATH")) if p)
    extra = dict(PLUGIN_API_BACKEND=FIXTURE, PLUGIN_API_STRICT="1", PYTHONPATH=path)
    r = subprocess.run(
        [sys.executable, __file__, str(root), str(out)],
        env=env(**extra),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"builder run failed:\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    return json.loads(out.read_text())


def test_the_fixture_backend_serves_graph_capable_plans(builder_run: dict[str, Any]) -> None:
    assert builder_run["impl"] == "triton" and builder_run["graph_level"] == "ALWAYS"
    # kept plans serve decode graphs only, so vLLM is told no more than UNIFORM_BATCH
    assert builder_run["cudagraph_support"] == "UNIFORM_BATCH"


def test_steps_of_a_captured_shape_refill_the_kept_plan(builder_run: dict[str, Any]) -> None:
    steps = builder_run["full"]
    captured = steps["capture"]["buffers"]
    for name in ("padded replay", "replay"):
        assert steps[name]["buffers"] == captured, name
    # refilled in place: the buffers hold the latest step, padding rows of the shape empty
    assert steps["padded replay"]["seq_lens"] == [40, 17, 5, 0]
    assert steps["replay"]["seq_lens"] == [70, 2, 33, 9]
    # one kept plan per spec and shape: both layers share the spec
    assert steps["replay"]["kept"] == 1


def test_another_shape_gets_its_own_kept_plan(builder_run: dict[str, Any]) -> None:
    steps = builder_run["full"]
    other = steps["other shape"]["buffers"]
    assert steps["other shape again"]["buffers"] == other
    assert not set(other.values()) & set(steps["capture"]["buffers"].values())
    assert steps["other shape again"]["kept"] == 2


def test_steps_vllm_does_not_replay_get_fresh_plans(builder_run: dict[str, Any]) -> None:
    steps = builder_run["full"]
    kept = {ptr for name in ("capture", "other shape") for ptr in steps[name]["buffers"].values()}
    for name in ("mixed", "past the largest graph"):
        assert not set(steps[name]["buffers"].values()) & kept, name
        assert steps[name]["kept"] == 2, name


def test_without_full_decode_graphs_nothing_is_kept(builder_run: dict[str, Any]) -> None:
    steps = builder_run["piecewise"]
    assert steps["capture"]["kept"] == steps["replay"]["kept"] == 0
    assert not set(steps["capture"]["buffers"].values()) & set(steps["replay"]["buffers"].values())


def test_the_report_counts_kept_plans(builder_run: dict[str, Any]) -> None:
    assert builder_run["report"] == {"full_decode_graph_tokens": 8, "kept": 2}
    assert "up to 8 tokens): 2 plan(s) kept" in builder_run["summary"]


def test_host_time_counts_every_build_and_its_median(builder_run: dict[str, Any]) -> None:
    host = builder_run["host"]
    assert host["steps"] == 8  # the builder's first step and the seven of the table above
    assert 0 < host["median_s"] <= host["build_s"]


def test_plans_check_the_bound_kv_caches_block_count(builder_run: dict[str, Any]) -> None:
    # a replayed graph never reaches run(), so plan() is where a block past the cache is caught
    assert builder_run["blocks before binding"] is None  # planned without num_blocks
    err = builder_run["past the cache"]
    assert f"past the KV cache's {NUM_BLOCKS} blocks" in err, err


def drive(root: Path) -> dict[str, Any]:
    """Build real vLLM attention layers on the bridge and its metadata builder, and plan the
    steps of the tests above. Runs in the subprocess, on the fixture backend."""
    from plugin_api_vllm import report
    from plugin_api_vllm.attention import (
        PluginApiAttentionBackend,
        PluginApiMetadataBuilder,
        graph_plans,
        host_time,
    )
    from plugin_api_vllm.tiny_model import Shape, build
    from vllm.config import (
        CacheConfig,
        CUDAGraphMode,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.model_executor.layers.attention import Attention

    from plugin_api.ops.attention import kv_cache_shape

    shape = Shape(layers=1, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=512)
    model = build("llama", root / "llama", shape)
    cfg = VllmConfig(
        model_config=ModelConfig(model=str(model), dtype="float32"),
        cache_config=CacheConfig(block_size=BLOCK),
    )
    names = ["layers.0.attn", "layers.1.attn"]
    with set_current_vllm_config(cfg):
        layers = [
            Attention(
                4, 16, 0.25, 2, cache_config=cfg.cache_config, prefix=name,
                attn_backend=PluginApiAttentionBackend,
            )
            for name in names
        ]  # fmt: skip
    kv_spec = layers[0].get_kv_cache_spec(cfg)
    attn = layers[0].impl.attention
    out: dict[str, Any] = {
        "impl": attn.provenance.impl,
        "graph_level": attn.graph_support().level.name,
    }

    def builder(mode: CUDAGraphMode) -> PluginApiMetadataBuilder:
        # set after construction: the CPU platform resolved vLLM's config to no CUDA graphs
        cfg.compilation_config.cudagraph_mode = mode
        cfg.compilation_config.max_cudagraph_capture_size = 8
        return PluginApiMetadataBuilder(kv_spec, names, cfg, torch.device("cpu"))

    alive: list[Any] = []  # every step's plans stay alive: no buffer address is recycled

    def observe(b: PluginApiMetadataBuilder, metadata: Any) -> dict[str, Any]:
        alive.append(metadata)
        (plan,) = metadata.plans.values()
        bufs = plan.impl_plan.buffers()
        return {
            "buffers": {k: v.data_ptr() for k, v in bufs.items()},
            "seq_lens": bufs["seq_lens"].tolist(),
            "kept": len(b.graph_plans),
        }

    full = builder(CUDAGraphMode.FULL_AND_PIECEWISE)
    out["cudagraph_support"] = full.get_cudagraph_support(cfg, kv_spec).name
    # vLLM's layers hold empty placeholders until it binds their caches: no block count yet
    full.build(0, vllm_step([5], [5]))
    out["blocks before binding"] = full.num_blocks
    for layer in layers:  # what vLLM binds once it has allocated the caches
        layer.kv_cache = torch.zeros(kv_cache_shape(layer.impl.spec, NUM_BLOCKS))
    steps = {
        "capture": vllm_step([1] * 4, [1] * 4),
        "padded replay": vllm_step([1, 1, 1], [40, 17, 5], pad_to=(4, 4)),
        "replay": vllm_step([1] * 4, [70, 2, 33, 9]),
        "other shape": vllm_step([1, 1], [5, 6]),
        "other shape again": vllm_step([1], [9], pad_to=(2, 2)),
        "mixed": vllm_step([1, 1, 5], [40, 17, 5]),
        "past the largest graph": vllm_step([1] * 9, [20] * 9),
    }
    out["full"] = {}
    for name, m in steps.items():
        # vLLM captures through build_for_cudagraph_capture, replays through build
        metadata = full.build_for_cudagraph_capture(m) if name == "capture" else full.build(0, m)
        out["full"][name] = observe(full, metadata)
    out["report"] = graph_plans()
    out["host"] = host_time()
    out["summary"] = report.summary(
        {
            "backend": FIXTURE, "distribution": "fixture 1.0", "status": "validated",
            "layers": {}, "engine_layers": [], "outside": [], "fallbacks": [],
            "graph_plans": out["report"],
        }
    )  # fmt: skip
    try:
        full.build(0, vllm_step([1], [20], first_block=NUM_BLOCKS - 1))
        out["past the cache"] = "planned"
    except ValueError as e:
        out["past the cache"] = str(e)
    piecewise = builder(CUDAGraphMode.PIECEWISE)
    out["piecewise"] = {
        name: observe(piecewise, piecewise.build(0, steps[name])) for name in ("capture", "replay")
    }
    return out


if __name__ == "__main__":
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.write_text(json.dumps(drive(root)))

"""The end-to-end bench, run for real on a tiny model: both sides interleaved, the bridge native."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.needs_vllm


def test_bench_interleaves_the_sides_and_reports_the_bridge(
    tiny_models: dict[str, Path], env: Any, run: Any, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    args = ["plugin_api_vllm.bench", "--model", str(tiny_models["llama"]), "--quick"]
    args += ["--reps", "2", "--decode", "2", "--dtypes", "float32", "--json", str(out)]
    extra = {
        "PLUGIN_API_BACKEND": "cpu-arm-acl",
        "PLUGIN_API_STRICT": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in the side's process: faster start
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
    }
    r = run(args, env(**extra))
    assert r.returncode == 0, r.stderr[-6000:]
    own, ours = "vllm float32", "plugin-api cpu-arm-acl float32"
    # Each repetition runs both sides, the first alternating (A B, B A) per batch.
    order = [
        line.split(" batch ")[0].strip() for line in r.stderr.splitlines() if " batch " in line
    ]
    assert order == [own, ours, ours, own] * 2
    data = json.loads(out.read_text())
    sides = {s["label"]: s for s in data["sides"]}
    assert set(sides) == {own, ours}
    for side in sides.values():
        for batch in ("1", "8"):
            m = side["batches"][batch]
            assert len(m["prefill_s_runs"]) == 2 and m["prefill_tok_s"] > 0
            assert m["decode_tok_s"] > 0 and len(m["decode_step_s_runs"]) == 2
    for batch in ("1", "8"):  # the bridge's per-repetition speed-ups over vLLM's own side
        own_runs, m = sides[own]["batches"][batch], sides[ours]["batches"][batch]
        pairs = zip(own_runs["prefill_s_runs"], m["prefill_s_runs"], strict=True)
        speedup = [a / b for a, b in pairs]
        assert m["paired"]["prefill"] == speedup and len(m["paired"]["decode"]) == 2
        assert "paired" not in own_runs
    report = sides[ours]["report"]
    assert report["backend"] == "cpu-arm-acl" and report["fallbacks"] == []
    served = sides[ours]["served"]
    kinds = {line.split(":")[0] for line in served}
    assert kinds == {"attention", "linear", "lm_head"}, served
    assert all(line.endswith("[native]") for line in served), served
    assert "report" not in sides[own]
    row = next(line for line in r.stdout.splitlines() if line.startswith(f"| {ours} | 8 |"))
    assert row.count("x [") == 2, row  # the paired column: median [lowest-highest], twice

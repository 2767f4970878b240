"""The end-to-end bench, run for real on a tiny model: both sides interleaved, the bridge native."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from plugin_api_vllm.bench import cpu_set, minimum_work, model_cores, weight_counts


@pytest.mark.needs_vllm
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
    # both sides' model processes had the same cores; the bounds quoted are measured on them
    cores = sides[own]["model_cores"]
    assert sides[ours]["model_cores"] == cores != ""
    ceil = data["ceilings"]
    assert ceil["model_threads"] == len(cpu_set(cores)) and ceil["model_copy_GBps"] > 0
    assert ceil["model_matmul_TFLOPs"] > 0 and ceil["threads"] >= 1
    assert data["bounds"] == minimum_work(weight_counts(str(tiny_models["llama"])))
    bound = f"ceilings on the cores both sides' model processes had ({cores}, "
    line = next((line for line in r.stdout.splitlines() if line.startswith(bound)), r.stdout)
    # the decode bound of the run's dtype: fp32 weights are twice the bf16 bytes counted
    fp32 = ceil["model_copy_GBps"] * 1e9 / (2 * data["bounds"]["decode_bytes_per_step"])
    assert f"-> decode at most fp32 {fp32:.1f} steps/s;" in line, line
    row = next(line for line in r.stdout.splitlines() if line.startswith(f"| {ours} | 8 |"))
    assert row.count("x [") == 2, row  # the paired column: median [lowest-highest], twice


def _cpu_list(cores: set[int]) -> str:
    """``cores`` as Linux writes a CPU list: runs of consecutive cores as ranges ("0-1,4")."""
    runs: list[list[int]] = []
    for c in sorted(cores):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_model_cores_finds_the_worker_below_the_side_process(tmp_path: Path) -> None:
    """A real process tree: the side's process, a child, and a grandchild that names itself as
    vLLM names its worker and binds itself to one core. The cores reported are the grandchild's;
    with no process of that name below it, the side's own."""
    core = min(os.sched_getaffinity(0))
    ready = tmp_path / "ready"
    worker = f"""
        import os, pathlib, time
        os.sched_setaffinity(0, {{{core}}})
        pathlib.Path("/proc/self/comm").write_text("VLLM::Worker")
        pathlib.Path({str(ready)!r}).write_text("ok")
        time.sleep(120)
    """
    code = textwrap.dedent(worker)
    middle = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {code!r}])"
    side = subprocess.Popen([sys.executable, "-c", middle], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline and side.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), "the worker process did not start"
        assert model_cores(side.pid) == str(core)
        own = os.sched_getaffinity(side.pid)
        assert model_cores(side.pid, worker="no-such-name") == _cpu_list(own)
        assert cpu_set(_cpu_list(own)) == own and cpu_set("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    finally:
        os.killpg(side.pid, signal.SIGKILL)
        side.wait()


@pytest.mark.parametrize("tied", [False, True])
def test_the_bounds_count_what_each_phase_must_do(tmp_path: Path, tied: bool) -> None:
    """Decode reads every weight but the embedding (unless it is also the head); a prompt token
    multiplies every weight but the embedding and the head. Checked on a checkpoint written here."""
    import torch
    from safetensors.torch import save_file

    tensors = {
        "model.embed_tokens.weight": torch.zeros(100, 8),
        "model.layers.0.mlp.up_proj.weight": torch.zeros(16, 8),
        "model.norm.weight": torch.zeros(8),
    }
    if not tied:
        tensors["lm_head.weight"] = torch.zeros(100, 8)
    half = dict(list(tensors.items())[:2])  # two shards, as large checkpoints come
    save_file(half, str(tmp_path / "model-00001-of-00002.safetensors"))
    rest = {k: v for k, v in tensors.items() if k not in half}
    save_file(rest, str(tmp_path / "model-00002-of-00002.safetensors"))
    counts = weight_counts(str(tmp_path))
    head = 0 if tied else 800
    assert counts == {"total": 800 + 128 + 8 + head, "embedding": 800, "lm_head": head}
    bounds = minimum_work(counts)
    read = 128 + 8 + 800  # the head: the lm_head's own weight, or the embedding when tied
    assert bounds == {"decode_bytes_per_step": 2 * read, "prefill_flop_per_token": 2 * 136}

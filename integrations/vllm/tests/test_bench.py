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
from plugin_api_vllm.bench import model_cores


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
    # both sides' model processes were allowed the same cores, and the table says which
    assert sides[own]["model_cores"] == sides[ours]["model_cores"] != ""
    cores = f"{own}: {sides[own]['model_cores']}; {ours}: {sides[ours]['model_cores']}"
    assert f"cores each side's model process may use: {cores}" in r.stdout
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
        own = _cpu_list(os.sched_getaffinity(side.pid))
        assert model_cores(side.pid, worker="no-such-name") == own
    finally:
        os.killpg(side.pid, signal.SIGKILL)
        side.wait()

"""A layer the backend cannot serve stops vLLM with plugin-api's reason (strict), or runs on a
fallback that the bridge's report and log name (default); never on vLLM's kernels in silence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from plugin_api_vllm.tiny_model import Shape, build

pytestmark = pytest.mark.needs_vllm


@pytest.fixture(scope="module")
def head_40(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_size 40: cpu-arm-acl's attention kernels take multiples of 16
    return build("llama", tmp_path_factory.mktemp("h40") / "m", Shape(hidden=320, heads=8))


def test_refused_spec_stops_vllm_under_strict(
    head_40: Path, tmp_path: Path, env: Any, run: Any
) -> None:
    out = tmp_path / "out.json"
    strict = env(PLUGIN_API_BACKEND="cpu-arm-acl", PLUGIN_API_STRICT="1")
    r = run(["plugin_api_vllm.generate", "--model", str(head_40), "--json", str(out)], strict)
    assert r.returncode != 0 and not out.exists()
    log = r.stdout + r.stderr
    assert "FallbackRefused" in log and "head_size=40" in log, log[-4000:]


def test_fallback_is_named_in_the_report_and_warned(
    head_40: Path, tmp_path: Path, env: Any, run: Any
) -> None:
    out = tmp_path / "out.json"
    lenient = env(PLUGIN_API_BACKEND="cpu-arm-acl", PLUGIN_API_STRICT="0")
    args = ["--model", str(head_40), "--max-tokens", "4", "--json", str(out)]
    r = run(["plugin_api_vllm.generate", *args], lenient)
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(out.read_text())[0]["report"]
    attn = [n for n, e in report["layers"].items() if e["kind"] == "attention"]
    assert attn and sorted(report["fallbacks"]) == sorted(attn)
    assert all(report["layers"][n]["impl"] == "reference" for n in attn)
    assert "falling back to reference" in r.stdout + r.stderr

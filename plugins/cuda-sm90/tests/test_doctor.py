"""``plugin-api doctor --json --device-info h200``: the plugin validated, its op table, and the
CUDA-graph level with its reason for the default specs."""

from __future__ import annotations

import json

import pytest

from plugin_api.cli import main


def test_doctor_on_an_h200(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    for name in ("PLUGIN_API_BACKEND", "PLUGIN_API_PLUGINS", "PLUGIN_API_STRICT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["doctor", "--json", "--device-info", "h200"]) == 0
    data = json.loads(capsys.readouterr().out)
    (rec,) = [p for p in data["plugins"] if p["id"] == "cuda-sm90"]
    assert rec["state"] == "validated" and rec["families"] == ["attention", "gemm"]
    assert data["selection"]["backend"] == "cuda-sm90"
    models = {m["model"]: m for m in data["ops"]}
    llama = models["llama-3-8b"]
    attn = next(layer for layer in llama["layers"] if layer["name"] == "attention")
    assert attn["chosen"] == {
        "impl": "flashinfer",
        "path": "native",
        "backend": "cuda-sm90",
        "fallback": False,
    }
    assert attn["graph"]["level"] == "UNIFORM_BATCH" and "XQA" in attn["graph"]["reason"]
    lm = next(layer for layer in llama["layers"] if layer["name"] == "lm_head")
    assert lm["chosen"]["impl"] == "torch-cublas"
    assert llama["graph"]["level"] == "UNIFORM_BATCH"
    gpt = next(m for name, m in models.items() if name.startswith("gpt-oss"))
    assert gpt["graph"]["level"] == "UNIFORM_BATCH"
    assert not any("speculative decode" in d for d in gpt["graph"]["downgrades"])
    gemma = next(m for name, m in models.items() if name.startswith("gemma"))
    shared = next(layer for layer in gemma["layers"] if layer["name"] == "kv-shared attention")
    assert shared["chosen"]["impl"] == "flashinfer"

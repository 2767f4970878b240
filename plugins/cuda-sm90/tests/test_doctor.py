"""``plugin-api doctor --json --device-info h200``: the plugin validated, its op table (quant and
state on the host's Triton kernels, no reference fallback), and the CUDA-graph level with its
reason for the default specs."""

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
    assert rec["state"] == "validated"
    assert rec["families"] == ["attention", "gemm", "quant", "state"]
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
    # quant and state through the host's Triton kernels: no reference fallback left
    triton = {"impl": "triton", "path": "triton", "backend": "cuda-sm90", "fallback": False}
    others = [layer for m in data["ops"] for layer in m["layers"]]
    served = {
        layer["name"]: layer["chosen"] for layer in others if layer["family"] in ("quant", "state")
    }
    assert set(served) == {"activation quant (w8a8)", "activation group quant", "ssm state"}
    assert all(chosen == triton for chosen in served.values()), served

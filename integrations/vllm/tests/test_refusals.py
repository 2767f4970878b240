"""A layer the backend cannot serve stops vLLM with plugin-api's reason (strict), or runs on a
fallback that the bridge's report and log name (default); never on vLLM's kernels in silence."""

from __future__ import annotations

import json
import subprocess
import sys
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


# vLLM's embedding runner on an encoder-only model; prints the embeddings' widths
EMBED = """
import sys
from vllm import LLM
llm = LLM(model=sys.argv[1], runner="pooling", dtype="float32", enforce_eager=True,
          max_model_len=512)
print("widths", [len(o.outputs.embedding) for o in llm.embed(["Hello", "The capital"])])
"""


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT encoder (bidirectional attention: vLLM's ENCODER_ONLY layers)."""
    import torch
    import transformers
    from plugin_api_vllm.tiny_model import byte_level_tokenizer

    out = tmp_path_factory.mktemp("bert") / "m"
    config = transformers.BertConfig(
        vocab_size=1024,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(out)
    special = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>"}
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=byte_level_tokenizer(1024), pad_token="</s>", **special
    ).save_pretrained(out)
    return out


def test_encoder_only_attention_stops_vllm_with_the_reason(bert: Path, env: Any) -> None:
    """plugin-api's attention is causal decoder attention: an encoder's layers stop vLLM at
    start-up, also without PLUGIN_API_STRICT (no backend serves them, so there is no fallback),
    where vLLM's own kernels run the same model."""

    def embed(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", EMBED, str(bert)],
            env=env(VLLM_ENABLE_V1_MULTIPROCESSING="0", **extra),
            capture_output=True,
            text=True,
            timeout=600,
        )

    own = embed()
    assert own.returncode == 0 and "widths [128, 128]" in own.stdout, own.stderr[-4000:]
    ours = embed(PLUGIN_API_BACKEND="cpu-arm-acl")
    log = ours.stdout + ours.stderr
    assert ours.returncode != 0 and "widths" not in ours.stdout
    assert "BridgeRefused" in log and "encoder_only" in log, log[-4000:]
    assert "Unset PLUGIN_API_BACKEND" in log
